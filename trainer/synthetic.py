"""Learnable synthetic samples for profiling, benchmarks and tests of the trainer (no Kafka involved).

Each class c has a fixed random prototype frame p_c; a sample of class c is `size` frames of
p_c plus Gaussian noise, so its label is learnable from the payload (by averaging over time) and
its size carries no information about the class.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from streamtrain.wire import Sample

__all__ = ["synthetic_samples"]


def synthetic_samples(
    sizes: Sequence[int],
    num_features: int = 16,
    num_classes: int = 10,
    *,
    seed: int = 0,
    task_seed: int = 1234,
    noise: float = 1.0,
    device_id: str = "synthetic",
    first_seq: int = 0,
) -> list[Sample]:
    """Samples of the given sizes with random labels, payload shape (size, num_features), float32.

    Args:
        sizes: Frames of each sample (>= 1).
        num_features: Features per frame.
        num_classes: Classes to draw labels from.
        seed: Seed of labels and noise (vary it to draw new samples of the same task).
        task_seed: Seed of the class prototypes (keep it fixed to keep the task).
        noise: Standard deviation of the per-frame noise.
        device_id: Device id stamped on the samples.
        first_seq: Sequence number of the first sample.
    """
    prototypes = np.random.default_rng(task_seed).standard_normal((num_classes, num_features))
    rng = np.random.default_rng(seed)
    samples: list[Sample] = []
    for i, size in enumerate(sizes):
        if size < 1:
            raise ValueError(f"sample sizes must be >= 1, got {size}")
        label = int(rng.integers(num_classes))
        frames = prototypes[label] + noise * rng.standard_normal((int(size), num_features))
        samples.append(Sample.from_array(device_id, first_seq + i, frames.astype(np.float32), label=label))
    return samples
