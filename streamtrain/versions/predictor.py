"""`load_model`: a published version rebuilt from its model.json and safetensors weights, ready to predict.

    import streamtrain
    model = streamtrain.load_model("reports/demo/model")       # a version's directory, or a model directory
    result = model.predict([series_a, series_b])                # arrays of shape (size, num_features)
    print(model.version, result.names, result.probabilities)

The predictor applies the model's own collate function (the default packing or the plug-in named in
model.json) and its objective's prediction transform (`outputs.output_transform`), in evaluation mode, so it
answers as the trainers' held-out evaluation scored it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..config.trainer import TrainerConfig
from ..models.batching import Batch
from ..models.errors import SetupError
from ..models.plugins import CollateFn, build_collate, build_model
from ..wire import Sample
from .errors import VersionError
from .outputs import OutputTransform, Predictions, output_transform
from .spec import ModelSpec
from .store import read_version, resolve_version

__all__ = ["PREDICT_DEVICE", "Predictor", "load_model"]

logger = logging.getLogger(__name__)

#: The `device_id` of the samples `predict` makes of the arrays it is given.
PREDICT_DEVICE = "predict"


class Predictor:
    """One model version, rebuilt, with its collate and output transform.

    Attributes:
        spec: Everything model.json says (settings, lineage, metrics).
        path: The version's directory.
        config: The trainer settings the model is rebuilt from.
        model: The rebuilt `nn.Module`, in evaluation mode.
    """

    def __init__(self, spec: ModelSpec, path: Path, config: TrainerConfig, model: nn.Module, collate: CollateFn,
                 transform: OutputTransform, max_batch_size: int = 16384) -> None:
        self.spec = spec
        self.path = path
        self.config = config
        self.model = model.eval()
        self.collate = collate
        self.transform = transform
        self.max_batch_size = max_batch_size

    @property
    def version(self) -> int:
        """The version's number."""
        return self.spec.version

    @property
    def classes(self) -> tuple[str, ...]:
        """Class i's name, for each class (their numbers as text when the classes have no names)."""
        names = self.spec.class_names
        return names if names is not None else tuple(str(i) for i in range(self.spec.num_classes))

    @property
    def metrics(self) -> dict[str, float]:
        """The version's metrics at its step (heldout_accuracy, ...)."""
        return dict(self.spec.metrics)

    def __repr__(self) -> str:
        return (f"Predictor(version={self.version}, step={self.spec.step}, model={self.spec.settings.get('model')!r}, "
                f"objective={self.spec.objective!r}, path='{self.path}')")

    def predict(self, arrays: Sequence[np.ndarray] | np.ndarray) -> Predictions:
        """Predict each array (one sample each, shape (size, num_features), any dtype the wire carries).

        Args:
            arrays: The samples; a single 2-D array is one sample.

        Returns:
            One row per sample: classes and probabilities, or values, by the model's objective.

        Raises:
            ValueError: an array has the wrong number of features or a dtype the wire cannot carry (named by
                its index).
        """
        if isinstance(arrays, np.ndarray) and arrays.ndim == 2:
            arrays = [arrays]
        samples = []
        for i, array in enumerate(arrays):
            a = np.asarray(array)
            if a.ndim != 2 or a.shape[1] != self.spec.num_features:
                raise ValueError(f"sample {i}: shape {list(a.shape)} is not (size, {self.spec.num_features})")
            try:
                samples.append(Sample.from_array(PREDICT_DEVICE, i, a, label=0))
            except ValueError as exc:
                raise ValueError(f"sample {i}: {exc}") from None
        return self.predict_samples(samples)

    def predict_samples(self, samples: Sequence[Sample]) -> Predictions:
        """Predict wire samples (their labels, if any, are ignored), in batches of at most `max_batch_size` frames.

        Raises:
            Exception: whatever the collate function or the model raise on a sample they cannot take.
        """
        outputs = [self.outputs(chunk) for chunk in _chunks(samples, self.max_batch_size)]
        logits = torch.cat(outputs) if outputs else self.outputs([])
        return self.transform(logits)

    def outputs(self, samples: Sequence[Sample]) -> torch.Tensor:
        """The model's raw outputs for one batch of samples (the collate needs labels: unlabelled ones get 0)."""
        batch: Batch = self.collate([_with_label(s) for s in samples], self.config)
        with torch.inference_mode():
            return self.model(batch)


def _with_label(sample: Sample) -> Sample:
    # The default packing (and the batch contract) carries labels; a request has none, and none is read back.
    return sample if sample.label is not None and sample.label >= 0 else dataclasses.replace(sample, label=0)


def _chunks(samples: Sequence[Sample], max_size: int) -> list[list[Sample]]:
    out: list[list[Sample]] = []
    size = 0
    for sample in samples:
        if not out or (size + sample.size > max_size and out[-1]):
            out.append([])
            size = 0
        out[-1].append(sample)
        size += sample.size
    return out


def load_model(path: str | Path, version: int | str = "latest") -> Predictor:
    """Load a published model version and rebuild it to predict.

    Args:
        path: A version's directory (holding model.json and model.safetensors), or a model directory of versions
            (`versions.dir`, e.g. `<out>/versions` of `streamtrain up`); `<out>/model` of `up` is the run's final
            version.
        version: "latest" or a version number, when `path` is a model directory.

    Returns:
        The predictor (`predict(arrays)`, `version`, `classes`, `spec`).

    Raises:
        VersionError: a file is missing or corrupt, model.json lacks a field or names a setting, model or objective
            this build cannot use, or the weights do not fit the model it describes; the message names the file
            and the field.
    """
    directory = resolve_version(Path(path), version)
    spec, tensors = read_version(directory)
    config = spec.trainer_config()
    try:
        collate = build_collate(config)
        model = build_model(config)
    except SetupError as exc:
        raise VersionError(f"{directory}/model.json: model.settings: {exc}") from None
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[1:3] or [str(exc)]
        raise VersionError(f"{directory}/model.safetensors: its weights do not fit the model model.json describes "
                           f"(model.settings): {' '.join(line.strip() for line in first)}") from None
    transform = output_transform(spec.objective, spec.class_names)
    logger.info("loaded model version %d (step %d) from %s", spec.version, spec.step, directory)
    return Predictor(spec, directory, config, model, collate, transform)
