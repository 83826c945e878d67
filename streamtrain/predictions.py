"""`Predictions`: what a model says about a batch of samples, the one result type of every way to predict.

`streamtrain.load_model(...).predict`, `streamtrain.models.predict_samples` and `ServeClient.predict` all answer
with it (`serve` sends one `Prediction` record per row; `Predictions.from_records` puts them back together). Each
objective fills the fields it has and leaves the others None:

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
        versions: Answers from `serve`: (N,) int64, the model version that made each row; None from a loaded model.
    """

    objective: str
    _: KW_ONLY
    labels: np.ndarray | None = None
    names: tuple[str, ...] | None = None
    probabilities: np.ndarray | None = None
    values: np.ndarray | None = None
    tags: np.ndarray | None = None
    versions: np.ndarray | None = None

    def __len__(self) -> int:
        for part in (self.labels, self.probabilities, self.values, self.tags, self.versions):
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
    def from_records(cls, records: Sequence[Any], num_tags: int | None = None) -> Predictions:
        """`serve`'s answers (`Prediction` records, none of them a refusal, all of one objective) as one `Predictions`.

        Args:
            records: The answers, in order.
            num_tags: A multi-label model's number of tags (the records carry the present ones only); default: one
                more than the highest tag present.

        Raises:
            ValueError: an answer is a refusal (its reason is named) or the answers are of different objectives.
        """
        refused = [r for r in records if r.error is not None]
        if refused:
            raise ValueError(f"{len(refused)} of {len(records)} requests were refused: {refused[0].error} "
                             f"({refused[0].error_detail})")
        kinds = {r.objective for r in records}
        if len(kinds) > 1:
            raise ValueError(f"the answers are of different objectives: {sorted(map(str, kinds))}")
        objective = kinds.pop() if kinds else "unknown"
        objective = objective or ("classification" if records and records[0].label is not None else "unknown")
        out: dict[str, Any] = {"versions": np.array([r.version for r in records], dtype=np.int64)}
        if records and records[0].label is not None:
            out["labels"] = np.array([r.label for r in records], dtype=np.int64)
            out["names"] = tuple(r.label_name if r.label_name is not None else str(r.label) for r in records)
        if records and records[0].probabilities:
            out["probabilities"] = np.array([r.probabilities for r in records], dtype=np.float64)
        if records and records[0].values:
            shape = tuple(records[0].value_shape) or (len(records[0].values),)
            out["values"] = np.array([r.values for r in records], dtype=np.float64).reshape(len(records), *shape)
        if objective == "multilabel":
            width = num_tags if num_tags is not None else 1 + max((t for r in records for t in r.tags), default=-1)
            tags = np.zeros((len(records), width), dtype=bool)
            for i, r in enumerate(records):
                tags[i, list(r.tags)] = True
            out["tags"] = tags
        return cls(objective, **out)

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
