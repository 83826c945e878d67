"""The synthetic task, shared by the producers (who publish it) and the trainer (profiling, tests).

Class c has a prototype vector mu_c of length `signal * sqrt(features)` (drawn once from
`task_seed`, so every device, trainer and evaluator sharing the seed shares the task). A sample of
class c and size s is `x[t] = mu_c + noise[t]`, noise ~ N(0, 1) per feature: averaging over the
steps reveals the class, and longer samples are easier, as longer clips are in real data.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .wire import Sample

__all__ = ["class_prototypes", "make_batch", "synthetic_samples"]


def class_prototypes(classes: int, features: int, signal: float, task_seed: int) -> np.ndarray:
    """The (classes, features) float32 prototypes of the task; same arguments, same prototypes."""
    rng = np.random.default_rng([task_seed, 0x5EED])
    raw = rng.standard_normal((classes, features))
    raw /= np.linalg.norm(raw, axis=1, keepdims=True)
    return (raw * signal * np.sqrt(features)).astype(np.float32)


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


def synthetic_samples(
    sizes: Sequence[int],
    num_features: int = 16,
    num_classes: int = 10,
    *,
    seed: int = 0,
    task_seed: int = 1234,
    signal: float = 1.0,
    device_id: str = "synthetic",
    first_seq: int = 0,
) -> list[Sample]:
    """Samples of the task with the given sizes and uniformly random labels (no Kafka involved).

    Args:
        sizes: Frames of each sample (>= 1).
        num_features: Features per frame.
        num_classes: Classes to draw labels from.
        seed: Seed of labels and noise (vary it to draw new samples of the same task).
        task_seed: Seed of the class prototypes (keep it fixed to keep the task).
        signal: Prototype strength relative to the unit noise (lower is harder).
        device_id: Device id stamped on the samples.
        first_seq: Sequence number of the first sample.
    """
    lengths = np.asarray(sizes, dtype=np.int64)
    if (lengths < 1).any():
        raise ValueError(f"sample sizes must be >= 1, got {int(lengths.min())}")
    if len(lengths) == 0:
        return []
    rng = np.random.default_rng(seed)
    labels = rng.integers(num_classes, size=len(lengths))
    payloads = make_batch(lengths, labels, class_prototypes(num_classes, num_features, signal, task_seed), rng)
    return [Sample.from_array(device_id, first_seq + i, payload, label=int(label))
            for i, (payload, label) in enumerate(zip(payloads, labels, strict=True))]
