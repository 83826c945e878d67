"""Model versions: written atomically while training, announced on Kafka, loaded to predict and served.

`store` writes and reads the model directory (safetensors weights beside a model.json, `spec`), `predictor`
rebuilds a version (`load_model`), `outputs` turns a model's outputs into predictions by objective, `export`
writes a TorchScript graph, `freshness` measures how soon a served model has trained a produced sample.
"""

from .errors import VersionError
from .outputs import OutputTransform, Predictions, classify, output_transform
from .predictor import Predictor, load_model
from .spec import FORMAT, MODEL_SETTINGS, SPEC_FILE, WEIGHTS_FILE, ModelSpec, spec_for
from .store import (
    latest_version,
    next_version,
    prune_versions,
    read_version,
    resolve_version,
    version_dirs,
    version_name,
    write_version,
)

__all__ = [
    "FORMAT",
    "MODEL_SETTINGS",
    "SPEC_FILE",
    "WEIGHTS_FILE",
    "ModelSpec",
    "OutputTransform",
    "Predictions",
    "Predictor",
    "VersionError",
    "classify",
    "latest_version",
    "load_model",
    "next_version",
    "output_transform",
    "prune_versions",
    "read_version",
    "resolve_version",
    "spec_for",
    "version_dirs",
    "version_name",
    "write_version",
]
