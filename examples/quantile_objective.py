"""An objective of your own for streamtrain: quantile regression, a plug-in module outside the package.

The built-in `regression` objective predicts one value per sample. This one predicts three quantiles of a
scalar target, 10%, 50% and 90%: a range the target should fall in four times out of five, and its median.
It shows the whole contract (see the objectives guide):

- `output_width()`: values the model emits per sample (3, one per quantile);
- `losses(outputs, batch)`: one loss per sample (the pinball loss, averaged over the quantiles) — per
  sample, so that the trainer's weighted gradient aggregation stays exact;
- `metric_sums(outputs, batch)`: sums that add up across batches, steps and ranks, with `count` the
  number of samples; the metrics are ratios of them (`ratios`), so test-then-train figures over any window
  and any set of devices are exact;
- `target_problem(sample)`: why a sample cannot be trained (no scalar target): it is dead-lettered with that
  reason before it reaches the loss;
- `predicted(outputs, batch)`: the quantiles in the target's units, what a loaded or served model answers as
  `values` (torch operations only, so an exported graph answers them too).

Train with it (the samples need a float target of one value: e.g. the archive's Tecator_TRAIN.ts):

    PYTHONPATH=examples .venv/bin/streamtrain --set trainer.objective=quantile_objective:Quantiles \\
        --set trainer.model=seq --set trainer.optimizer=adamw --set trainer.lr=0.003 \\
        up --dataset .venv/lib/python3.11/site-packages/sktime/datasets/data/Tecator/Tecator_TRAIN.ts --steps 150
"""

from __future__ import annotations

from typing import Any

import torch

from streamtrain.objectives import Objective, Ratio, TargetProblem
from streamtrain.wire import Sample

__all__ = ["QUANTILES", "Quantiles"]

#: The quantiles predicted, in output order.
QUANTILES = (0.1, 0.5, 0.9)


class Quantiles(Objective):
    """The 10%, 50% and 90% quantiles of a scalar target, in the target's own units.

    Metrics: `loss` (mean pinball loss), `mae` (of the median), and `coverage`, the share of targets inside
    the predicted 10%-90% range (0.8 when the quantiles are right).
    """

    name = "quantiles"
    headline = "mae"
    ratios = (Ratio("loss", "loss_sum", "count"), Ratio("mae", "abs_error_sum", "count"),
              Ratio("coverage", "covered", "count"))
    batch_fields = ("targets",)

    def output_width(self) -> int:
        return len(QUANTILES)

    def target_problem(self, sample: Sample) -> TargetProblem | None:
        if sample.target is None or len(sample.target) != 1:
            return TargetProblem("missing-target", "target is not one value (trainer.objective quantiles needs a "
                                 "scalar target)")
        return None

    def _quantiles(self, outputs: torch.Tensor) -> torch.Tensor:
        # Standardised like the built-in regression, so targets of any scale train alike.
        return outputs * self.config.target_scale + self.config.target_shift

    def losses(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        levels = outputs.new_tensor(QUANTILES)
        error = (batch.targets - self.config.target_shift) / self.config.target_scale - outputs  # (N, 3)
        return torch.maximum(levels * error, (levels - 1) * error).mean(dim=1)

    def metric_sums(self, outputs: torch.Tensor, batch: Any,
                    baseline: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        low, median, high = self._quantiles(outputs).unbind(dim=1)
        truth = batch.targets[:, 0]
        return {
            "count": outputs.new_tensor(float(truth.shape[0])),
            "loss_sum": self.losses(outputs, batch).sum(),
            "abs_error_sum": (median - truth).abs().sum(),
            "covered": ((low <= truth) & (truth <= high)).sum().to(outputs.dtype),
        }

    def predicted(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return self._quantiles(outputs)  # a prediction's `values`: the three quantiles, in the target's units
