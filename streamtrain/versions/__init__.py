"""Model versions: written atomically while training, announced on Kafka, loaded to predict and served.

`store` writes and reads the model directory (safetensors weights beside a model.json, `spec`), `predictor`
rebuilds a version (`load_model`) and predicts through its objective (`streamtrain.Predictions`),
`export` writes a graph that runs without streamtrain, `freshness` measures how soon a served model has trained
a produced sample.
"""

from ..predictions import Predictions
from .errors import VersionError
from .export import export_model, graph_inputs
from .predictor import WRONG_SHAPE, Predictor, load_model, sample_problem
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
    "WRONG_SHAPE",
    "ModelSpec",
    "Predictions",
    "Predictor",
    "VersionError",
    "export_model",
    "graph_inputs",
    "latest_version",
    "load_model",
    "next_version",
    "prune_versions",
    "read_version",
    "resolve_version",
    "sample_problem",
    "spec_for",
    "version_dirs",
    "version_name",
    "write_version",
]
