"""`load_model`: a published version rebuilt from its model.json and safetensors weights, ready to predict.

    import streamtrain
    model = streamtrain.load_model("reports/demo/model")       # a version's directory, or a model directory
    result = model.predict([series_a, series_b])                # arrays of shape (size, num_features)
    print(model.version, result.names, result.probabilities)

The predictor applies the model's own collate function (the default packing or the plug-in named in
model.json) and its objective's prediction transform (`Objective.predict`), in evaluation mode, so it answers as
the trainers' held-out evaluation scored it. A sample is checked first by the rule `serve` answers requests by
(`sample_problem`): one it would refuse, `predict` refuses with a ValueError naming it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from streamtrain.plugins import SetupError

from ..config.trainer import TrainerConfig
from ..models.batching import Batch, collate_for_prediction, payload_problem
from ..models.plugins import CollateFn, build_collate, build_model
from ..objectives import Objective, Predictions, build_objective
from ..wire import InvalidSampleError, Sample
from .errors import VersionError
from .spec import ModelSpec
from .store import read_version, resolve_version

__all__ = ["PREDICT_DEVICE", "WRONG_SHAPE", "Predictor", "load_model", "sample_problem"]

logger = logging.getLogger(__name__)

#: The `device_id` of the samples `predict` makes of the arrays it is given.
PREDICT_DEVICE = "predict"

#: The reason of a sample that is not (size, num_features) (a `Prediction`'s error, a `predict` ValueError's).
WRONG_SHAPE = "wrong-shape"


def sample_problem(sample: Sample, config: TrainerConfig, *, wire_checked: bool = False) -> tuple[str, str] | None:
    """Why a model of `config` cannot answer `sample`, as (reason, detail), or None when it can try.

    The one rule `predict` refuses a sample by and `serve` answers a request with an error by: the wire's
    (`invalid-sample`: no frames, NaN or infinity, a shape that does not fit the data), the shape the default
    packing takes (`wrong-shape`) and the payload rule (`dtype-not-accepted`, `dtype-overflow`).

    Args:
        sample: The sample.
        config: The trainer settings the model was trained with.
        wire_checked: `Sample.problems` passed already (`decode` validates).
    """
    found = [] if wire_checked else sample.problems()
    if found:
        return InvalidSampleError.reason, "; ".join(found)
    if config.collate is None and (len(sample.shape) != 2 or sample.shape[1] != config.num_features):
        return WRONG_SHAPE, f"shape {list(sample.shape)} is not (size, {config.num_features})"
    return payload_problem(sample, config)


class Predictor:
    """One model version, rebuilt, with its collate function and objective.

    Attributes:
        spec: Everything model.json says (settings, lineage, metrics).
        path: The version's directory.
        config: The trainer settings the model is rebuilt from.
        model: The rebuilt `nn.Module`, in evaluation mode.
        objective: Turns the model's outputs into `Predictions`.
    """

    def __init__(self, spec: ModelSpec, path: Path, config: TrainerConfig, model: nn.Module, collate: CollateFn,
                 objective: Objective, max_batch_size: int = 16384) -> None:
        self.spec = spec
        self.path = path
        self.config = config
        self.model = model.eval()
        self.collate = collate
        self.objective = objective
        self.max_batch_size = max_batch_size

    @property
    def version(self) -> int:
        """The version's number."""
        return self.spec.version

    @property
    def classes(self) -> tuple[str, ...] | None:
        """A classifier's class names in label order (their numbers as text when the classes have no names); None
        for every other objective."""
        return self.spec.classes

    @property
    def tags(self) -> tuple[str, ...] | None:
        """A multi-label model's tag names in tag order (`producer.dataset.target_columns`), when known."""
        return self.spec.tag_names

    @property
    def metrics(self) -> dict[str, float]:
        """The version's metrics at its step (heldout_accuracy, prequential_accuracy, ...)."""
        return dict(self.spec.metrics)

    def __repr__(self) -> str:
        return (f"Predictor(version={self.version}, step={self.spec.step}, model={self.spec.settings.get('model')!r}, "
                f"objective={self.spec.objective!r}, path='{self.path}')")

    def problem(self, sample: Sample, *, wire_checked: bool = False) -> tuple[str, str] | None:
        """Why this version cannot answer `sample` (`sample_problem`), or None."""
        return sample_problem(sample, self.config, wire_checked=wire_checked)

    def predict(self, arrays: Sequence[np.ndarray] | np.ndarray) -> Predictions:
        """Predict each array (one sample each, shape (size, num_features), any dtype the wire carries).

        Args:
            arrays: The samples; a single 2-D array is one sample.

        Returns:
            One row per sample, in the objective's terms (`Predictions`).

        Raises:
            ValueError: a sample `serve` would refuse (`sample_problem`): no frames, NaN or infinity, the wrong
                number of features, a dtype the wire or the model does not take; the message names its index
                and the reason.
        """
        if isinstance(arrays, np.ndarray) and arrays.ndim == 2:
            arrays = [arrays]
        samples = []
        for i, array in enumerate(arrays):
            a = np.asarray(array)
            if a.ndim != 2:
                raise ValueError(f"sample {i}: shape {list(a.shape)} is not (size, {self.spec.num_features}) "
                                 f"({WRONG_SHAPE})")
            try:
                sample = Sample.from_array(PREDICT_DEVICE, i, a)
            except ValueError as exc:
                raise ValueError(f"sample {i}: {exc}") from None
            problem = self.problem(sample)
            if problem is not None:
                raise ValueError(f"sample {i}: {problem[1]} ({problem[0]})")
            samples.append(sample)
        return self.predict_samples(samples)

    def predict_samples(self, samples: Sequence[Sample]) -> Predictions:
        """Predict wire samples as they are (labels and targets are ignored; see `problem` for those it cannot
        take), in batches of at most `max_batch_size` frames.

        Raises:
            Exception: whatever the collate function or the model raise on a sample they cannot take.
        """
        chunks = _chunks(samples, self.max_batch_size) or [[]]
        parts = [self.objective.predict(*self._outputs(chunk)).named(self.spec.classes) for chunk in chunks]
        return Predictions.concat(parts, self.spec.objective)

    def outputs(self, samples: Sequence[Sample]) -> torch.Tensor:
        """The model's raw outputs for one batch of samples."""
        return self._outputs(samples)[0]

    def _outputs(self, samples: Sequence[Sample]) -> tuple[torch.Tensor, Batch]:
        """The model's raw outputs for one batch of samples, and the batch (a plug-in collate needs labels:
        unlabelled samples get 0)."""
        batch: Batch = self.collate([_with_label(s) for s in samples], self.config)
        with torch.inference_mode():
            return self.model(batch), batch


