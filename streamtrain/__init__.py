"""streamtrain: Kafka-fed streaming online training with ETT-balanced batches.

This package is the shared core: the wire contract (`streamtrain.wire`), the configuration
(`streamtrain.config`), Kafka client factories (`streamtrain.kafka`), the embedded broker
(`streamtrain.broker`), model versions (`streamtrain.versions`) and the CLI. The services live in
`producers`, `coordinator`, `trainer` and `serve`.

What a user imports is here: `streamtrain.load_model(path)` rebuilds a published model version to predict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["__version__", "load_model"]

if TYPE_CHECKING:
    from .versions import load_model


def __getattr__(name: str) -> Any:
    # Imported on first use: `import streamtrain` stays light (no torch) for the CLI and the services that
    # never load a model.
    if name == "load_model":
        from .versions import load_model

        return load_model
    raise AttributeError(f"module 'streamtrain' has no attribute {name!r}")
