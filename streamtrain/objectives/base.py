"""What every objective provides, and the sums its metrics are made of.

An objective turns a model's outputs into a per-sample loss, metric sums, and predictions. Metrics are kept
as *sums* (counts, summed errors, true positives, ...) that add across samples, steps and ranks, so a
running value, a windowed value and a fleet value are all exact: add the sums, then take the ratios
(`Objective.summarise`). The loss is per sample so that the trainer's weighted aggregation stays exact: a
rank's loss is the mean over its samples, and its gradient is weighted by its sample count.

Each objective also keeps a *baseline* that needs no model, so a reader sees whether the model learned
anything: the training mean (regression), the most common class (classification), each tag's most common
value (multi-label), the last value (forecast). The baseline's state (counts and sums of the targets
trained so far) is a float64 vector that adds across ranks too (`baseline_state`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from streamtrain.config.trainer import TrainerConfig
from streamtrain.predictions import Predictions
from streamtrain.wire import Sample

__all__ = ["MISSING_TARGET", "SERIES_TOO_SHORT", "TARGET_RANGE", "TARGET_WIDTH", "UNTRAINABLE", "Objective",
           "Predictions", "Ratio", "TargetProblem", "add_sums", "read_sums"]

#: Dead-letter reasons of samples that lack what their objective trains on (each names the field at fault).
MISSING_TARGET = "missing-target"
TARGET_WIDTH = "target-width"
TARGET_RANGE = "target-range"
SERIES_TOO_SHORT = "series-too-short"
#: The reason of a sample without a usable label (classification), as for any other sample the model cannot take.
UNTRAINABLE = "untrainable"


@dataclass(frozen=True)
class TargetProblem:
    """Why a sample cannot be trained under an objective: the dead-letter reason and a detail naming the field."""

    reason: str
    detail: str


@dataclass(frozen=True)
class Ratio:
    """A metric that is the ratio of two sums (`sqrt` of it when `root`), so it adds up exactly over batches.

    Attributes:
        name: The metric's name (`accuracy`, `rmse`, ...).
        numerator: The sum above the line.
        denominator: The sum below it.
        root: Take the square root of the ratio (RMSE from summed squared errors).
    """

    name: str
    numerator: str
    denominator: str
    root: bool = False

    def of(self, sums: Mapping[str, float]) -> float | None:
        """The metric from `sums`; None when its denominator is 0 or absent."""
        below = sums.get(self.denominator, 0.0)
        if not below:
            return None
        value = sums.get(self.numerator, 0.0) / below
        return math.sqrt(max(value, 0.0)) if self.root else value


def read_sums(sums: Mapping[str, torch.Tensor | float]) -> dict[str, float]:
    """Metric sums as numbers, the tensors among them read from the device at once (one host sync)."""
    out: dict[str, float] = {}
    names: list[str] = []
    tensors: list[torch.Tensor] = []
    for name, value in sums.items():
        if isinstance(value, torch.Tensor):
            names.append(name)
            tensors.append(value.detach())
        else:
            out[name] = float(value)
    if tensors:
        dtype = tensors[0].dtype
        if all(t.dim() == 0 and t.dtype == dtype for t in tensors):  # the usual case: stacked as they are
            values = torch.stack(tensors)
        else:  # sums of mixed dtypes (or of shape (1,)): float64 holds each exactly
            values = torch.stack([t.to(torch.float64).reshape(()) for t in tensors])
        out.update(zip(names, values.tolist(), strict=True))
    return out


def _shift_and_scale(config: TrainerConfig, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.as_tensor(config.target_shift, dtype=like.dtype, device=like.device),
            torch.as_tensor(config.target_scale, dtype=like.dtype, device=like.device))


def add_sums(into: dict[str, float], more: Mapping[str, float]) -> dict[str, float]:
    """Add `more` into `into` key by key (in place) and return it."""
    for key, value in more.items():
        into[key] = into.get(key, 0.0) + float(value)
    return into


class Objective:
    """The base of every objective: what the trainer, the held-out evaluation and a loaded model call.

    Subclass it (overriding at least `output_width`, `losses` and `metric_sums`) for an objective of your
    own, and name a factory `(TrainerConfig) -> Objective` (the class itself will do) in `trainer.objective`.

    Args:
        config: The trainer settings (widths, loss kind, thresholds).
    """

    name = "objective"
    #: The metric shown first (`summarise`'s key), its baseline's, and which way is better.
    headline = "loss"
    baseline: str | None = None
    baseline_note = ""
    """What the baseline guesses, for a reader (e.g. "the mean of the targets trained so far")."""
    higher_is_better = False
    #: The metrics that are a ratio of two sums; `summarise` computes them.
    ratios: tuple[Ratio, ...] = (Ratio("loss", "loss_sum", "count"),)
    #: What the objective reads from a batch beyond its size (checked on the collate's probe batch at start-up).
    batch_fields: tuple[str, ...] = ()

    def __init__(self, config: TrainerConfig) -> None:
        self.config = config
        self._state = torch.zeros(self.baseline_size(), dtype=torch.float64)
        self._standard_tensors: dict[tuple[torch.dtype, torch.device], tuple[TrainerConfig, torch.Tensor,
                                                                             torch.Tensor]] = {}

    # ---- what a sample and the model must look like ---------------------------------------------------------

    def output_width(self) -> int:
        """Values the model emits per sample."""
        raise NotImplementedError

    def target_problem(self, sample: Sample) -> TargetProblem | None:
        """Why `sample` lacks what this objective trains on (None: it has it). Checked as samples arrive, so a
        sample without its target is dead-lettered and never reaches the loss."""
        return None

    def probe_target(self, index: int, rng: np.random.Generator) -> tuple[int | None, list[float] | None]:
        """(label, target) of the `index`-th probe sample the start-up check feeds the plug-ins."""
        return index % self.config.num_classes, rng.standard_normal(self.config.target_width).tolist()

    def min_size(self) -> int:
        """The fewest frames a sample needs (forecast: one more than its horizon)."""
        return 1

    # ---- the target's standard units ----------------------------------------------------------------------------

    def to_standard(self, targets: torch.Tensor) -> torch.Tensor:
        """Targets (N, W) in standard units: (targets - `trainer.target_shift`) / `trainer.target_scale`, each value
        by its own shift and scale when they are lists (`up --dataset` derives them from the training targets, for
        any objective whose data carries float targets)."""
        shift, scale = self._standardising(targets)
        return (targets - shift) / scale

    def from_standard(self, values: torch.Tensor) -> torch.Tensor:
        """Values in standard units (N, W) back in the target's own: values * scale + shift (`to_standard`'s
        inverse). A scalar shift and scale apply to any width (a quantile objective's three outputs of one
        target)."""
        shift, scale = self._standardising(values)
        return values * scale + shift

    def _standardising(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`trainer.target_shift` and `trainer.target_scale` as tensors like `like`, made once per dtype and device
        (every step scores and trains through them) and made anew when the settings are; inside a trace (an
        exported graph's) made where they are used, so that the graph holds them as its own constants."""
        config = self.config
        if type(like) is not torch.Tensor or torch.compiler.is_compiling():  # a trace's (export): made in it
            return _shift_and_scale(config, like)
        made = self._standard_tensors.get((like.dtype, like.device))
        if made is None or made[0] is not config:
            made = self._standard_tensors[(like.dtype, like.device)] = (config, *_shift_and_scale(config, like))
        return made[1], made[2]

    # ---- training and judging ----------------------------------------------------------------------------------

    def losses(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        """Per-sample losses (shape (N,)) of the model's `outputs` (N, output_width) on `batch`."""
        raise NotImplementedError

    def fitting_target(self, batch: Any) -> torch.Tensor | None:
        """The values (N, output_width) the outputs would have to equal for the least loss, where the loss is a squared
        error (or one like it near its least: Huber): what a head fitted in closed form by least squares is fitted to
        (`seqflat`'s ridge head). None, the default: no such values (classification's logits)."""
        return None

    @property
    def fits_in_closed_form(self) -> bool:
        """Whether `fitting_target` is given (a subclass overrides it)."""
        return type(self).fitting_target is not Objective.fitting_target

    def metric_sums(self, outputs: torch.Tensor, batch: Any,
                    baseline: torch.Tensor | None = None) -> Mapping[str, torch.Tensor | float]:
        """Metric sums of a batch, each a 0-d tensor (kept on the device: read them once, after the step) or a number
        the host already holds (a count).

        Every sum must be finite and not negative (they are Prometheus counters and add across ranks); the start-up
        probe checks that, and a step whose sums are not is left out of the figures.

        Args:
            outputs: The model's outputs for `batch` (detached).
            batch: The collated batch.
            baseline: The baseline's state to score the baseline against (`baseline_size` values; read it with
                `baseline_of`). None while training: this objective's own `baseline_state`, what this rank trained
                before the batch (test, then train). The held-out evaluation passes the whole fleet's, summed over
                the ranks. An objective whose `baseline_size` is 0 always gets None.

        Returns:
            Sums keyed by name; `count` is the number of samples.
        """
        raise NotImplementedError

    def summarise(self, sums: Mapping[str, float]) -> dict[str, float]:
        """The metrics from summed `sums` (those whose denominator is 0 are left out)."""
        out = {}
        for ratio in self.ratios:
            value = ratio.of(sums)
            if value is not None:
                out[ratio.name] = value
        return out

    def predicted(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        """The model's `outputs` (N, output_width) as the array a prediction is made of, in torch operations only
        (an exported graph ends with them): class or tag probabilities, values in the target's units. The
        default: the outputs as they are."""
        return outputs

    def predict(self, outputs: torch.Tensor, batch: Any) -> Predictions:
        """The model's `outputs` as predictions in the objective's terms (see `Predictions`); the default: `values`,
        the `predicted` array."""
        return Predictions(self.name, values=self.predicted(outputs.detach(), batch).cpu().numpy())

    # ---- the baseline ----------------------------------------------------------------------------------------------

    def baseline_size(self) -> int:
        """Length of the baseline's state vector (0: a baseline that needs no state, or none)."""
        return 0

    @property
    def baseline_state(self) -> torch.Tensor:
        """Counts and sums of the targets trained so far (float64, adds across ranks)."""
        return self._state

    def baseline_of(self, baseline: torch.Tensor | None, device: torch.device | None = None) -> torch.Tensor:
        """The baseline state `metric_sums` scores against: `baseline` as given, else this objective's own (on
        `device` when given)."""
        state = self.baseline_state if baseline is None else baseline
        return state if device is None else state.to(device)

    def observe(self, batch: Any) -> None:
        """Fold a trained batch's targets into the baseline's state (after it was scored: test, then train)."""
        if self._state.numel():
            added = self.state_of(batch)
            self._state = self._state.to(added.device) + added

    def state_of(self, batch: Any) -> torch.Tensor:
        """The baseline state one batch adds (same length as `baseline_state`)."""
        return torch.zeros(0, dtype=torch.float64)
