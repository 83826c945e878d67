"""Input standardisation: every feature brought to one scale before the model, as targets are.

A model fed raw columns learns nothing from a column of day numbers near 736,000 beside one of fractions: the
large one swamps every activation (and the default packing's magnitude bound, which scales a whole sample down,
would squash the small ones to nothing). So the default packing first maps each feature x to
(x - input_shift) / input_scale, per feature, then bounds; `predict`, `serve` and an exported graph apply the
same figures, read from the version's model.json (scikit-learn's `Pipeline(StandardScaler(), ...)`: the scaler
travels with the model).

Where the figures come from:

- `streamtrain up --dataset` fits them on the training split (`fit_input_scaling`): the median and the
  interquartile range of each feature (robust to a few wild values), the standard deviation where the IQR is 0 (a
  mostly constant or binary column), and 1 for a constant column, which then enters the model as 0;
- devices fed from outside (DeviceProducer, the bridge) have no dataset to fit on: the trainers estimate them
  online (`InputEstimate`), the mean and standard deviation of every frame the group trains, summed over the
  ranks after each step until `trainer.input_warmup_samples` samples are in, then frozen. Freezing rather than
  tracking: a model's first layer is fitted to the scale its inputs had, and a scale that keeps moving moves the
  meaning of every weight under it; the warm-up window is short, so the model trained on moving figures only for
  its first few steps. Every version published after the first step carries the figures in force.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from streamtrain.config.trainer import TrainerConfig
from streamtrain.wire import Sample

__all__ = ["InputEstimate", "InputScaling", "fit_input_scaling", "input_scaling", "online_inputs",
           "standardise_tensor"]

logger = logging.getLogger(__name__)

#: Most frames `fit_input_scaling` reads (an even sample of them beyond that).
FIT_MAX_FRAMES = 2_000_000

#: IQR of a standard normal: the IQR divided by it estimates the standard deviation.
_IQR_OF_NORMAL = 1.349


@dataclass(frozen=True)
class InputScaling:
    """Per feature, what is subtracted and what it is then divided by, with notes for a person."""

    shift: tuple[float, ...]
    scale: tuple[float, ...]
    notes: tuple[str, ...] = ()
    """Columns handled specially (constant ones, huge ones), for `up` to print."""

    def settings(self) -> dict[str, object]:
        return {"trainer.input_shift": list(self.shift), "trainer.input_scale": list(self.scale)}


def _number(value: float, digits: int = 6) -> float:
    return float(f"{value:.{digits}g}")


def _column_scale(column: np.ndarray) -> tuple[float, float, str | None]:
    """(shift, scale, why it is special) of one feature's finite values."""
    if not len(column):
        return 0.0, 1.0, "no finite value"
    q25, median, q75 = np.percentile(column, [25, 50, 75])
    scale = (q75 - q25) / _IQR_OF_NORMAL
    if not scale > 0:
        scale = float(column.std())
    if not scale > 0:
        return _number(float(median), 10), 1.0, "constant"
    return _number(float(median), 10), _number(float(scale)), None


