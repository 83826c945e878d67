"""`classification`: an integer label per sample, cross-entropy, accuracy against the most common class."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from streamtrain.wire import Sample

from .base import UNTRAINABLE, Objective, Predictions, Ratio, TargetProblem

__all__ = ["Classification"]


class Classification(Objective):
    """`trainer.num_classes` logits per sample; the loss is cross-entropy.

    Metrics: `loss` (mean cross-entropy), `accuracy`, and `baseline_accuracy`, that of always answering the
    class most common among the samples trained so far.
    """

    name = "classification"
    batch_fields = ("labels",)
    headline = "accuracy"
    baseline = "baseline_accuracy"
    baseline_note = "always the class most common so far"
    higher_is_better = True
    ratios = (Ratio("loss", "loss_sum", "count"), Ratio("accuracy", "correct", "count"),
              Ratio("baseline_accuracy", "baseline_correct", "count"))

    def output_width(self) -> int:
        return self.config.num_classes

    def target_problem(self, sample: Sample) -> TargetProblem | None:
        if sample.label is None:
            return TargetProblem(UNTRAINABLE, "label is missing (trainer.objective classification needs one)")
        if sample.label >= self.config.num_classes:
            return TargetProblem(UNTRAINABLE, f"label {sample.label} is not below trainer.num_classes="
                                 f"{self.config.num_classes}")
        return None

    def probe_target(self, index: int, rng: Any) -> tuple[int | None, list[float] | None]:
        return index % self.config.num_classes, None

    def losses(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return F.cross_entropy(outputs, batch.labels, reduction="none")

    def metric_sums(self, outputs: torch.Tensor, batch: Any,
                    baseline: torch.Tensor | None = None) -> dict[str, torch.Tensor | float]:
        labels = batch.labels
        counts = self.baseline_of(baseline, labels.device)
        majority = torch.argmax(counts)  # class 0 before any sample was trained: all counts are 0
        return {
            "count": float(labels.shape[0]),
            "loss_sum": F.cross_entropy(outputs, labels, reduction="sum"),
            "correct": (outputs.argmax(dim=1) == labels).sum().to(outputs.dtype),
            "baseline_correct": (labels == majority).sum().to(outputs.dtype),
        }

    def predicted(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return torch.softmax(outputs, dim=1)

    def predict(self, outputs: torch.Tensor, batch: Any) -> Predictions:
        # float64: each row sums to 1 to the last digit a reader checks
        probabilities = self.predicted(outputs.detach().to(torch.float64), batch).cpu().numpy()
        labels = probabilities.argmax(axis=1) if len(probabilities) else np.zeros(0, dtype=np.int64)
        return Predictions(self.name, labels=labels.astype(np.int64), probabilities=probabilities).named(None)

    def baseline_size(self) -> int:
        return self.config.num_classes

    def state_of(self, batch: Any) -> torch.Tensor:
        return torch.bincount(batch.labels, minlength=self.config.num_classes).to(torch.float64)
