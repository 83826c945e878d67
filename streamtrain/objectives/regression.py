"""`regression`: a float target per sample (scalar or vector); MSE or Huber; MAE and RMSE against the training mean.

The model learns the target in standard units, (target - `trainer.target_shift`) / `trainer.target_scale`,
each value of the target by its own shift and scale when they are lists, so targets of any level and scale
reach it near 0 and 1 (a fat content of 0.9 to 49 percent, a growth rate of 0 to 0.18, in one target); its
predictions are turned back into the target's own units, where every metric is taken. A vector target's
metrics come per value too (`rmse_<i>`, `mae_<i>` and their baselines' beside the pooled `rmse`, `mae`): pooled
over values of different units, the largest would hide how the others fare.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from streamtrain.config.trainer import TrainerConfig
from streamtrain.wire import Sample

from .base import MISSING_TARGET, TARGET_WIDTH, Objective, Ratio, TargetProblem

__all__ = ["PER_VALUE_MAX", "Regression", "error_sums", "float_target_problem", "value_names"]

#: Targets of up to this many values get metrics per value (beyond it, only the pooled ones: a metric per value
#: of a long target would flood the feedback and Prometheus).
PER_VALUE_MAX = 16


def float_target_problem(sample: Sample, width: int, setting: str, objective: str) -> TargetProblem | None:
    """Why `sample` lacks a float target of `width` values (named by `setting`), or None."""
    if sample.target is None:
        return TargetProblem(MISSING_TARGET, f"target is missing (trainer.objective {objective} needs {width} "
                             f"value{'s' if width != 1 else ''}, {setting})")
    if len(sample.target) != width:
        return TargetProblem(TARGET_WIDTH, f"target has {len(sample.target)} values, not {setting}={width}")
    return None


def error_sums(predicted: torch.Tensor, baseline: torch.Tensor,
               truth: torch.Tensor) -> dict[str, torch.Tensor | float]:
    """Summed absolute and squared errors of a prediction and of a baseline (each (N, W), like `truth`)."""
    error, base = predicted - truth, baseline - truth
    return {
        "values": float(truth.numel()),
        "abs_error_sum": error.abs().sum(),
        "squared_error_sum": (error * error).sum(),
        "baseline_abs_error_sum": base.abs().sum(),
        "baseline_squared_error_sum": (base * base).sum(),
    }


def value_names(config: TrainerConfig, width: int) -> list[str]:
    """How metric names call a target's values: `trainer.target_names`, else their index."""
    names = config.target_names
    return list(names) if len(names) == width else [str(i) for i in range(width)]


def _per_value_sums(predicted: torch.Tensor, baseline: torch.Tensor, truth: torch.Tensor) -> dict[str, torch.Tensor]:
    """`error_sums` of each value (column) of the targets, keyed `<sum>_<index>` (their denominator is `count`)."""
    error, base = predicted - truth, baseline - truth
    out: dict[str, torch.Tensor] = {}
    for key, column_sums in (("abs_error_sum", error.abs().sum(dim=0)), ("squared_error_sum", (error * error).sum(
            dim=0)), ("baseline_abs_error_sum", base.abs().sum(dim=0)),
                             ("baseline_squared_error_sum", (base * base).sum(dim=0))):
        for i, value in enumerate(column_sums):
            out[f"{key}_{i}"] = value
    return out


def _per_value_ratios(names: list[str]) -> tuple[Ratio, ...]:
    return tuple(ratio for i, name in enumerate(names) for ratio in (
        Ratio(f"mae_{name}", f"abs_error_sum_{i}", "count"),
        Ratio(f"rmse_{name}", f"squared_error_sum_{i}", "count", root=True),
        Ratio(f"baseline_mae_{name}", f"baseline_abs_error_sum_{i}", "count"),
        Ratio(f"baseline_rmse_{name}", f"baseline_squared_error_sum_{i}", "count", root=True)))


#: Error metrics of a prediction and of its baseline, over every value predicted.
ERROR_RATIOS = (Ratio("mae", "abs_error_sum", "values"), Ratio("rmse", "squared_error_sum", "values", root=True),
                Ratio("baseline_mae", "baseline_abs_error_sum", "values"),
                Ratio("baseline_rmse", "baseline_squared_error_sum", "values", root=True))


class Regression(Objective):
    """`trainer.target_width` values per sample; the loss is MSE or Huber (`trainer.regression_loss`).

    Metrics: `loss`, `mae`, `rmse`, and `baseline_mae` / `baseline_rmse`, those of predicting the mean of the
    targets trained so far (0 before the first), over every value; for a target of 2 to `PER_VALUE_MAX` values the
    same per value, `mae_<name>`, `rmse_<name>`, `baseline_mae_<name>`, `baseline_rmse_<name>` (`value_names`).
    """

    name = "regression"
    batch_fields = ("targets",)
    headline = "rmse"
    baseline = "baseline_rmse"
    baseline_note = "the mean of the targets trained so far"
    ratios: tuple[Ratio, ...] = (Ratio("loss", "loss_sum", "count"), *ERROR_RATIOS)

    def __init__(self, config: TrainerConfig) -> None:
        super().__init__(config)
        width = config.target_width
        self.per_value = 1 < width <= PER_VALUE_MAX
        if self.per_value:
            self.ratios = (*type(self).ratios, *_per_value_ratios(value_names(config, width)))

    def output_width(self) -> int:
        return self.config.target_width

    def target_problem(self, sample: Sample) -> TargetProblem | None:
        return float_target_problem(sample, self.config.target_width, "trainer.target_width", self.name)

    def probe_target(self, index: int, rng: np.random.Generator) -> tuple[int | None, list[float] | None]:
        return None, rng.standard_normal(self.config.target_width).tolist()

    def losses(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        truth = self.to_standard(batch.targets)
        if self.config.regression_loss == "huber":
            each = F.huber_loss(outputs, truth, reduction="none", delta=self.config.huber_delta)
        else:
            each = F.mse_loss(outputs, truth, reduction="none")
        return each.mean(dim=1)

    def fitting_target(self, batch: Any) -> torch.Tensor:
        return self.to_standard(batch.targets)

    def metric_sums(self, outputs: torch.Tensor, batch: Any,
                    baseline: torch.Tensor | None = None) -> dict[str, torch.Tensor | float]:
        truth = batch.targets
        state = self.baseline_of(baseline, truth.device)
        mean = (state[1:] / state[0].clamp_min(1.0)).to(truth.dtype)  # zeros before any target was trained
        predicted, guessed = self.from_standard(outputs), mean.expand_as(truth)
        return {
            "count": float(truth.shape[0]),
            "loss_sum": self.losses(outputs, batch).sum(),
            **error_sums(predicted, guessed, truth),
            **(_per_value_sums(predicted, guessed, truth) if self.per_value else {}),
        }

    def predicted(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return self.from_standard(outputs)

    def baseline_size(self) -> int:
        return 1 + self.config.target_width  # the count, then the sum of each target value

    def state_of(self, batch: Any) -> torch.Tensor:
        targets = batch.targets.to(torch.float64)
        return torch.cat([targets.new_tensor([float(targets.shape[0])]), targets.sum(dim=0)])
