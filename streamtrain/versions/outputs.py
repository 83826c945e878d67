"""From a model's raw outputs to what a prediction says: classes and probabilities, values, or tags.

`output_transform` is the one place an objective's prediction transform plugs in: `load_model`'s predictor and
`serve` both get theirs from it, by the objective a version was trained with (`model.json`'s
`model.objective`). Classification is built in: softmax over the logits, the most probable class, its name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .errors import VersionError

__all__ = ["OutputTransform", "Predictions", "classify", "output_transform"]


@dataclass(frozen=True)
class Predictions:
    """What a model says about a batch of samples, one row per sample; fields the objective has no use for are None.

    Attributes:
        objective: The objective the model was trained with.
        labels: Classification: (n,) the most probable class of each sample.
        names: Classification: each label's class name (its number as text when classes have no names).
        probabilities: Classification: (n, classes), each row summing to 1; multi-label: (n, tags), each in [0, 1].
        values: Regression and forecasting: (n, k) predicted values.
        tags: Multi-label: the tags predicted present, per sample.
    """

    objective: str
    labels: np.ndarray | None = None
    names: tuple[str, ...] | None = None
    probabilities: np.ndarray | None = None
    values: np.ndarray | None = None
    tags: tuple[tuple[int, ...], ...] | None = None

    def __len__(self) -> int:
        for part in (self.labels, self.values, self.probabilities, self.tags):
            if part is not None:
                return len(part)
        return 0

    def row(self, i: int) -> dict[str, Any]:
        """Sample i's prediction as the `Prediction` record's output fields."""
        return {
            "label": int(self.labels[i]) if self.labels is not None else None,
            "label_name": self.names[i] if self.names is not None else None,
            "probabilities": tuple(float(p) for p in self.probabilities[i]) if self.probabilities is not None else (),
            "values": tuple(float(v) for v in np.ravel(self.values[i])) if self.values is not None else (),
            "tags": tuple(self.tags[i]) if self.tags is not None else (),
        }


#: A model's outputs for a batch (batch.num_samples rows) → what they predict.
OutputTransform = Callable[[torch.Tensor], Predictions]


def classify(logits: torch.Tensor, class_names: Sequence[str] | None = None) -> Predictions:
    """Classification: each sample's class probabilities (softmax), its most probable class and that class's name."""
    probabilities = torch.softmax(logits.detach().to(torch.float64), dim=1).cpu().numpy()
    labels = probabilities.argmax(axis=1) if len(probabilities) else np.zeros(0, dtype=np.int64)
    names = tuple(class_names[i] if class_names is not None else str(i) for i in labels.tolist())
    return Predictions("classification", labels=labels.astype(np.int64), names=names, probabilities=probabilities)


def output_transform(objective: str, class_names: Sequence[str] | None) -> OutputTransform:
    """The prediction transform of `objective`.

    Args:
        objective: `model.objective` of the version (`trainer.objective` it was trained with).
        class_names: The classes' names (classification), or None.

    Raises:
        VersionError: this build has no prediction transform for the objective (names the field).
    """
    if objective == "classification":
        names = tuple(class_names) if class_names is not None else None
        return lambda logits: classify(logits, names)
    raise VersionError(f"model.json: model.objective {objective!r}: this build of streamtrain has no prediction "
                       "transform for it (classification only)")
