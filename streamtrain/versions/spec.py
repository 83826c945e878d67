"""`model.json`: everything needed to rebuild a published model and use it, beside its safetensors weights.

The shape users know from Hugging Face's `config.json`: the model factory and the settings it is built from
(the `trainer.*` settings the model, its collate and its objective read), the features it takes, its objective,
its classes and their names, which streamtrain and torch wrote it, what it trained (the step and, per device,
the offset below which every record is in its lineage) and its metrics at that step. A reader checks every
field it uses and names the one that is wrong.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

import torch
from pydantic import ValidationError

from ..config.trainer import TrainerConfig
from .errors import VersionError

__all__ = ["FORMAT", "MODEL_SETTINGS", "SPEC_FILE", "WEIGHTS_FILE", "ModelSpec", "spec_for"]

#: The `format` of the model.json this build writes and reads.
FORMAT = "streamtrain-model/1"
SPEC_FILE = "model.json"
WEIGHTS_FILE = "model.safetensors"

#: The trainer settings a version keeps: what builds the model (a built-in one or a factory of your own, which
#: is given a TrainerConfig of them), what its collate and objective read. The rest (Kafka, optimizer, buffers)
#: concerns training, not the model.
MODEL_SETTINGS: tuple[str, ...] = ("model", "collate", "objective", "num_features", "num_classes", "hidden_size",
                                   "num_layers", "kernel_size", "length_buckets", "precision", "accepted_dtypes",
                                   "max_input_abs", "seed", "series_points", "dropout",
                                   # The inputs' standardisation (`streamtrain.models.standardise`): predict applies it.
                                   "input_standardise", "input_shift", "input_scale",
                                   # The objective's shape: its output width and how outputs become predictions.
                                   "target_width", "target_shift", "target_scale", "num_tags", "tag_threshold",
                                   "horizon", "regression_loss", "huber_delta")


@dataclass(frozen=True)
class ModelSpec:
    """The contents of one version's model.json.

    Attributes:
        job: Training job that published it.
        version: Its number in the model directory.
        step: The weights are those after this many training steps.
        settings: The `trainer.*` settings of `MODEL_SETTINGS` (JSON values).
        class_names: A classifier's class i's name, for each class (None: the classes are their numbers, or the
            objective has no classes).
        tag_names: A multi-label model's tag i's name, for each tag (None: not known).
        offsets: Per device, the offset below which every record was trained (or truncated, or dead-lettered).
        metrics: Figures at `step` (heldout_accuracy, heldout_loss, heldout_step, ...).
        weights_sha256: SHA-256 of the weights file, so a torn or replaced file is told from the one written.
        created_at: When it was written (ISO 8601).
        software: Versions of streamtrain, torch and Python that wrote it.
    """

    job: str
    version: int
    step: int
    settings: dict[str, Any]
    class_names: tuple[str, ...] | None = None
    tag_names: tuple[str, ...] | None = None
    offsets: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    weights_sha256: str = ""
    created_at: str = ""
    software: dict[str, str] = field(default_factory=dict)

    @property
    def objective(self) -> str:
        return str(self.settings.get("objective", "classification"))

    @property
    def num_features(self) -> int:
        return int(self.settings["num_features"])

    @property
    def num_classes(self) -> int:
        """The classes of a classifier; 0 for every other objective (its `num_classes` setting is unused)."""
        return int(self.settings["num_classes"]) if self.objective == "classification" else 0

    @property
    def classes(self) -> tuple[str, ...] | None:
        """A classifier's class names in label order (numbers as text when unnamed); None for other objectives."""
        if self.objective != "classification":
            return None
        return self.class_names if self.class_names is not None else tuple(str(i) for i in range(self.num_classes))

    def trainer_config(self) -> TrainerConfig:
        """The settings as the `TrainerConfig` the model factory and the collate function are given.

        Raises:
            VersionError: a setting is not valid in this build of streamtrain (named).
        """
        try:
            return TrainerConfig.model_validate(self.settings)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"])
            raise VersionError(f"{SPEC_FILE}: model.settings.{where}: {error['msg']}") from None

    def to_json(self) -> dict[str, Any]:
        """The model.json document."""
        return {
            "format": FORMAT,
            "job": self.job,
            "version": self.version,
            "step": self.step,
            "created_at": self.created_at,
            "model": {"factory": self.settings.get("model"), "collate": self.settings.get("collate"),
                      "objective": self.objective, "settings": self.settings},
            "features": {"num_features": self.num_features, "dtype": self.settings.get("precision"),
                         "accepted_dtypes": self.settings.get("accepted_dtypes")},
            "classes": {"count": self.num_classes,
                        "names": list(self.class_names) if self.class_names is not None else None},
            **({"tags": {"count": int(self.settings.get("num_tags", 0)),
                         "names": list(self.tag_names) if self.tag_names is not None else None}}
               if self.objective == "multilabel" else {}),
            "weights": {"file": WEIGHTS_FILE, "sha256": self.weights_sha256},
            "lineage": {"step": self.step, "offsets": dict(self.offsets)},
            "metrics": dict(self.metrics),
            "software": dict(self.software),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ModelSpec:
        """Read a model.json document.

        Raises:
            VersionError: a field is missing or of the wrong type, or the format is not one this build reads
                (the message names the field).
        """
        if doc.get("format") != FORMAT:
            raise VersionError(f"{SPEC_FILE}: format {doc.get('format')!r} is not {FORMAT!r} (written by another "
                               "streamtrain?)")
        settings = _field(doc, "model.settings", dict)
        missing = [k for k in ("model", "num_features", "num_classes") if k not in settings]
        if missing:
            raise VersionError(f"{SPEC_FILE}: model.settings lacks {', '.join(missing)}")
        names = _field(doc, "classes.names", (list, type(None)))
        if settings.get("objective", "classification") != "classification":
            names = None  # no classes (a version of an earlier build may have named them)
        elif names is not None and len(names) != int(settings["num_classes"]):
            raise VersionError(f"{SPEC_FILE}: classes.names has {len(names)} names for "
                               f"{settings['num_classes']} classes (model.settings.num_classes)")
        tags = _field(doc, "tags.names", (list, type(None))) if "tags" in doc else None
        offsets = _field(doc, "lineage.offsets", dict)
        metrics = _field(doc, "metrics", dict)
        try:
            return cls(job=str(_field(doc, "job", str)), version=int(_field(doc, "version", int)),
                       step=int(_field(doc, "step", int)), settings=dict(settings),
                       class_names=tuple(str(n) for n in names) if names is not None else None,
                       tag_names=tuple(str(n) for n in tags) if tags is not None else None,
                       offsets={str(k): int(v) for k, v in offsets.items()},
                       metrics={str(k): float(v) for k, v in metrics.items()},
                       weights_sha256=str(_field(doc, "weights.sha256", str)),
                       created_at=str(doc.get("created_at", "")), software=dict(doc.get("software") or {}))
        except (TypeError, ValueError) as exc:
            raise VersionError(f"{SPEC_FILE}: lineage.offsets or metrics hold a value that is not a number "
                               f"({exc})") from None

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=False) + "\n"


