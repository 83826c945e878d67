"""Assigning a dataset's samples to devices: random, stratified, or distribution-aware sharding.

From "Is Systematic Data Sharding able to Stabilize Asynchronous Parameter Server Training?" (Provatas
et al.): stratified sharding deals
each class round-robin over the devices so every shard keeps the class proportions;
distribution-aware sharding does the same for k-means neighbourhoods found after PCA, and
broadcasts neighbourhoods with fewer samples than devices to every device (too few to split, yet
each device should see them). PCA and k-means are small numpy implementations.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = [
    "ShardPlan",
    "distribution_aware_shards",
    "kmeans",
    "pca",
    "random_shards",
    "sample_features",
    "shard",
    "stratified_shards",
]

logger = logging.getLogger(__name__)

Sharding = Literal["random", "stratified", "distribution-aware"]


@dataclass(frozen=True)
class ShardPlan:
    """Which samples (indices into the dataset) each device replays."""

    shards: list[np.ndarray]
    broadcast: np.ndarray
    """Indices given to every device (sparse neighbourhoods); empty for the other modes."""
    clusters: np.ndarray | None = None
    """Neighbourhood of every sample (distribution-aware only)."""


def _deal(groups: list[np.ndarray], devices: int) -> list[np.ndarray]:
    """Round-robin each group over the devices, the deal continuing from group to group.

    Continuing (rather than starting every group at device 0, as the paper's `i mod n` does) keeps
    shard sizes within one of each other while each group's split stays within one per device.
    """
    buckets: list[list[int]] = [[] for _ in range(devices)]
    turn = 0
    for group in groups:
        for idx in group:
            buckets[turn % devices].append(int(idx))
            turn += 1
    return [np.asarray(b, dtype=np.int64) for b in buckets]


def random_shards(n: int, devices: int, rng: np.random.Generator) -> ShardPlan:
    """Shuffle and split into near-equal shards (the baseline)."""
    perm = rng.permutation(n)
    return ShardPlan([np.sort(p) for p in np.array_split(perm, devices)], np.empty(0, dtype=np.int64))


def stratified_shards(labels: np.ndarray, devices: int, rng: np.random.Generator) -> ShardPlan:
    """Round-robin within each class, so every shard keeps the dataset's class proportions."""
    groups = [rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)]
    return ShardPlan(_deal(groups, devices), np.empty(0, dtype=np.int64))


def sample_features(samples: list[np.ndarray]) -> np.ndarray:
    """One feature row per sample for PCA: the flattened sample when all share one shape (as in the
    paper), else per-feature mean and std over the size axis plus log size (samples of different
    lengths cannot be flattened into one space)."""
    shapes = {s.shape for s in samples}
    if len(shapes) == 1:
        return np.stack([s.reshape(-1) for s in samples]).astype(np.float64)
    rows = []
    for s in samples:
        flat = s.reshape(s.shape[0], -1).astype(np.float64)
        rows.append(np.concatenate([flat.mean(axis=0), flat.std(axis=0), [np.log(s.shape[0])]]))
    return np.stack(rows)


def pca(x: np.ndarray, components: int) -> np.ndarray:
    """Project the rows of `x` on its first `components` principal components (via SVD)."""
    centred = x - x.mean(axis=0)
    k = max(1, min(components, centred.shape[0], centred.shape[1]))
    _u, _s, vt = np.linalg.svd(centred, full_matrices=False)
    return centred @ vt[:k].T


def kmeans(x: np.ndarray, k: int, rng: np.random.Generator, iterations: int = 150) -> np.ndarray:
    """Cluster the rows of `x` into at most `k` clusters (k-means++ seeding, Lloyd iterations).

    Returns:
        int64 cluster id per row.
    """
    n = x.shape[0]
    k = max(1, min(k, n))
    centres = np.empty((k, x.shape[1]))
    centres[0] = x[rng.integers(n)]
    dist = ((x - centres[0]) ** 2).sum(axis=1)
    for j in range(1, k):
        total = dist.sum()
        pick = rng.integers(n) if total <= 0 else rng.choice(n, p=dist / total)
        centres[j] = x[pick]
        dist = np.minimum(dist, ((x - centres[j]) ** 2).sum(axis=1))
    assign = np.zeros(n, dtype=np.int64)
    for it in range(iterations):
        d2 = ((x[:, None, :] - centres[None, :, :]) ** 2).sum(axis=2)
        new = d2.argmin(axis=1)
        if it and np.array_equal(new, assign):
            break
        assign = new
        for j in range(k):
            members = x[assign == j]
            if len(members):
                centres[j] = members.mean(axis=0)
    return assign


def distribution_aware_shards(
    samples: list[np.ndarray],
    devices: int,
    rng: np.random.Generator,
    neighbourhoods: int,
    pca_components: int = 8,
) -> ShardPlan:
    """PCA + k-means neighbourhoods dealt round-robin; neighbourhoods smaller than `devices` go to all."""
    feats = sample_features(samples)
    std = feats.std(axis=0)
    feats = (feats - feats.mean(axis=0)) / np.where(std > 0, std, 1.0)
    clusters = kmeans(pca(feats, pca_components), neighbourhoods, rng)
    dense: list[np.ndarray] = []
    sparse: list[np.ndarray] = []
    for c in np.unique(clusters):
        members = rng.permutation(np.flatnonzero(clusters == c))
        (sparse if len(members) < devices else dense).append(members)
    broadcast = np.sort(np.concatenate(sparse)) if sparse else np.empty(0, dtype=np.int64)
    if sparse:
        logger.info("%d sparse neighbourhoods (%d samples) are broadcast to all %d devices",
                    len(sparse), len(broadcast), devices)
    shards = [np.sort(np.concatenate([s, broadcast])) for s in _deal(dense, devices)]
    return ShardPlan(shards, broadcast, clusters)


def shard(
    mode: Sharding,
    samples: list[np.ndarray],
    labels: np.ndarray,
    devices: int,
    rng: np.random.Generator,
    neighbourhoods: int | None = None,
    pca_components: int = 8,
) -> ShardPlan:
    """Shard a dataset by `mode`; `neighbourhoods` defaults to twice the number of classes (the paper's advice)."""
    if mode == "random":
        return random_shards(len(samples), devices, rng)
    if mode == "stratified":
        return stratified_shards(labels, devices, rng)
    k = neighbourhoods if neighbourhoods is not None else 2 * max(1, len(np.unique(labels)))
    return distribution_aware_shards(samples, devices, rng, k, pca_components)
