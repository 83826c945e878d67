"""`multilabel`: any of k tags per sample, as a 0/1 float target; binary cross-entropy; per-tag and mean F1.

F1 is kept as sums that add up over batches and ranks: per tag, twice its true positives and the F1
denominator 2·TP + FP + FN. The mean F1 is the mean over the tags whose F1 is defined (a tag never present
and never predicted has none). The baseline predicts every tag's most common value among the samples
trained so far (absent before the first); its loss is that of predicting each tag's frequency so far.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from streamtrain.wire import Sample

from .base import TARGET_RANGE, Objective, Predictions, Ratio, TargetProblem
from .regression import float_target_problem, value_names

__all__ = ["Multilabel"]

#: A tag's frequency the baseline's loss is taken at is kept this far from 0 and 1 (its log stays finite).
FREQUENCY_FLOOR = 1e-3


def _f1_sums(predicted: torch.Tensor, truth: torch.Tensor, prefix: str) -> dict[str, torch.Tensor]:
    hits = (predicted * truth).sum(dim=0)
    out: dict[str, torch.Tensor] = {}
    for tag, (tp, on, present) in enumerate(zip(hits, predicted.sum(dim=0), truth.sum(dim=0), strict=True)):
        out[f"{prefix}f1_num_{tag}"] = 2 * tp
        out[f"{prefix}f1_den_{tag}"] = on + present  # 2TP + FP + FN
    return out


class Multilabel(Objective):
    """`trainer.num_tags` logits per sample; the loss is binary cross-entropy, averaged over the tags.

    Metrics: `loss`, `f1_micro` (over every tag decision), `f1_mean` (the mean of the tags' F1), `f1_<tag>`
    per tag (its `trainer.target_names` name, else its index), and `baseline_loss`, `baseline_f1_micro`,
    `baseline_f1_mean` of the most-common-value baseline.
    """

    name = "multilabel"
    batch_fields = ("targets",)
    headline = "f1_mean"
    baseline = "baseline_f1_mean"
    baseline_note = "each tag's most common value so far"
    higher_is_better = True
    ratios = (Ratio("loss", "loss_sum", "count"), Ratio("baseline_loss", "baseline_loss_sum", "count"),
              Ratio("f1_micro", "f1_num", "f1_den"), Ratio("baseline_f1_micro", "baseline_f1_num", "baseline_f1_den"))

    def output_width(self) -> int:
        return self.config.num_tags

    def target_problem(self, sample: Sample) -> TargetProblem | None:
        found = float_target_problem(sample, self.config.num_tags, "trainer.num_tags", self.name)
        if found is None and sample.target is not None and not all(0.0 <= v <= 1.0 for v in sample.target):
            return TargetProblem(TARGET_RANGE, "target holds values outside [0, 1] (a multilabel target is 1 for a "
                                 "tag the sample has, 0 for one it has not)")
        return found

    def probe_target(self, index: int, rng: np.random.Generator) -> tuple[int | None, list[float] | None]:
        return None, rng.integers(0, 2, self.config.num_tags).astype(float).tolist()

    def losses(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(outputs, batch.targets, reduction="none").mean(dim=1)

    def metric_sums(self, outputs: torch.Tensor, batch: Any,
                    baseline: torch.Tensor | None = None) -> dict[str, torch.Tensor | float]:
        truth = batch.targets
        state = self.baseline_of(baseline, truth.device)
        frequency = (state[1:] / state[0].clamp_min(1.0)).to(truth.dtype)
        predicted = (torch.sigmoid(outputs) >= self.config.tag_threshold).to(truth.dtype)
        base = (frequency > 0.5).to(truth.dtype).expand_as(truth)
        prior = frequency.clamp(FREQUENCY_FLOOR, 1 - FREQUENCY_FLOOR).expand_as(truth)
        f1 = {**_f1_sums(predicted, truth, ""), **_f1_sums(base, truth, "baseline_")}
        for prefix in ("", "baseline_"):
            f1[f"{prefix}f1_num"] = sum((f1[f"{prefix}f1_num_{t}"] for t in range(truth.shape[1])),
                                        outputs.new_zeros(()))
            f1[f"{prefix}f1_den"] = sum((f1[f"{prefix}f1_den_{t}"] for t in range(truth.shape[1])),
                                        outputs.new_zeros(()))
        return {
            "count": float(truth.shape[0]),
            "loss_sum": self.losses(outputs, batch).sum(),
            "baseline_loss_sum": F.binary_cross_entropy(prior, truth, reduction="none").mean(dim=1).sum(),
            **f1,
        }

    def summarise(self, sums: Mapping[str, float]) -> dict[str, float]:
        out = super().summarise(sums)
        names = value_names(self.config, self.config.num_tags)
        for prefix in ("", "baseline_"):
            scores = []
            for tag in range(self.config.num_tags):
                below = sums.get(f"{prefix}f1_den_{tag}", 0.0)
                if below:
                    scores.append(sums.get(f"{prefix}f1_num_{tag}", 0.0) / below)
                    if not prefix:
                        out[f"f1_{names[tag]}"] = scores[-1]
            if scores:
                out[f"{prefix}f1_mean"] = float(np.mean(scores))
        return out

    def predicted(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return torch.sigmoid(outputs)

    def predict(self, outputs: torch.Tensor, batch: Any) -> Predictions:
        probabilities = self.predicted(outputs.detach().to(torch.float64), batch).cpu().numpy()
        return Predictions(self.name, probabilities=probabilities, tags=probabilities >= self.config.tag_threshold)

    def baseline_size(self) -> int:
        return 1 + self.config.num_tags  # the count, then how often each tag was present

    def state_of(self, batch: Any) -> torch.Tensor:
        targets = batch.targets.to(torch.float64)
        return torch.cat([targets.new_tensor([float(targets.shape[0])]), targets.sum(dim=0)])
