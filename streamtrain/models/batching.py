"""Packing variable-length samples into one tensor, so compute follows the batch's total size.

A packed batch concatenates every sequence along the time axis into `values` of shape
(total_size, F) with no padding at all; `segment_ids` names the sample each row belongs to and
`cu_seqlens` holds the cumulative boundaries (FlashAttention's varlen convention). A batch of one
long and many short samples therefore costs its total size, not count x longest.

Targets ride beside the frames: `labels` (an integer class per sample, -1 where a sample has none) and
`targets` (N, W) floats, which hold a sample's float target (regression values, multi-label tags) or, for
`forecast`, the last `horizon` frames of each series, held back from `values` as its future.

The payload rule, whatever the collate function: a sample's declared dtype must be one of
`trainer.accepted_dtypes` (else it is dead-lettered as `dtype-not-accepted`), and its values are converted
to the model's dtype (`trainer.precision`), where they must stay finite (a float64 of 1e300 is infinite in
float32: dead-lettered as `dtype-overflow`); `payload_problem` applies it as samples arrive. The default
packing then bounds each sample's magnitude (`trainer.max_input_abs`): samples of any dtype and scale reach
the model within the same range, so none can drive its activations to infinity. The factor each sample was
scaled by rides along (`bound_factors`), so that an objective whose answers are made of the inputs' own
values (`forecast`) can give them back in the series' own units.
"""

from __future__ import annotations

import functools
import logging
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from streamtrain.config.trainer import TrainerConfig
from streamtrain.wire import Sample

from .standardise import input_scaling

__all__ = ["DTYPE_NOT_ACCEPTED", "DTYPE_OVERFLOW", "Batch", "PackedBatch", "bucketed_length", "collate_for_prediction",
           "collate_packed", "model_dtype", "pack_samples", "payload_draws", "payload_problem", "sample_problems",
           "takes_draws"]

logger = logging.getLogger(__name__)

#: Dead-letter reasons of the payload rule.
DTYPE_NOT_ACCEPTED = "dtype-not-accepted"
DTYPE_OVERFLOW = "dtype-overflow"


