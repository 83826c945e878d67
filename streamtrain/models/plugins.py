"""The model and collate function a rank trains with: a built-in one or user code named by dotted path.

User code is checked when a rank builds it, before any collective or Kafka client exists: `check_plugins`
collates a tiny probe batch (and an empty one), runs the model on it and checks what comes back, so a
plug-in that raises or returns the wrong shape fails at start-up with a message naming the setting,
not at the first step with data.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from streamtrain.config.trainer import BUILTIN_MODELS, TrainerConfig
from streamtrain.objectives import Objective, build_objective
from streamtrain.plugins import SetupError, resolve_dotted
from streamtrain.wire import Sample

from .batching import Batch, collate_packed, model_dtype, takes_draws
from .conv import PackedConvNet
from .sequence import SequenceClassifier
from .tabular import DROPOUT, TabularMLP, TabularWithLine
from .whole import WHOLE_DROPOUTS, WholeSeriesNet

__all__ = ["PROBE_DEVICE", "CollateFn", "build_collate", "build_model", "check_objective", "check_plugins",
           "probe_samples"]

logger = logging.getLogger(__name__)

CollateFn = Callable[[Sequence[Sample], TrainerConfig], Batch]

#: The `device_id` of the probe samples `check_plugins` collates at start-up: a collate with side effects
#: (a log of what it packed, say) can tell them from a device's samples by it.
PROBE_DEVICE = "streamtrain-probe"


def build_model(config: TrainerConfig, output_width: int | None = None) -> nn.Module:
    """The model of `config` (built-in by name, or a factory by dotted path), seeded by `config.seed`, in the
    configured precision, on the CPU.

    Args:
        config: Trainer settings.
        output_width: Outputs per sample of a built-in model (default: what `trainer.objective` needs; a
            factory of your own reads the settings itself).

    Raises:
        SetupError: `config.model` cannot be resolved or its factory returns no `nn.Module`, or
            `trainer.objective` cannot be built.
    """
    dtype = model_dtype(config)
    if output_width is None and config.model in BUILTIN_MODELS:

        output_width = build_objective(config).output_width()
    # Seeded without disturbing the caller's global RNG; DDP later broadcasts rank 0's parameters anyway.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        shape = (config.num_features, output_width or config.num_classes, config.hidden_size, config.num_layers,
                 config.kernel_size)
        last_state = config.objective == "forecast"  # a forecast follows from where each series ends
        if config.model == "conv":
            model: Any = PackedConvNet(*shape, last_state=last_state)
        elif config.model == "seq":
            model = SequenceClassifier(*shape, length_buckets=config.length_buckets, last_state=last_state)
        elif config.model == "seqflat":
            # Unset, the dropout is chosen: a head at each of WHOLE_DROPOUTS, scored on held-out samples.
            chosen = config.dropout is None
            model = WholeSeriesNet(*shape, points=config.series_points,
                                   dropout=WHOLE_DROPOUTS if config.dropout is None else config.dropout,
                                   length_buckets=config.length_buckets, last_state=last_state,
                                   objective=build_objective(config) if chosen else None)
        elif config.model == "mlp" and takes_draws(config):  # the MLP or a ridge line, chosen on held-out samples
            model = TabularWithLine(*shape[:4], dropout=DROPOUT, objective=build_objective(config))
        elif config.model == "mlp":
            model = TabularMLP(*shape[:4], dropout=_dropout(config, DROPOUT))
        else:
            model = resolve_dotted(config.model, "trainer.model")(config)
            if not isinstance(model, nn.Module):
                got = type(model).__name__
                raise SetupError(f"trainer.model: {config.model!r} returned {got}, not nn.Module")
            logger.info("using model %s from trainer.model", config.model)
    return model.to(dtype)


def _dropout(config: TrainerConfig, default: float) -> float:
    return default if config.dropout is None else config.dropout


def build_collate(config: TrainerConfig) -> CollateFn:
    """The collate function of `config`: `collate_packed` unless `config.collate` names another."""
    if config.collate is None:
        return collate_packed
    collate: CollateFn = resolve_dotted(config.collate, "trainer.collate")
    logger.info("using collate function %s from trainer.collate", config.collate)
    return collate


def probe_samples(config: TrainerConfig, sizes: Sequence[int] = (1, 3, 8),
                  objective: Objective | None = None) -> list[Sample]:
    """Samples as the wire would deliver them to this configuration: float32 (size, num_features), with the labels or
    targets `objective` (default: `trainer.objective`'s) trains on, each at least as long as it needs. What
    `check_plugins` feeds a plug-in."""
    if objective is None:

        objective = build_objective(config)
    rng = np.random.default_rng(0)
    shortest = objective.min_size()
    out = []
    for i, n in enumerate(sizes):
        label, target = objective.probe_target(i, rng)
        values = rng.standard_normal((n + shortest - 1, config.num_features)).astype(np.float32)
        out.append(Sample.from_array(PROBE_DEVICE, i, values, label=label, target=target))
    return out


def _name(value: str | None, default: str) -> str:
    return repr(value) if value is not None else default


def check_plugins(model: nn.Module, collate: CollateFn, config: TrainerConfig,
                  objective: Objective | None = None) -> None:
    """Collate a probe batch and an empty one, run `model` on each and check its outputs, then the objective's loss
    and metrics on them.

    Args:
        model: The built model (on the CPU).
        collate: The collate function.
        config: Trainer settings (features, and the plug-ins' names for messages).
        objective: The objective (default: the one `trainer.objective` names).

    Raises:
        SetupError: naming `trainer.collate` when collating fails or its batch lacks what a step needs,
            `trainer.model` when the forward pass raises or its outputs are not (num_samples, output width) and
            finite, `trainer.objective` when its loss or metrics raise or come back in the wrong shape.
    """
    if objective is None:

        objective = build_objective(config)
    names = _Names(_name(config.collate, "the default packing"), _name(config.model, "conv"),
                   repr(config.objective))
    was_training = model.training
    model.eval()
    try:
        for samples in (probe_samples(config, objective=objective), []):
            what = f"a probe batch of {len(samples)} samples of shape (size, {config.num_features})"
            batch = _collated(collate, samples, config, objective, names, what)
            outputs = _forward(model, batch, objective.output_width(), names, what)
            if samples:
                check_objective(objective, outputs, batch, names.objective, what)
    finally:
        model.train(was_training)
    logger.info("plug-in check passed: model %s, collate %s, objective %s", names.model, names.collate,
                names.objective)


@dataclass(frozen=True)
class _Names:
    """The plug-ins as the messages name them."""

    collate: str
    model: str
    objective: str


def _collated(collate: CollateFn, samples: Sequence[Sample], config: TrainerConfig, objective: Objective,
              names: _Names, what: str) -> Any:
    try:
        batch = collate(samples, config)
    except Exception as exc:  # a plug-in may raise anything: report it as this setting's failure
        raise SetupError(f"trainer.collate: {names.collate} raised {type(exc).__name__} on {what}: {exc}") from exc
    _check_batch(batch, samples, names, objective.batch_fields)
    return batch


def _forward(model: nn.Module, batch: Any, width: int, names: _Names, what: str) -> torch.Tensor:
    try:
        outputs = model(batch)  # with gradients: the objective's loss must reach the parameters
    except Exception as exc:
        raise SetupError(f"trainer.model: {names.model} raised {type(exc).__name__} on {what} (collated by "
                         f"{names.collate}): {exc}") from exc
    want = (batch.num_samples, width)
    if not isinstance(outputs, torch.Tensor) or tuple(outputs.shape) != want:
        got = tuple(outputs.shape) if isinstance(outputs, torch.Tensor) else type(outputs).__name__
        raise SetupError(f"trainer.model: {names.model} returned outputs of shape {got} for {what}; expected {want} "
                         f"(batch.num_samples, the output width trainer.objective {names.objective} needs)")
    if not outputs.is_floating_point() or not bool(torch.isfinite(outputs).all()):
        raise SetupError(f"trainer.model: {names.model} returned non-finite or non-float outputs for {what}")
    return outputs


def check_objective(objective: Objective, outputs: torch.Tensor, batch: Any, name: str, what: str) -> None:
    """Run the objective's loss, metric sums and summary on a probe batch's outputs and check what comes back.

    Raises:
        SetupError: naming `trainer.objective` with what is wrong.
    """
    n = batch.num_samples
    try:
        losses = objective.losses(outputs, batch)
        sums = {k: float(v) for k, v in objective.metric_sums(outputs.detach(), batch).items()}
        objective.summarise(sums)
    except Exception as exc:
        raise SetupError(f"trainer.objective: {name} raised {type(exc).__name__} on {what}: {exc}") from exc
    if not isinstance(losses, torch.Tensor) or tuple(losses.shape) != (n,):
        got = tuple(losses.shape) if isinstance(losses, torch.Tensor) else type(losses).__name__
        raise SetupError(f"trainer.objective: {name} returned losses of shape {got} for {what}; expected ({n},), "
                         "one per sample (the trainer takes their mean, so weighted aggregation stays exact)")
    if not bool(torch.isfinite(losses).all()):
        raise SetupError(f"trainer.objective: {name} returned non-finite losses for {what}")
    if outputs.requires_grad and not losses.requires_grad:
        raise SetupError(f"trainer.objective: {name} returned losses detached from the model's outputs: nothing "
                         "would train")
    bad = sorted(k for k, v in sums.items() if not math.isfinite(v))
    if sums.get("count") != n or bad:
        unfit = f" (not: {', '.join(bad)})" if bad else ""
        raise SetupError(f"trainer.objective: {name} returned metric sums {sorted(sums)} for {what}; they need "
                         f"'count' = {n} (the samples) and finite values{unfit}")
    negative = {k: v for k, v in sorted(sums.items()) if v < 0}
    if negative:
        shown = ", ".join(f"{k} = {v:.4g}" for k, v in negative.items())
        raise SetupError(f"trainer.objective: {name} returned negative metric sums for {what} ({shown}); every sum "
                         "must be 0 or more: they add up across steps and ranks as Prometheus counters (sum an "
                         "error's absolute value or square, and keep a signed figure as two sums)")


def _check_batch(batch: Any, samples: Sequence[Sample], names: _Names, fields: Sequence[str]) -> None:
    collate_name = names.collate
    missing = [a for a in (*fields, "num_samples", "total_size", "to") if not hasattr(batch, a)]
    if missing:
        read = f", and trainer.objective {names.objective} reads {', '.join(fields)}" if fields else ""
        raise SetupError(f"trainer.collate: {collate_name} returned {type(batch).__name__}, which lacks "
                         f"{', '.join(missing)} (a batch needs num_samples, total_size and to(device){read})")
    n, total = len(samples), sum(s.size for s in samples)
    labels = getattr(batch, "labels", None)
    if labels is not None and (not isinstance(labels, torch.Tensor) or tuple(labels.shape) != (n,)
                               or labels.dtype != torch.int64):
        got = f"{tuple(labels.shape)} {labels.dtype}" if isinstance(labels, torch.Tensor) else type(labels).__name__
        raise SetupError(f"trainer.collate: {collate_name} returned labels {got} for {n} samples; expected "
                         f"an int64 tensor of shape ({n},)")
    if batch.num_samples != n or batch.total_size != total:
        raise SetupError(f"trainer.collate: {collate_name} reports num_samples {batch.num_samples} and "
                         f"total_size {batch.total_size} for {n} samples of total size {total}")
