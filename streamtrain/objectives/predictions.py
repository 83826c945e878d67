"""`Predictions`: what a model says about a batch of samples, the one result type of every way to predict.

`streamtrain.load_model(...).predict`, `streamtrain.objectives.predict_samples` and `serve` (one `Prediction`
record per row) all answer with it. Each objective fills the fields it has and leaves the others None:

| objective | fields |
|---|---|
| classification | `labels` (N,), `names` (N class names), `probabilities` (N, num_classes) |
| regression | `values` (N, target_width), in the target's own units |
| multilabel | `probabilities` (N, num_tags), `tags` (N, num_tags) bool: probability >= `trainer.tag_threshold` |
| forecast | `values` (N, horizon, num_features): the next `horizon` frames after each series |
| your own | what its `predict` fills (by default `values`: the model's raw outputs) |
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, fields, replace
from typing import Any

import numpy as np

__all__ = ["Predictions"]


@dataclass(frozen=True)
class Predictions:
    """What a model says about a batch of samples, one row per sample (the first axis of every array).

    Attributes:
        objective: The objective that made them (`classification`, `regression`, `multilabel`, `forecast`, yours).
        labels: Classification: (N,) int64, each sample's most probable class.
        names: Classification: each label's class name (its number as text when the classes have no names).
        probabilities: Classification: (N, num_classes), each row summing to 1; multi-label: (N, num_tags), each
            tag's own probability.
        values: Regression: (N, target_width); forecast: (N, horizon, num_features); your own objective's.
        tags: Multi-label: (N, num_tags) bool, the tags predicted present.
    """

    objective: str
    _: KW_ONLY
    labels: np.ndarray | None = None
    names: tuple[str, ...] | None = None
    probabilities: np.ndarray | None = None
    values: np.ndarray | None = None
    tags: np.ndarray | None = None

    def __len__(self) -> int:
        for part in (self.labels, self.probabilities, self.values, self.tags):
            if part is not None:
                return len(part)
        return 0

    def row(self, i: int) -> dict[str, Any]:
        """Sample i's prediction, JSON-ready: `label`, `label_name`, `probabilities`, `values` and `tags` (the
        indices of the tags present); None or [] where the objective has none. The same fields, flattened, are a
        `Prediction` record's."""
        return {
            "label": int(self.labels[i]) if self.labels is not None else None,
            "label_name": self.names[i] if self.names is not None else None,
            "probabilities": [float(p) for p in self.probabilities[i]] if self.probabilities is not None else [],
            "values": np.asarray(self.values[i], dtype=np.float64).tolist() if self.values is not None else [],
            "tags": [int(t) for t in np.flatnonzero(self.tags[i])] if self.tags is not None else [],
        }

    def rows(self) -> list[dict[str, Any]]:
        """Every sample's `row`."""
        return [self.row(i) for i in range(len(self))]

    def named(self, class_names: Sequence[str] | None) -> Predictions:
        """These predictions with each label's class name (`class_names[label]`; None: the label as text)."""
        if self.labels is None:
            return self
        names = tuple(class_names[i] if class_names is not None else str(i) for i in self.labels.tolist())
        return replace(self, names=names)

    @classmethod
    def concat(cls, parts: Sequence[Predictions], objective: str) -> Predictions:
        """The predictions of several batches as one, in order (none: an empty one of `objective`)."""
        if not parts:
            return cls(objective)
        merged: dict[str, Any] = {}
        for f in fields(cls):
            if f.name == "objective":
                continue
            values = [getattr(p, f.name) for p in parts]
            if values[0] is None:
                merged[f.name] = None
            elif isinstance(values[0], tuple):
                merged[f.name] = tuple(v for part in values for v in part)
            else:
                merged[f.name] = np.concatenate(values)
        return cls(parts[0].objective, **merged)
