"""streamtrain: Kafka-fed streaming online training with ETT-balanced batches.

What an application and a user's plug-in import is exported here, and only here is it promised to stay put (the
stability promise: docs/reference/api.md). Everything else under `streamtrain` (the services, the core's modules
by their own paths) may move between releases.

- Publishing samples: `DeviceProducer` (with `Delivery`, `DeliveryError`, `DeviceProducerError`, `QueueFullError`).
- The model out: `load_model(path)` gives a `Predictor`, whose `predict` answers with `Predictions`;
  `ServeClient` asks a running `serve` and answers with the same `Predictions` (its records: `Prediction`);
  `announce_version` puts a version before `serve`.
- Plug-ins: a model or collate function gets the `TrainerConfig` and `Sample`s (`collate_packed`, `Batch`,
  `PackedBatch` and `bucketed_length` are the built-in packing); an objective subclasses `Objective` (with
  `Ratio` and `TargetProblem`); a decoder of the bridge takes a `SourceRecord` and returns `SampleFields` or
  raises `Rejected`. `check_plugins` runs the start-up check a rank runs on them; `SetupError` is what a
  setting that cannot work raises.
- Settings and data: `load_config` (the TOML file, environment and overrides, validated) and `load_dataset`.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import StreamtrainConfig, TrainerConfig, load_config
    from .datasets import load_dataset
    from .decoders import Rejected, SampleFields, SourceRecord
    from .models import Batch, PackedBatch, bucketed_length, check_plugins, collate_packed
    from .objectives import Objective, Ratio, TargetProblem
    from .plugins import SetupError
    from .predictions import Predictions
    from .publish import Delivery, DeliveryError, DeviceProducer, DeviceProducerError, QueueFullError
    from .serve_client import ServeClient, announce_version
    from .versions import Predictor, load_model
    from .wire import Prediction, Sample

__version__ = metadata.version("streamtrain")

#: Public name -> the module that defines it. Loaded on first use: `import streamtrain.wire` (every service,
#: every CLI start) should not pay for the Kafka client an application's producer needs, nor for torch.
_LAZY = {
    **dict.fromkeys(("Delivery", "DeliveryError", "DeviceProducer", "DeviceProducerError", "QueueFullError"),
                    "streamtrain.publish"),
    **dict.fromkeys(("Predictor", "load_model"), "streamtrain.versions"),
    "Predictions": "streamtrain.predictions",
    **dict.fromkeys(("Prediction", "Sample"), "streamtrain.wire"),
    **dict.fromkeys(("ServeClient", "announce_version"), "streamtrain.serve_client"),
    **dict.fromkeys(("StreamtrainConfig", "TrainerConfig", "load_config"), "streamtrain.config"),
    **dict.fromkeys(("Batch", "PackedBatch", "bucketed_length", "check_plugins", "collate_packed"),
                    "streamtrain.models"),
    **dict.fromkeys(("Objective", "Ratio", "TargetProblem"), "streamtrain.objectives"),
    "SetupError": "streamtrain.plugins",
    **dict.fromkeys(("Rejected", "SampleFields", "SourceRecord"), "streamtrain.decoders"),
    "load_dataset": "streamtrain.datasets",
}

__all__ = [
    "Batch",
    "Delivery",
    "DeliveryError",
    "DeviceProducer",
    "DeviceProducerError",
    "Objective",
    "PackedBatch",
    "Prediction",
    "Predictions",
    "Predictor",
    "QueueFullError",
    "Ratio",
    "Rejected",
    "Sample",
    "SampleFields",
    "ServeClient",
    "SetupError",
    "SourceRecord",
    "StreamtrainConfig",
    "TargetProblem",
    "TrainerConfig",
    "announce_version",
    "bucketed_length",
    "check_plugins",
    "collate_packed",
    "load_config",
    "load_dataset",
    "load_model",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'streamtrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
