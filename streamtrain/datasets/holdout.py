"""A held-out share of a dataset that comes without a held-out set: one CSV, one `.npz`, a directory of arrays.

A model is judged on samples it never trained on. `up --dataset` finds them in a packaged dataset's test split or
the `<name>_TEST.<ext>` beside a `<name>_TRAIN.<ext>`; a dataset that has neither would otherwise be judged only
test-then-train, which after the first pass over a replayed dataset scores samples the model has trained on, so a
model that learned its training samples by heart would look good and pass the serving gate. `hold_out` sets a share
of the samples aside instead, as scikit-learn's `train_test_split` does (a quarter by default, drawn at random from
a seed): by class when the samples are labelled, so each class keeps its share on both sides and no class that has
two or more samples goes untrained. `write_dataset` writes either side as an `.npz` that `load_dataset` reads back
as it was (frames, sizes, labels or class names, targets).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .files import Dataset

__all__ = ["MIN_SAMPLES", "HeldOutSplit", "hold_out", "stratified_subset", "subset", "write_dataset"]

#: The fewest samples a dataset needs for a share of them to be held out (fewer: none is, and the run says so).
MIN_SAMPLES = 8


@dataclass(frozen=True)
class HeldOutSplit:
    """Indices of the samples to train on and of those held out (each sorted, together every sample once)."""

    train: np.ndarray
    held_out: np.ndarray
    stratified: bool
    """Drawn class by class (the samples are labelled)."""


def stratified_subset(labels: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """Sorted indices of `n` samples that keep each class's share: each class gives the floor of its share
    (shuffled), and random leftovers fill the rest."""
    if n >= len(labels):
        return np.arange(len(labels))
    rng = np.random.default_rng(seed)
    picked: list[int] = []
    leftovers: list[int] = []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c)).tolist()
        share = n * len(idx) // len(labels)
        picked += idx[:share]
        leftovers += idx[share:]
    rng.shuffle(leftovers)
    return np.sort(np.asarray(picked + leftovers[: n - len(picked)], dtype=np.int64))


def hold_out(dataset: Dataset, share: float, seed: int = 0) -> HeldOutSplit | None:
    """Set `share` of `dataset`'s samples aside (rounded, at least one), at random from `seed`; None when it has fewer
    than `MIN_SAMPLES` samples, or labels on some samples only (which `write_dataset` cannot write).

    Labelled samples without targets are drawn class by class (`stratified_subset`), one of each class kept out of
    the draw to train on.
    """
    n = len(dataset)
    if n < MIN_SAMPLES or not 0.0 < share < 1.0 or (not dataset.labelled and bool((dataset.labels >= 0).any())):
        return None
    want = min(n - 1, max(1, round(share * n)))
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    stratified = dataset.labelled and dataset.targets is None
    if not stratified:
        held = order[:want]
    else:
        _, first = np.unique(dataset.labels[order], return_index=True)
        candidates = np.setdiff1d(np.arange(n), order[first])  # one of each class stays to train on
        held = candidates[stratified_subset(dataset.labels[candidates], want, seed)]
    mask = np.zeros(n, dtype=bool)
    mask[held] = True
    return HeldOutSplit(np.flatnonzero(~mask), np.flatnonzero(mask), stratified)


def subset(dataset: Dataset, indices: np.ndarray) -> Dataset:
    """The samples of `dataset` at `indices`, with their labels, targets and files (class names kept whole; samples
    the load left out stay reported)."""
    picked = indices.tolist()
    return Dataset([dataset.samples[i] for i in picked], dataset.labels[indices],
                   [dataset.sources[i] for i in picked], dataset.skipped, dataset.class_names,
                   None if dataset.targets is None else dataset.targets[indices], dataset.skipped_samples)


def write_dataset(dataset: Dataset, path: Path) -> Path:
    """Write `dataset` as one ragged `.npz` that `load_dataset` reads back alike: `x` the frames end to end,
    `sizes`, and `y` the labels (as class names when it has them, so a load with `producer.dataset.class_names`
    numbers them as these were) or, unlabelled, the targets; labelled samples with targets keep them as `targets`.
    Returns `path`."""
    if not len(dataset):
        raise ValueError(f"{path}: no samples to write")
    arrays: dict[str, np.ndarray] = {"x": np.concatenate(dataset.samples), "sizes": dataset.sizes}
    if dataset.labelled:
        names = dataset.class_names
        arrays["y"] = np.asarray([names[i] for i in dataset.labels]) if names is not None else dataset.labels
        if dataset.targets is not None:
            arrays["targets"] = np.asarray(dataset.targets, dtype=np.float64)
    elif dataset.targets is not None:
        arrays["y"] = np.asarray(dataset.targets, dtype=np.float64).reshape(len(dataset), -1)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path