def fit_input_scaling(samples: Sequence[np.ndarray], names: Sequence[str] = ()) -> InputScaling:
    """Robust per-feature shift and scale of the frames of `samples` (each (size, F)): see the module doc.

    Args:
        samples: The training samples.
        names: The features' names for the notes (default: their index).
    """
    frames = np.concatenate([np.asarray(s, dtype=np.float64).reshape(len(s), -1) for s in samples], axis=0)
    if len(frames) > FIT_MAX_FRAMES:
        frames = frames[:: -(-len(frames) // FIT_MAX_FRAMES)]
    shift, scale, still, far = [], [], [], []
    for j in range(frames.shape[1]):
        column = frames[:, j]
        s, c, special = _column_scale(column[np.isfinite(column)])
        shift.append(s)
        scale.append(c)
        name = names[j] if j < len(names) else f"feature {j}"
        if special is not None:
            still.append(name)
        elif abs(s) > 100 * c:
            far.append(f"{name} near {s:g}, varying by {c:g}")
    notes = [f"{_listed(still)} {'is' if len(still) == 1 else 'are'} constant: "
             f"{'it enters' if len(still) == 1 else 'they enter'} the model as 0"] if still else []
    notes += [f"far from 0 for their spread, centred before they reach the model: {_listed(far)}"] if far else []
    return InputScaling(tuple(shift), tuple(scale), tuple(notes))


def _listed(items: Sequence[str], most: int = 8) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def input_scaling(config: TrainerConfig) -> tuple[np.ndarray, np.ndarray] | None:
    """The (shift, scale) the default packing applies under `config`, as float64 arrays; None: none applies."""
    if not config.input_standardise or not config.input_shift or config.objective == "forecast":
        return None
    return np.asarray(config.input_shift, dtype=np.float64), np.asarray(config.input_scale, dtype=np.float64)


def online_inputs(config: TrainerConfig) -> bool:
    """Whether the trainers estimate the input scaling online: on, unset, default packing, not a forecast."""
    return (config.input_standardise and not config.input_shift and config.collate is None
            and config.objective != "forecast")


class InputEstimate:
    """The trainers' online estimate of the input scaling (see the module doc): moments of the frames trained,
    summed over the ranks by `reduce`, until `trainer.input_warmup_samples` samples are in.

    Moments are taken about the first frames' mean (`reference`, the same on every rank once reduced), so a
    column near 736,000 keeps its variance's digits in float64.
    """

    def __init__(self, config: TrainerConfig) -> None:
        self.warmup = config.input_warmup_samples
        self.features = config.num_features
        self.samples = 0.0
        self.frames = 0.0
        self.sums = np.zeros(2 * self.features, dtype=np.float64)
        self.reference: np.ndarray | None = None
        self.frozen = False

    def _local(self, samples: Sequence[Sample]) -> np.ndarray:
        """[samples, frames, sum of frames, sum of first-frame means, sum of squares about the reference]."""
        good = [s.array().astype(np.float64) for s in samples if len(s.shape) == 2 and s.shape[1] == self.features]
        frames = np.concatenate(good, axis=0) if good else np.zeros((0, self.features))
        centred = frames - (self.reference if self.reference is not None else 0.0)
        return np.concatenate([[len(good), len(frames)], centred.sum(axis=0), (centred * centred).sum(axis=0)])

    def update(self, samples: Sequence[Sample], config: TrainerConfig,
               reduce: Callable[[np.ndarray], np.ndarray]) -> TrainerConfig:
        """Fold this step's samples (every rank's, through `reduce`, a sum over the ranks) into the estimate and
        return `config` with the estimate in force (unchanged while nothing was seen). A collective while warming."""
        if self.frozen:
            return config
        total = reduce(self._local(samples))
        if self.reference is None:
            if total[1] == 0:
                return config
            self.reference = total[2: 2 + self.features] / total[1]  # the first step's mean, every rank alike
            total = reduce(self._local(samples))
        self.samples += float(total[0])
        self.frames += float(total[1])
        self.sums += total[2:]
        mean = self.sums[: self.features] / self.frames
        var = np.maximum(self.sums[self.features:] / self.frames - mean * mean, 0.0)
        scale = np.sqrt(var)
        shift = self.reference + mean
        scale = np.where(scale > 1e-12 * np.maximum(np.abs(shift), 1.0), scale, 1.0)
        self.frozen = self.samples >= self.warmup
        if self.frozen:
            logger.info("input scaling frozen after %d samples (%d frames): shift %s, scale %s", self.samples,
                        self.frames, np.round(shift, 4).tolist()[:8], np.round(scale, 4).tolist()[:8])
        return config.model_copy(update={"input_shift": tuple(_number(v, 10) for v in shift),
                                         "input_scale": tuple(_number(v) for v in scale)})


def standardise_tensor(values: torch.Tensor, config: TrainerConfig) -> torch.Tensor:
    """`values` (N, F) standardised as the default packing does under `config` (for a graph: torch operations)."""
    scaling = input_scaling(config)
    if scaling is None:
        return values
    shift, scale = (torch.as_tensor(a, dtype=values.dtype, device=values.device) for a in scaling)
    return (values - shift) / scale
