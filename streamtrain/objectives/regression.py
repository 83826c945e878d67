"""`regression`: a float target per sample (scalar or vector); MSE or Huber; MAE and RMSE against the training mean.

The model learns the target in standard units, (target - `trainer.target_shift`) / `trainer.target_scale`,
so targets of any level and scale reach it near 0 and 1 (a fat content of 0.9 to 49 percent, a growth rate
of 0 to 0.18); its predictions are turned back into the target's own units, where every metric is taken.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from streamtrain.wire import Sample

from .base import MISSING_TARGET, TARGET_WIDTH, Objective, Ratio, TargetProblem

__all__ = ["Regression", "error_sums", "float_target_problem"]


def float_target_problem(sample: Sample, width: int, setting: str, objective: str) -> TargetProblem | None:
    """Why `sample` lacks a float target of `width` values (named by `setting`), or None."""
    if sample.target is None:
        return TargetProblem(MISSING_TARGET, f"target is missing (trainer.objective {objective} needs {width} "
                             f"value{'s' if width != 1 else ''}, {setting})")
    if len(sample.target) != width:
        return TargetProblem(TARGET_WIDTH, f"target has {len(sample.target)} values, not {setting}={width}")
    return None


def error_sums(predicted: torch.Tensor, baseline: torch.Tensor, truth: torch.Tensor) -> dict[str, torch.Tensor]:
    """Summed absolute and squared errors of a prediction and of a baseline (each (N, W), like `truth`)."""
    error, base = predicted - truth, baseline - truth
    return {
        "values": truth.new_tensor(float(truth.numel())),
        "abs_error_sum": error.abs().sum(),
        "squared_error_sum": (error * error).sum(),
        "baseline_abs_error_sum": base.abs().sum(),
        "baseline_squared_error_sum": (base * base).sum(),
    }


#: Error metrics of a prediction and of its baseline, over every value predicted.
ERROR_RATIOS = (Ratio("mae", "abs_error_sum", "values"), Ratio("rmse", "squared_error_sum", "values", root=True),
                Ratio("baseline_mae", "baseline_abs_error_sum", "values"),
                Ratio("baseline_rmse", "baseline_squared_error_sum", "values", root=True))


class Regression(Objective):
    """`trainer.target_width` values per sample; the loss is MSE or Huber (`trainer.regression_loss`).

    Metrics: `loss`, `mae`, `rmse`, and `baseline_mae` / `baseline_rmse`, those of predicting the mean of the
    targets trained so far (0 before the first).
    """

    name = "regression"
    batch_fields = ("targets",)
    headline = "rmse"
    baseline = "baseline_rmse"
    baseline_note = "the mean of the targets trained so far"
    ratios = (Ratio("loss", "loss_sum", "count"), *ERROR_RATIOS)

    def output_width(self) -> int:
        return self.config.target_width

    def target_problem(self, sample: Sample) -> TargetProblem | None:
        return float_target_problem(sample, self.config.target_width, "trainer.target_width", self.name)

    def probe_target(self, index: int, rng: np.random.Generator) -> tuple[int | None, list[float] | None]:
        return None, rng.standard_normal(self.config.target_width).tolist()

    def _standard(self, targets: torch.Tensor) -> torch.Tensor:
        return (targets - self.config.target_shift) / self.config.target_scale

    def _values(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs * self.config.target_scale + self.config.target_shift

    def losses(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        truth = self._standard(batch.targets)
        if self.config.regression_loss == "huber":
            each = F.huber_loss(outputs, truth, reduction="none", delta=self.config.huber_delta)
        else:
            each = F.mse_loss(outputs, truth, reduction="none")
        return each.mean(dim=1)

    def metric_sums(self, outputs: torch.Tensor, batch: Any,
                    baseline: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        truth = batch.targets
        state = (self.baseline_state if baseline is None else baseline).to(truth.device)
        mean = (state[1:] / state[0].clamp_min(1.0)).to(truth.dtype)  # zeros before any target was trained
        return {
            "count": outputs.new_tensor(float(truth.shape[0])),
            "loss_sum": self.losses(outputs, batch).sum(),
            **error_sums(self._values(outputs), mean.expand_as(truth), truth),
        }

    def predicted(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return self._values(outputs)

    def baseline_size(self) -> int:
        return 1 + self.config.target_width  # the count, then the sum of each target value

    def state_of(self, batch: Any) -> torch.Tensor:
        targets = batch.targets.to(torch.float64)
        return torch.cat([targets.new_tensor([float(targets.shape[0])]), targets.sum(dim=0)])
