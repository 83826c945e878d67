"""The model and collate function a rank trains with: the defaults or user code named by dotted path."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from streamtrain.config.trainer import TrainerConfig
from streamtrain.wire import Sample

from .batching import Batch, collate_packed, model_dtype
from .errors import TrainerSetupError
from .model import PackedConvNet

__all__ = ["CollateFn", "build_collate", "build_model", "resolve_dotted"]

logger = logging.getLogger(__name__)

CollateFn = Callable[[Sequence[Sample], TrainerConfig], Batch]


def resolve_dotted(path: str, setting: str) -> Any:
    """Import `package.module:attr` (attr may itself be dotted) and return the attribute.

    Args:
        path: The dotted path.
        setting: The config key it came from, named in every error.

    Raises:
        TrainerSetupError: The path is malformed, its module does not import, or the attribute is missing
            or not callable.
    """
    module_name, sep, attr_path = path.partition(":")
    if not sep or not module_name or not attr_path:
        raise TrainerSetupError(f"{setting}: {path!r} is not of the form package.module:attribute")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise TrainerSetupError(f"{setting}: cannot import module {module_name!r} of {path!r}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise TrainerSetupError(f"{setting}: {module_name!r} has no attribute {attr_path!r}") from None
    if not callable(target):
        raise TrainerSetupError(f"{setting}: {path!r} is {type(target).__name__}, not a callable")
    return target


def build_model(config: TrainerConfig) -> nn.Module:
    """The model of `config`, seeded by `config.seed`, in the configured precision, on the CPU.

    Raises:
        TrainerSetupError: `config.model` cannot be resolved or its factory returns no `nn.Module`.
    """
    dtype = model_dtype(config)
    # Seeded without disturbing the caller's global RNG; DDP later broadcasts rank 0's parameters anyway.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        if config.model is None:
            model: Any = PackedConvNet(
                config.num_features, config.num_classes, config.hidden_size, config.num_layers, config.kernel_size
            )
        else:
            model = resolve_dotted(config.model, "trainer.model")(config)
            if not isinstance(model, nn.Module):
                got = type(model).__name__
                raise TrainerSetupError(f"trainer.model: {config.model!r} returned {got}, not nn.Module")
            logger.info("using model %s from trainer.model", config.model)
    return model.to(dtype)


def build_collate(config: TrainerConfig) -> CollateFn:
    """The collate function of `config`: `collate_packed` unless `config.collate` names another."""
    if config.collate is None:
        return collate_packed
    collate: CollateFn = resolve_dotted(config.collate, "trainer.collate")
    logger.info("using collate function %s from trainer.collate", config.collate)
    return collate
