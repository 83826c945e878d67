"""The model and collate function a rank trains with: a built-in one or user code named by dotted path.

User code is checked when a rank builds it, before any collective or Kafka client exists: `check_plugins`
collates a tiny probe batch (and an empty one), runs the model on it and checks what comes back, so a
plug-in that raises or returns the wrong shape fails at start-up with a message naming the setting,
not at the first step with data.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from streamtrain.config.trainer import TrainerConfig
from streamtrain.wire import Sample

from .batching import Batch, collate_packed, model_dtype
from .conv import PackedConvNet
from .errors import SetupError
from .sequence import SequenceClassifier

__all__ = ["PROBE_DEVICE", "CollateFn", "build_collate", "build_model", "check_plugins", "probe_samples",
           "resolve_dotted"]

logger = logging.getLogger(__name__)

CollateFn = Callable[[Sequence[Sample], TrainerConfig], Batch]

#: The `device_id` of the probe samples `check_plugins` collates at start-up: a collate with side effects
#: (a log of what it packed, say) can tell them from a device's samples by it.
PROBE_DEVICE = "streamtrain-probe"


def resolve_dotted(path: str, setting: str) -> Any:
    """Import `package.module:attr` (attr may itself be dotted) and return the attribute.

    Args:
        path: The dotted path.
        setting: The config key it came from, named in every error.

    Raises:
        SetupError: The path is malformed, its module does not import, or the attribute is missing
            or not callable.
    """
    module_name, sep, attr_path = path.partition(":")
    if not sep or not module_name or not attr_path:
        raise SetupError(f"{setting}: {path!r} is not of the form package.module:attribute")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise SetupError(f"{setting}: cannot import module {module_name!r} of {path!r}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise SetupError(f"{setting}: {module_name!r} has no attribute {attr_path!r}") from None
    if not callable(target):
        raise SetupError(f"{setting}: {path!r} is {type(target).__name__}, not a callable")
    return target


def build_model(config: TrainerConfig) -> nn.Module:
    """The model of `config` (built-in by name, or a factory by dotted path), seeded by `config.seed`, in the
    configured precision, on the CPU.

    Raises:
        SetupError: `config.model` cannot be resolved or its factory returns no `nn.Module`.
    """
    dtype = model_dtype(config)
    # Seeded without disturbing the caller's global RNG; DDP later broadcasts rank 0's parameters anyway.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        shape = (config.num_features, config.num_classes, config.hidden_size, config.num_layers, config.kernel_size)
        if config.model == "conv":
            model: Any = PackedConvNet(*shape)
        elif config.model == "seq":
            model = SequenceClassifier(*shape, length_buckets=config.length_buckets)
        else:
            model = resolve_dotted(config.model, "trainer.model")(config)
            if not isinstance(model, nn.Module):
                got = type(model).__name__
                raise SetupError(f"trainer.model: {config.model!r} returned {got}, not nn.Module")
            logger.info("using model %s from trainer.model", config.model)
    return model.to(dtype)


def build_collate(config: TrainerConfig) -> CollateFn:
    """The collate function of `config`: `collate_packed` unless `config.collate` names another."""
    if config.collate is None:
        return collate_packed
    collate: CollateFn = resolve_dotted(config.collate, "trainer.collate")
    logger.info("using collate function %s from trainer.collate", config.collate)
    return collate


def probe_samples(config: TrainerConfig, sizes: Sequence[int] = (1, 3, 8)) -> list[Sample]:
    """Samples as the wire would deliver them to this configuration: float32 (size, num_features), labels cycling
    through the classes. What `check_plugins` feeds a plug-in."""
    rng = np.random.default_rng(0)
    return [Sample.from_array(PROBE_DEVICE, i, rng.standard_normal((n, config.num_features)).astype(np.float32),
                              label=i % config.num_classes) for i, n in enumerate(sizes)]


def _name(value: str | None, default: str) -> str:
    return repr(value) if value is not None else default


def check_plugins(model: nn.Module, collate: CollateFn, config: TrainerConfig) -> None:
    """Collate a probe batch and an empty one, run `model` on each and check the logits.

    Args:
        model: The built model (on the CPU).
        collate: The collate function.
        config: Trainer settings (features, classes, and the plug-ins' names for messages).

    Raises:
        SetupError: naming `trainer.collate` when collating fails or its batch lacks what a step needs,
            `trainer.model` when the forward pass raises or its logits are not (num_samples, num_classes) and finite.
    """
    collate_name = _name(config.collate, "the default packing")
    model_name = _name(config.model, "conv")
    was_training = model.training
    model.eval()
    try:
        for samples in (probe_samples(config), []):
            what = f"a probe batch of {len(samples)} samples of shape (size, {config.num_features})"
            try:
                batch = collate(samples, config)
            except Exception as exc:  # a plug-in may raise anything: report it as this setting's failure
                raise SetupError(f"trainer.collate: {collate_name} raised {type(exc).__name__} on {what}: "
                                        f"{exc}") from exc
            _check_batch(batch, samples, collate_name)
            try:
                with torch.no_grad():
                    logits = model(batch)
            except Exception as exc:
                raise SetupError(f"trainer.model: {model_name} raised {type(exc).__name__} on {what} "
                                        f"(collated by {collate_name}): {exc}") from exc
            want = (len(samples), config.num_classes)
            if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != want:
                got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
                raise SetupError(f"trainer.model: {model_name} returned logits of shape {got} for {what}; "
                                        f"expected {want} (batch.num_samples, trainer.num_classes)")
            if not logits.is_floating_point() or not bool(torch.isfinite(logits).all()):
                raise SetupError(f"trainer.model: {model_name} returned non-finite or non-float logits "
                                        f"for {what}")
    finally:
        model.train(was_training)
    logger.info("plug-in check passed: model %s, collate %s", model_name, collate_name)


def _check_batch(batch: Any, samples: Sequence[Sample], collate_name: str) -> None:
    missing = [a for a in ("labels", "num_samples", "total_size", "to") if not hasattr(batch, a)]
    if missing:
        raise SetupError(f"trainer.collate: {collate_name} returned {type(batch).__name__}, which lacks "
                                f"{', '.join(missing)} (a batch needs labels, num_samples, total_size and to(device))")
    n, total = len(samples), sum(s.size for s in samples)
    labels = batch.labels
    if not isinstance(labels, torch.Tensor) or tuple(labels.shape) != (n,) or labels.dtype != torch.int64:
        got = f"{tuple(labels.shape)} {labels.dtype}" if isinstance(labels, torch.Tensor) else type(labels).__name__
        raise SetupError(f"trainer.collate: {collate_name} returned labels {got} for {n} samples; expected "
                                f"an int64 tensor of shape ({n},)")
    if batch.num_samples != n or batch.total_size != total:
        raise SetupError(f"trainer.collate: {collate_name} reports num_samples {batch.num_samples} and "
                                f"total_size {batch.total_size} for {n} samples of total size {total}")
