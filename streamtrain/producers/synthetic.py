"""How the producers deal the synthetic task (`streamtrain.synthetic`) out to devices: label sets, labels."""

from __future__ import annotations

import numpy as np

from streamtrain.config.producer import SyntheticConfig
from streamtrain.synthetic import class_prototypes

__all__ = ["device_label_sets", "draw_labels", "task_from_config"]


def device_label_sets(devices: int, classes: int, labels_per_device: int | None) -> list[np.ndarray]:
    """The classes each device draws labels from.

    IID (`labels_per_device` None): every class on every device. Non-IID with k labels per device:
    device i gets classes `i*k, ..., i*k + k - 1` (mod classes), so with devices * k <= classes the
    devices hold disjoint label sets (ScaDLES: one CIFAR10 label per device on 10 devices), and
    with more devices than that the sets wrap round and every class is still covered.
    """
    if labels_per_device is None:
        return [np.arange(classes) for _ in range(devices)]
    k = labels_per_device
    if not 1 <= k <= classes:
        raise ValueError(f"labels_per_device {k} must be in [1, {classes}]")
    return [np.sort((i * k + np.arange(k)) % classes) for i in range(devices)]


def draw_labels(label_set: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` labels drawn uniformly from a device's label set."""
    return label_set[rng.integers(0, len(label_set), size=n)]


def task_from_config(cfg: SyntheticConfig) -> np.ndarray:
    """The prototypes of the task `cfg` describes."""
    return class_prototypes(cfg.classes, cfg.features, cfg.signal, cfg.task_seed)
