"""Objectives of a user's own for the plug-in tests (named by dotted path, e.g. `objective_plugins:Pinball`)."""

from __future__ import annotations

from typing import Any

import torch

from streamtrain.config.trainer import TrainerConfig
from streamtrain.objectives import Objective, Ratio


class Pinball(Objective):
    """The median of a scalar target (pinball loss at 0.5), by subclassing `Objective`."""

    name = "median"
    ratios = (Ratio("loss", "loss_sum", "count"),)
    batch_fields = ("targets",)

    def output_width(self) -> int:
        return 1

    def losses(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        error = batch.targets[:, 0] - outputs[:, 0]
        return torch.maximum(0.5 * error, -0.5 * error)

    def metric_sums(self, outputs: torch.Tensor, batch: Any,
                    baseline: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return {"count": outputs.new_tensor(float(outputs.shape[0])), "loss_sum": self.losses(outputs, batch).sum()}


class Duck:
    """An objective that is no `Objective`: only the three methods of the contract."""

    def __init__(self, config: TrainerConfig) -> None:
        self.config = config

    def output_width(self) -> int:
        return self.config.num_classes

    def losses(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(outputs, batch.labels, reduction="none")

    def metric_sums(self, outputs: torch.Tensor, batch: Any) -> dict[str, float]:
        return {"count": float(outputs.shape[0]), "loss_sum": float(self.losses(outputs, batch).sum())}


class MeanLoss(Pinball):
    """Wrong: one loss for the whole batch, not one per sample."""

    def losses(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return super().losses(outputs, batch).mean()


class Detached(Pinball):
    """Wrong: losses cut off from the model's outputs (nothing would train)."""

    def losses(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return super().losses(outputs.detach(), batch)


class NoCount(Pinball):
    """Wrong: metric sums without the sample count."""

    def metric_sums(self, outputs: torch.Tensor, batch: Any,
                    baseline: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return {"loss_sum": self.losses(outputs, batch).sum()}


class Lacking:
    """Wrong: no `losses`."""

    def __init__(self, config: TrainerConfig) -> None:
        del config

    def output_width(self) -> int:
        return 1


def raising(config: TrainerConfig) -> Objective:
    """Wrong: the factory itself fails."""
    raise RuntimeError(f"no objective for {config.num_classes} classes")


class NegativeSum(Pinball):
    """Wrong: a metric sum below 0 (an error summed with the wrong sign): sums are counters that only grow."""

    def metric_sums(self, outputs: torch.Tensor, batch: Any,
                    baseline: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        error = (outputs[:, 0] - batch.targets[:, 0]).abs().sum()
        return {**super().metric_sums(outputs, batch), "error_sum": -error - 1}


class Standardised(Pinball):
    """The median in the target's own units, learned in standard units (`to_standard`), with a baseline of its own:
    the targets' count and sum so far, scored as predicting their mean."""

    ratios = (Ratio("loss", "loss_sum", "count"), Ratio("baseline_mae", "baseline_abs_sum", "count"))

    def losses(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        error = self.to_standard(batch.targets)[:, 0] - outputs[:, 0]
        return torch.maximum(0.5 * error, -0.5 * error)

    def metric_sums(self, outputs: torch.Tensor, batch: Any,
                    baseline: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        count, total = self.baseline_of(baseline).to(outputs.dtype).unbind()
        mean = total / count.clamp_min(1.0)
        return {**super().metric_sums(outputs, batch),
                "baseline_abs_sum": (batch.targets[:, 0] - mean).abs().sum()}

    def baseline_size(self) -> int:
        return 2

    def state_of(self, batch: Any) -> torch.Tensor:
        targets = batch.targets[:, 0].to(torch.float64)
        return torch.stack([targets.new_tensor(float(targets.shape[0])), targets.sum()])
