"""Models, collate functions and their plug-in checks: what the trainer trains and a loaded model predicts with.

They live in the core because more than one service needs them: the trainer builds and trains them, and a
published model version is rebuilt from them wherever it is loaded (`streamtrain.load_model`, `serve`).
"""

from streamtrain.plugins import SetupError

from .batching import Batch, PackedBatch, bucketed_length, collate_packed, pack_samples
from .plugins import CollateFn, build_collate, build_model, check_plugins
from .predicting import predict_samples

__all__ = [
    "Batch",
    "CollateFn",
    "PackedBatch",
    "SetupError",
    "bucketed_length",
    "build_collate",
    "build_model",
    "check_plugins",
    "collate_packed",
    "pack_samples",
    "predict_samples",
]
