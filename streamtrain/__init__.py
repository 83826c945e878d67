"""streamtrain: Kafka-fed streaming online training with ETT-balanced batches.

This package is the shared core: the wire contract (`streamtrain.wire`), the configuration
(`streamtrain.config`), Kafka client factories (`streamtrain.kafka`), the embedded broker
(`streamtrain.broker`), model versions (`streamtrain.versions`) and the CLI. The services live in
`producers`, `coordinator`, `trainer`, `serve` and `bridge`.

What an application imports is re-exported here: `from streamtrain import DeviceProducer` to publish samples,
`streamtrain.load_model(path)` to rebuild a published model version and predict (its answer: `Predictions`),
`streamtrain.ServeClient` to ask a running `serve` for predictions, and the bridge's decoder contract
(`SourceRecord` in, `SampleFields` out, `Rejected` for a record that cannot be used).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .decoders import Rejected, SampleFields, SourceRecord
    from .objectives import Predictions
    from .publish import Delivery, DeliveryError, DeviceProducer, DeviceProducerError, QueueFullError
    from .serve_client import ServeClient, announce_version
    from .versions import load_model

__version__ = "0.1.0"

__all__ = ["Delivery", "DeliveryError", "DeviceProducer", "DeviceProducerError", "Predictions", "QueueFullError",
           "Rejected", "SampleFields", "ServeClient", "SourceRecord", "announce_version", "load_model"]

#: Public name -> the module that defines it. Loaded on first use: `import streamtrain.wire` (every service,
#: every CLI start) should not pay for the Kafka client an application's producer needs, nor for torch.
_LAZY = {**dict.fromkeys(("Delivery", "DeliveryError", "DeviceProducer", "DeviceProducerError", "QueueFullError"),
                         "streamtrain.publish"),
         **dict.fromkeys(("Rejected", "SampleFields", "SourceRecord"), "streamtrain.decoders"),
         "load_model": "streamtrain.versions", "Predictions": "streamtrain.objectives",
         **dict.fromkeys(("ServeClient", "announce_version"), "streamtrain.serve_client")}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'streamtrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