def _field(doc: Mapping[str, Any], dotted: str, kind: type | tuple[type, ...]) -> Any:
    value: Any = doc
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise VersionError(f"{SPEC_FILE}: field {dotted} is missing")
        value = value[part]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise VersionError(f"{SPEC_FILE}: field {dotted} is {type(value).__name__}, not "
                           f"{kind.__name__ if isinstance(kind, type) else ' or '.join(k.__name__ for k in kind)}")
    return value


def spec_for(config: TrainerConfig, *, job: str, version: int, step: int, class_names: Sequence[str] | None,
             offsets: Mapping[str, int], metrics: Mapping[str, float],
             tag_names: Sequence[str] | None = None) -> ModelSpec:
    """The spec of a version trained with `config` (the weights' checksum is filled in when they are written).

    Args:
        config: The trainer settings the model was built and trained with.
        job: The training job.
        version: The version's number.
        step: Steps the weights have trained.
        class_names: `producer.dataset.class_names` (None: classes are their numbers); kept for a classifier only.
        offsets: Per device, the offset below which every record is in the lineage.
        metrics: Its figures at `step`.
        tag_names: `producer.dataset.target_columns`; kept for a multi-label model when there is one per tag.
    """
    dumped = config.model_dump(mode="json")
    classifier = config.objective == "classification"
    tags = tuple(tag_names) if config.objective == "multilabel" and tag_names else None
    return ModelSpec(job=job, version=version, step=step, settings={k: dumped[k] for k in MODEL_SETTINGS},
                     class_names=tuple(class_names) if class_names and classifier else None,
                     tag_names=tags if tags is not None and len(tags) == config.num_tags else None,
                     offsets=dict(offsets),
                     metrics=dict(metrics), created_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
                     software={"streamtrain": metadata.version("streamtrain"), "torch": torch.__version__,
                               "python": platform.python_version()})
