"""An objective of your own for streamtrain: quantile regression, a plug-in module outside the package.

The built-in `regression` objective predicts one value per sample. This one predicts three quantiles of a
scalar target, 10%, 50% and 90%: a range the target should fall in four times out of five, and its median.
It shows the whole contract (see the objectives guide):

- `output_width()`: values the model emits per sample (3, one per quantile);
- `losses(outputs, batch)`: one loss per sample (the pinball loss, averaged over the quantiles) — per
  sample, so that the trainer's weighted gradient aggregation stays exact;
- `metric_sums(outputs, batch, baseline)`: sums that add up across batches, steps and ranks, with `count` the
  number of samples, all finite and not negative; the metrics are ratios of them (`ratios`), so
  test-then-train figures over any window and any set of devices are exact. `baseline` is the state of the
  baseline it scores beside the model (here the count and sum of the targets trained so far, so that
  `baseline_mae` is the error of predicting their mean): None in training (its own, `baseline_of` reads it),
  the whole fleet's at a held-out evaluation;
- `target_problem(sample)`: why a sample cannot be trained (no scalar target): it is dead-lettered with that
  reason before it reaches the loss;
- `predicted(outputs, batch)`: the quantiles in the target's units, what a loaded or served model answers as
  `values` (torch operations only, so an exported graph answers them too).

Its targets are standardised like the built-in regression's (`to_standard`, `from_standard`): `streamtrain up
--dataset` sets `trainer.target_shift` and `target_scale` from the training targets for an objective of your own
too, and prints them.

Train with it, from the repository's root (`examples` is relative to it; the samples need a float target of
one value: e.g. the archive's Tecator, packaged as `tecator`, its test split the held-out set). About a minute
and a half on two cores; the median's held-out MAE ends about 5, against about 11 for the baseline (predicting
the training mean). At the default rates steps come faster than samples: `--rates 100,100` keeps them fed.

    PYTHONPATH=examples .venv/bin/streamtrain --set trainer.objective=quantile_objective:Quantiles \\
        --set trainer.model=seq --set trainer.optimizer=adamw --set trainer.lr=0.003 --set trainer.lr_scaling=false \\
        up --dataset tecator --devices 2 --rates 100,100 --steps 300
"""

from __future__ import annotations

from typing import Any

import torch

from streamtrain import Objective, Ratio, Sample, TargetProblem

__all__ = ["QUANTILES", "Quantiles"]

#: The quantiles predicted, in output order.
QUANTILES = (0.1, 0.5, 0.9)


class Quantiles(Objective):
    """The 10%, 50% and 90% quantiles of a scalar target, in the target's own units.

    Metrics: `loss` (mean pinball loss), `mae` (of the median), `coverage`, the share of targets inside the
    predicted 10%-90% range (0.8 when the quantiles are right), and `baseline_mae`, that of predicting the mean of
    the targets trained so far.
    """

    name = "quantiles"
    headline = "mae"
    baseline = "baseline_mae"
    baseline_note = "the mean of the targets trained so far"
    ratios = (Ratio("loss", "loss_sum", "count"), Ratio("mae", "abs_error_sum", "count"),
              Ratio("coverage", "covered", "count"), Ratio("baseline_mae", "baseline_abs_error_sum", "count"))
    batch_fields = ("targets",)

    def output_width(self) -> int:
        return len(QUANTILES)

    def target_problem(self, sample: Sample) -> TargetProblem | None:
        if sample.target is None or len(sample.target) != 1:
            return TargetProblem("missing-target", "target is not one value (trainer.objective quantiles needs a "
                                 "scalar target)")
        return None

    def losses(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        levels = outputs.new_tensor(QUANTILES)
        error = self.to_standard(batch.targets) - outputs  # (N, 1) against (N, 3): in standard units, as trained
        return torch.maximum(levels * error, (levels - 1) * error).mean(dim=1)

    def metric_sums(self, outputs: torch.Tensor, batch: Any,
                    baseline: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        low, median, high = self.from_standard(outputs).unbind(dim=1)
        truth = batch.targets[:, 0]
        count, total = self.baseline_of(baseline, truth.device).to(truth.dtype).unbind()
        mean = total / count.clamp_min(1.0)  # 0 before any target was trained
        return {
            "count": outputs.new_tensor(float(truth.shape[0])),
            "loss_sum": self.losses(outputs, batch).sum(),
            "abs_error_sum": (median - truth).abs().sum(),
            "covered": ((low <= truth) & (truth <= high)).sum().to(outputs.dtype),
            "baseline_abs_error_sum": (mean - truth).abs().sum(),
        }

    def predicted(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return self.from_standard(outputs)  # a prediction's `values`: the three quantiles, in the target's units

    # The baseline's state: the count and the sum of the targets trained so far (it adds across ranks).

    def baseline_size(self) -> int:
        return 2

    def state_of(self, batch: Any) -> torch.Tensor:
        targets = batch.targets[:, 0].to(torch.float64)
        return torch.stack([targets.new_tensor(float(targets.shape[0])), targets.sum()])
