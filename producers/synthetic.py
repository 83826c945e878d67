"""The synthetic task: variable-length float32 sequences whose label is learnable from the payload.

Class c has a prototype vector mu_c of length `signal * sqrt(features)` (drawn once from
`task_seed`, so every device, trainer and evaluator sharing the seed shares the task). A sample of
class c and size s is `x[t] = mu_c + noise[t]`, noise ~ N(0, 1) per feature: averaging over the
steps reveals the class, and longer samples are easier, as longer clips are in real data.
"""

from __future__ import annotations

import numpy as np

from streamtrain.config.producer import SyntheticConfig

__all__ = ["class_prototypes", "device_label_sets", "draw_labels", "make_batch", "task_from_config"]


def class_prototypes(classes: int, features: int, signal: float, task_seed: int) -> np.ndarray:
    """The (classes, features) float32 prototypes of the task; same arguments, same prototypes."""
    rng = np.random.default_rng([task_seed, 0x5EED])
    raw = rng.standard_normal((classes, features))
    raw /= np.linalg.norm(raw, axis=1, keepdims=True)
    return (raw * signal * np.sqrt(features)).astype(np.float32)


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


def make_batch(
    sizes: np.ndarray,
    labels: np.ndarray,
    prototypes: np.ndarray,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Payloads for samples of the given sizes and labels: one float32 (size, features) array each.

    The noise for the whole batch is drawn in one call (per-sample draws cost more than encoding).
    """
    features = prototypes.shape[1]
    total = int(np.sum(sizes))
    noise = rng.standard_normal((total, features), dtype=np.float32)
    noise += np.repeat(prototypes[labels], sizes, axis=0)
    return np.split(noise, np.cumsum(sizes)[:-1])


def draw_labels(label_set: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` labels drawn uniformly from a device's label set."""
    return label_set[rng.integers(0, len(label_set), size=n)]


def task_from_config(cfg: SyntheticConfig) -> np.ndarray:
    """The prototypes of the task `cfg` describes."""
    return class_prototypes(cfg.classes, cfg.features, cfg.signal, cfg.task_seed)