def _with_label(sample: Sample) -> Sample:
    # A plug-in collate (and the batch contract) may need labels; a request has none, and none is read back.
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


def _older_settings(config: TrainerConfig, spec: ModelSpec, tensors: Mapping[str, torch.Tensor]) -> TrainerConfig:
    """A version written before model.json kept `series_points`: the points its `seqflat` weights were built for
    (the whole-series path's linear layer, of its one MLP or its first head, reads 2 x features x (points + 1)
    inputs)."""
    weight = tensors.get("whole.linear.weight", tensors.get("whole.0.linear.weight"))
    if config.model != "seqflat" or "series_points" in spec.settings or weight is None or weight.ndim != 2:
        return config
    points, left = divmod(int(weight.shape[1]), 2 * config.num_features)
    if left or points < 2:
        return config  # not what the built-in model writes: the weights' own check names the mismatch
    return config.model_copy(update={"series_points": points - 1})


def load_model(path: str | Path, version: int | str = "latest") -> Predictor:
    """Load a published model version and rebuild it to predict.

    Args:
        path: A version's directory (holding model.json and model.safetensors) or its model.json; or a model
            directory of versions (`versions.dir`, e.g. `<out>/versions` of `streamtrain up`). `<out>/model` of
            `up` is the run's final version.
        version: "latest" or a version number, in a model directory (a version's own directory is that version
            only: asking it for another is an error).

    Returns:
        The predictor (`predict(arrays)`, `version`, `classes`, `metrics`, `spec`).

    Raises:
        VersionError: the version is not there, a file is missing or corrupt, model.json lacks a field or names a
            setting, model or objective this build cannot use, or the weights do not fit the model it describes;
            the message names the file and the field.
    """
    directory = resolve_version(Path(path), version)
    spec, tensors = read_version(directory)
    config = _older_settings(spec.trainer_config(), spec, tensors)
    try:
        # The default packing as a prediction's: no target needed, and a forecast's whole series is its input.
        collate = collate_for_prediction if config.collate is None else build_collate(config)
        objective = build_objective(config)
        model = build_model(config)
    except SetupError as exc:
        raise VersionError(f"{directory}/model.json: model.settings: {exc}") from None
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[1:3] or [str(exc)]
        raise VersionError(f"{directory}/model.safetensors: its weights do not fit the model model.json describes "
                           f"(model.settings): {' '.join(line.strip() for line in first)}") from None
    logger.info("loaded model version %d (step %d) from %s", spec.version, spec.step, directory)
    return Predictor(spec, directory, config, model, collate, objective)