def bucketed_length(length: int, per_octave: int = 8) -> int:
    """`length` rounded up to one of `per_octave` evenly spaced lengths in its power of two (at most 1/per_octave
    more; `per_octave` is a power of two, or 0 to leave `length` as it is).

    For a model whose tensors are as long as the batch: a stream of batches of ever new total sizes is a stream
    of ever new shapes, and a kernel library that builds a kernel per shape (oneDNN's convolutions on a CPU;
    cuDNN's autotuner) pays that for every step. Padded to these lengths, the shapes repeat within a few dozen
    steps while the padding stays a small, bounded share of the compute, so the step cost follows the size.
    """
    if length < 0 or per_octave < 0 or per_octave & (per_octave - 1):
        raise ValueError(f"length must be >= 0 and per_octave 0 or a power of two, got {length} and {per_octave}")
    if per_octave == 0 or length <= per_octave:
        return length
    step = 1 << (length.bit_length() - per_octave.bit_length())
    return -(-length // step) * step


def model_dtype(config: TrainerConfig) -> torch.dtype:
    """The dtype of the model's parameters and inputs (`trainer.precision`)."""
    return torch.float64 if config.precision == "float64" else torch.float32


class Batch(Protocol):
    """What the step runner needs from any collated batch (the default or a plugged-in one)."""

    @property
    def labels(self) -> torch.Tensor: ...

    @property
    def num_samples(self) -> int: ...

    @property
    def total_size(self) -> int: ...

    def to(self, device: torch.device) -> Batch: ...


@dataclass(frozen=True)
class PackedBatch:
    """Variable-length sequences concatenated along time, with their boundaries.

    Attributes:
        values: (total_size, F) frames of every sample, back to back.
        segment_ids: (total_size,) int64 index of the sample each frame belongs to.
        cu_seqlens: (num_samples + 1,) int64 cumulative lengths; sample i is rows cu[i]:cu[i+1].
        lengths: (num_samples,) int64 frames per sample (in `values`).
        labels: (num_samples,) int64 class of each sample (-1: it has none).
        targets: (num_samples, W) float target of each sample in the dtype of `values` (W = 0: none); for
            `forecast`, the `horizon` frames held back from the end of each series, flattened time-major.
        horizon: Frames per sample held back in `targets` rather than `values` (`forecast`; else 0).
        bound_factors: (num_samples,) the factor each sample's `values` (and a forecast's `targets`) were
            multiplied by to stay within `trainer.max_input_abs`, in their dtype: 1 where they were not scaled.
            None: no sample was (a batch built by hand); dividing by it gives back the sample's own units.
        draws: (num_samples,) float32 in [0, 1) drawn from each sample's payload bytes (`payload_draws`), the same
            wherever and whenever the sample is packed: a model that holds samples out to score itself on takes
            those below its share (`seqflat`). None: not drawn (prediction, a collate of your own).
    """

    values: torch.Tensor
    segment_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    lengths: torch.Tensor
    labels: torch.Tensor
    targets: torch.Tensor | None = None
    horizon: int = 0
    bound_factors: torch.Tensor | None = None
    draws: torch.Tensor | None = None

    @property
    def num_samples(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def total_size(self) -> int:
        """The samples' sizes as the wire declares them (what the coordinator plans with): held-back frames too."""
        return int(self.values.shape[0]) + self.horizon * self.num_samples

    @property
    def num_features(self) -> int:
        return int(self.values.shape[1])

    def to(self, device: torch.device) -> PackedBatch:
        """This batch on `device` (copies are non-blocking where the source is pinned)."""
        return PackedBatch(
            values=self.values.to(device, non_blocking=True),
            segment_ids=self.segment_ids.to(device, non_blocking=True),
            cu_seqlens=self.cu_seqlens.to(device, non_blocking=True),
            lengths=self.lengths.to(device, non_blocking=True),
            labels=self.labels.to(device, non_blocking=True),
            targets=None if self.targets is None else self.targets.to(device, non_blocking=True),
            horizon=self.horizon,
            bound_factors=None if self.bound_factors is None else self.bound_factors.to(device, non_blocking=True),
            draws=None if self.draws is None else self.draws.to(device, non_blocking=True),
        )


def sample_problems(sample: Sample, num_features: int, *, wire_checked: bool = False) -> list[str]:
    """Why the default packing cannot train `sample` (empty when it can), for dead-lettering upstream.

    Args:
        sample: A decoded record.
        num_features: The configured features per frame.
        wire_checked: `Sample.problems` already passed (`decode` validates by default): skip it,
            which halves the validation cost on the trainer's input path.

    Returns:
        Human-readable reasons; the wire-level checks of `Sample.problems` come first.
    """
    found = [] if wire_checked else sample.problems()
    if found:
        return found
    if len(sample.shape) != 2 or sample.shape[1] != num_features:
        found.append(f"shape {list(sample.shape)} is not (size, {num_features})")
    if sample.label is not None and sample.label < 0:
        found.append(f"label {sample.label} is negative")
    return found


@functools.cache
def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch dtype (once per dtype: building a tensor to ask costs microseconds a sample)."""
    return torch.empty((), dtype=dtype).numpy().dtype


@functools.cache
def _may_overflow(source: str, target: np.dtype) -> bool:
    """Whether values of the wire dtype `source` can be too large for `target`: a float wider than it."""
    kind = np.dtype(source)
    return kind.kind == "f" and bool(np.finfo(kind).max > np.finfo(target).max)


def payload_problem(sample: Sample, config: TrainerConfig) -> tuple[str, str] | None:
    """Why the payload rule refuses `sample`, as (dead-letter reason, detail), or None when it may be trained.

    Only a float payload wider than the model's dtype can overflow in the conversion (every integer dtype of
    the wire fits float32), so only those are converted here to be checked.
    """
    if sample.dtype not in config.accepted_dtypes:
        return DTYPE_NOT_ACCEPTED, (f"dtype {sample.dtype} is not in trainer.accepted_dtypes "
                                    f"({', '.join(config.accepted_dtypes)})")
    target = _numpy_dtype(model_dtype(config))
    if _may_overflow(sample.dtype, target):
        values = sample.array()
        with np.errstate(over="ignore"):
            fits = bool(np.isfinite(values.astype(target)).all())
        if not fits:
            largest = float(np.abs(values).max())
            return DTYPE_OVERFLOW, (f"{sample.dtype} values up to {largest:.3g} are infinite as {target} "
                                    "(trainer.precision)")
    return None


def _payloads(samples: Sequence[Sample], dtype: np.dtype, width: int) -> np.ndarray:
    """The payloads of `samples` one after another, as a fresh, writable (frames, width) array of `dtype`.

    Samples of one wire dtype are joined as bytes and read in one pass, a few calls whatever their number (every
    step collates); mixed dtypes, or bytes that do not fit the shapes (which `Sample.array` then refuses), are read
    sample by sample. The shapes are the caller's to have checked.
    """
    if not samples:
        return np.empty((0, width), dtype)
    wire = samples[0].dtype
    if all(sample.dtype == wire for sample in samples):
        read_as = samples[0].array().dtype  # the wire dtype in its byte order, as `Sample.array` reads it
        joined = np.frombuffer(b"".join([sample.data for sample in samples]), dtype=read_as)
        if joined.size == sum(math.prod(sample.shape) for sample in samples):
            return joined.astype(dtype).reshape(-1, width)
    return np.concatenate([sample.array() for sample in samples], axis=0, dtype=dtype)


def _bound_magnitude(values: np.ndarray, cu: np.ndarray, lengths: np.ndarray, max_abs: float) -> np.ndarray:
    """Scale, in place, every sample (rows cu[i]:cu[i+1]) whose largest |value| exceeds `max_abs` down to it;
    returns the factor of each sample (1 where it was not scaled)."""
    factors = np.ones(len(lengths), dtype=values.dtype)
    if values.size == 0 or max_abs <= 0:
        return factors
    row_max = np.maximum(values.max(axis=1), -values.min(axis=1))  # no |values| temporary the batch's size
    sample_max = np.zeros(len(lengths), dtype=values.dtype)
    filled = lengths > 0  # reduceat cannot take an empty segment
    sample_max[filled] = np.maximum.reduceat(row_max, cu[:-1][filled])
    over = sample_max > max_abs
    if over.any():
        factors = np.where(over, max_abs / np.where(over, sample_max, 1.0), 1.0).astype(values.dtype)
        values *= np.repeat(factors, lengths)[:, None]
    return factors


def _packed_labels(samples: Sequence[Sample], num_classes: int | None, require: bool) -> np.ndarray:
    labels = np.full(len(samples), -1, dtype=np.int64)
    if not require and all(sample.label is None for sample in samples):  # unlabelled (a regression): as they are
        return labels
    for i, sample in enumerate(samples):
        label = sample.label
        if not require and (label is None or num_classes is None):
            labels[i] = -1 if label is None else label
            continue
        if label is None or label < 0 or (num_classes is not None and label >= num_classes):
            raise ValueError(f"sample seq={sample.seq}: label {label} is not a class in [0, {num_classes})")
        labels[i] = label
    return labels


def _packed_targets(samples: Sequence[Sample], width: int, np_dtype: np.dtype) -> np.ndarray:
    targets = np.zeros((len(samples), width), dtype=np_dtype)
    if width == 0:
        return targets
    rows = [sample.target for sample in samples]
    if all(row is not None and len(row) == width for row in rows):  # one conversion for the batch
        return np.array(rows, dtype=np_dtype).reshape(len(samples), width)
    for i, sample in enumerate(samples):
        if sample.target is None or len(sample.target) != width:
            got = "none" if sample.target is None else f"{len(sample.target)} values"
            raise ValueError(f"sample seq={sample.seq}: target has {got}, not {width} values")
        targets[i] = sample.target
    return targets


def pack_samples(
    samples: Sequence[Sample],
    num_features: int,
    dtype: torch.dtype = torch.float32,
    num_classes: int | None = None,
    max_abs: float = 0.0,
    *,
    require_labels: bool = True,
    target_width: int = 0,
    horizon: int = 0,
    scaling: tuple[np.ndarray, np.ndarray] | None = None,
    draws: bool = False,
) -> PackedBatch:
    """Concatenate samples into one packed batch (an empty list gives an empty, well-shaped batch).

    Args:
        samples: Samples whose payload has shape (size, num_features).
        num_features: Features per frame.
        dtype: Dtype of `values` and `targets`.
        num_classes: When given, labels must lie in [0, num_classes).
        max_abs: When > 0, a sample whose largest |value| exceeds it is scaled down to reach it.
        require_labels: Every sample needs an integer label; otherwise a missing one packs as -1.
        target_width: Floats of every sample's `target` packed into `targets` (0: none).
        horizon: Frames held back from the end of every series into `targets` (`forecast`; after the
            magnitude bound, so input and future share one scale, whose factor is in `bound_factors`); every
            sample needs more than `horizon` frames.
        scaling: Per-feature (shift, scale): every frame becomes (frame - shift) / scale before the bound
            (`streamtrain.models.standardise`).
        draws: Draw each sample's number in `draws` (`payload_draws`).

    Returns:
        The packed batch on the CPU.

    Raises:
        ValueError: A sample has the wrong shape, a missing / out-of-range label, a target of another width,
            or no more than `horizon` frames.
    """
    lengths = np.fromiter((s.size for s in samples), dtype=np.int64, count=len(samples))
    labels = _packed_labels(samples, num_classes, require_labels)
    for sample in samples:
        if len(sample.shape) != 2 or sample.shape[1] != num_features:
            raise ValueError(f"sample seq={sample.seq}: shape {list(sample.shape)} is not (size, {num_features})")
        if sample.size < 1:
            raise ValueError(f"sample seq={sample.seq}: no frames (size {sample.size}): a sample needs at least one")
        if horizon and sample.size <= horizon:
            raise ValueError(f"sample seq={sample.seq}: {sample.size} frames leave none to forecast trainer.horizon="
                             f"{horizon} from")
    np_dtype = _numpy_dtype(dtype)
    values = _payloads(samples, np_dtype, num_features)  # a fresh buffer the steps below work in, in place
    cu = np.zeros(len(samples) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    if scaling is not None and values.size:
        values -= scaling[0].astype(np_dtype)
        values /= scaling[1].astype(np_dtype)
    factors = _bound_magnitude(values, cu, lengths, max_abs)
    if horizon:
        values, lengths, cu, targets = _hold_back(values, lengths, cu, horizon)
    else:
        targets = _packed_targets(samples, target_width, np_dtype)
    segment_ids = np.repeat(np.arange(len(samples), dtype=np.int64), lengths)
    return PackedBatch(
        values=torch.from_numpy(values),
        segment_ids=torch.from_numpy(segment_ids),
        cu_seqlens=torch.from_numpy(cu),
        lengths=torch.from_numpy(lengths),
        labels=torch.from_numpy(labels),
        targets=torch.from_numpy(targets),
        horizon=horizon,
        bound_factors=torch.from_numpy(factors),
        draws=torch.from_numpy(payload_draws(samples)) if draws else None,
    )


def payload_draws(samples: Sequence[Sample]) -> np.ndarray:
    """A number in [0, 1) for each of `samples`: its payload's CRC-32 over 2^32. A sample's own bytes decide, so a
    sample replayed epoch after epoch (a dataset `up` streams again and again), on any rank, draws the same number:
    a model that holds out the samples below a share scores on samples it never trained on."""
    crcs = np.fromiter((zlib.crc32(sample.data) for sample in samples), dtype=np.uint64, count=len(samples))
    return (crcs / 2.0**32).astype(np.float32)


def _hold_back(values: np.ndarray, lengths: np.ndarray, cu: np.ndarray,
               horizon: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Split every series (rows cu[i]:cu[i+1] of `values`) into its input and its last `horizon` frames: the
    inputs packed anew, the futures as (N, horizon * F) targets."""
    future = np.zeros(len(values), dtype=bool)
    for h in range(1, horizon + 1):
        future[cu[1:] - h] = True
    targets = values[future].reshape(len(lengths), horizon * values.shape[1])
    inputs = lengths - horizon
    cu_in = np.zeros_like(cu)
    np.cumsum(inputs, out=cu_in[1:])
    return np.ascontiguousarray(values[~future]), inputs, cu_in, targets


def _packing(config: TrainerConfig, samples: Sequence[Sample]) -> tuple[bool, int, int]:
    """What the configured objective needs packed beside the frames: (labels required, target width, horizon)."""
    objective = config.objective
    if objective == "classification":
        return True, 0, 0
    if objective == "regression":
        return False, config.target_width, 0
    if objective == "multilabel":
        return False, config.num_tags, 0
    if objective == "forecast":
        return False, 0, config.horizon
    # An objective of the user's: the targets the samples carry (`trainer.target_width` of them), labels as they are.
    carried = bool(samples) and all(s.target is not None for s in samples)
    return False, config.target_width if carried else 0, 0


#: The built-in objectives with a least-squares target (`Objective.fitting_target`): `mlp` chooses between its MLP
#: and a ridge line for them.
LINE_OBJECTIVES = ("regression", "forecast")


def takes_draws(config: TrainerConfig) -> bool:
    """Whether the configured model holds samples out by their draws (`payload_draws`) to choose its head on them
    (`streamtrain.models.choosing`), with `trainer.dropout` unset: `seqflat`, and `mlp` for a built-in objective
    with a least-squares target (`LINE_OBJECTIVES`)."""
    if config.dropout is not None:
        return False
    return config.model == "seqflat" or (config.model == "mlp" and config.objective in LINE_OBJECTIVES)


def collate_packed(samples: Sequence[Sample], config: TrainerConfig) -> PackedBatch:
    """The default collate function: `pack_samples` with the configured features, classes, dtype and bound, the
    labels or targets `trainer.objective` trains on, and the draws a model that holds samples out reads."""
    require_labels, target_width, horizon = _packing(config, samples)
    classes = config.num_classes if require_labels else None  # a label the objective does not use is not checked
    return pack_samples(samples, config.num_features, dtype=model_dtype(config), num_classes=classes,
                        max_abs=config.max_input_abs, require_labels=require_labels, target_width=target_width,
                        horizon=horizon, scaling=input_scaling(config), draws=takes_draws(config))


def collate_for_prediction(samples: Sequence[Sample], config: TrainerConfig) -> PackedBatch:
    """Samples packed to be predicted on: as `collate_packed`, but no label or target is needed and a forecast's
    series is input as a whole (its future is what is asked for)."""
    return pack_samples(samples, config.num_features, dtype=model_dtype(config), max_abs=config.max_input_abs,
                        require_labels=False, scaling=input_scaling(config))
