"""Pieces several policies share: count caps, rounding to a total, oldest-first batches, weights."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from streamtrain.config import CoordinatorConfig

from ..state import DeviceBatch, DeviceState

__all__ = [
    "batch_from_count",
    "count_caps",
    "normalized",
    "round_to_total",
    "size_limit",
    "solve_equal_time",
    "with_weights",
]


def size_limit(device: DeviceState, config: CoordinatorConfig) -> float:
    """The largest batch total size a plan may give this device (memory guard), inf when unbounded."""
    return math.inf if device.size_limit is None else device.size_limit * config.memory_headroom


def count_caps(devices: tuple[DeviceState, ...], config: CoordinatorConfig, *, pending: bool = True) -> np.ndarray:
    """Most samples each device may be given: b_max, its memory at its mean sample size, and (when
    `pending`) what it has buffered."""
    caps = np.full(len(devices), config.b_max, dtype=np.int64)
    for i, d in enumerate(devices):
        limit = size_limit(d, config)
        if math.isfinite(limit):
            caps[i] = min(caps[i], int(limit // d.mean_size))
        if pending and d.pending is not None:
            caps[i] = min(caps[i], len(d.pending))
    return np.maximum(caps, 0)


def round_to_total(shares: np.ndarray, total: int, caps: np.ndarray) -> np.ndarray:
    """Integer counts ∝ `shares`, each within its cap, summing to min(total, Σcaps) (largest remainder).

    What a capped device cannot take goes to the others in proportion to their shares (water filling).
    """
    shares = np.maximum(np.asarray(shares, dtype=np.float64), 0.0)
    caps = np.asarray(caps, dtype=np.int64)
    total = int(min(total, caps.sum()))
    counts = np.zeros(len(shares), dtype=np.int64)
    if total <= 0 or len(shares) == 0:
        return counts
    if shares.sum() <= 0:
        shares = np.ones_like(shares)
    free = caps > 0
    ideal = np.zeros(len(shares))
    remaining = float(total)
    for _ in range(len(shares) + 1):
        s = np.where(free, shares, 0.0)
        if s.sum() <= 0:
            s = free.astype(np.float64)
        if s.sum() <= 0:
            break
        alloc = ideal + remaining * s / s.sum()
        over = free & (alloc > caps)
        if not over.any():
            ideal = alloc
            break
        ideal = np.where(over, caps, ideal)
        free &= ~over
        remaining = total - ideal.sum()
    counts = np.minimum(np.floor(ideal + 1e-9).astype(np.int64), caps)
    short = total - int(counts.sum())
    if short > 0:
        order = np.argsort(-(ideal - counts), kind="stable")
        for i in order:
            if short == 0:
                break
            if counts[i] < caps[i]:
                counts[i] += 1
                short -= 1
    return counts


def solve_equal_time(slopes: np.ndarray, intercepts: np.ndarray, total: int, caps: np.ndarray) -> np.ndarray:
    """Counts x_i within caps summing to `total` that equalise t_i = slope_i·x_i + intercept_i (min max t).

    The continuous equal-time point is found by bisection on the common time; rounding keeps the sum.
    """
    slopes = np.maximum(np.asarray(slopes, dtype=np.float64), 1e-12)
    intercepts = np.asarray(intercepts, dtype=np.float64)
    caps = np.asarray(caps, dtype=np.int64)
    total = int(min(total, caps.sum()))
    if total <= 0:
        return np.zeros(len(slopes), dtype=np.int64)

    def filled(t: float) -> np.ndarray:
        return np.clip((t - intercepts) / slopes, 0.0, caps)

    lo, hi = float(intercepts.min()), float((intercepts + slopes * caps).max())
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if filled(mid).sum() < total:
            lo = mid
        else:
            hi = mid
    x = filled(hi)
    return round_to_total(x, total, caps)


def batch_from_count(
    device: DeviceState, count: int, config: CoordinatorConfig, weight: float = 0.0
) -> DeviceBatch:
    """The `count` oldest pending samples of a device (never past its memory limit), or a count and
    size budget when its index is unknown."""
    limit = size_limit(device, config)
    if device.pending is None:
        count = int(min(count, limit // device.mean_size)) if math.isfinite(limit) else int(count)
        total = count * device.mean_size
        return DeviceBatch(device.device_id, None, count, total, float(device.model.predict(total)) if count else 0.0,
                           weight)
    sizes = device.pending.sizes[:count]
    cum = np.cumsum(sizes)
    n = int(np.searchsorted(cum, limit, side="right")) if math.isfinite(limit) else len(sizes)
    total = float(cum[n - 1]) if n else 0.0
    predicted = float(device.model.predict(total)) if n else 0.0
    return DeviceBatch(device.device_id, device.pending.offsets[:n], n, total, predicted, weight)


def normalized(values: np.ndarray) -> np.ndarray:
    """Values scaled to sum to 1 (all zeros stay zeros)."""
    v = np.maximum(np.asarray(values, dtype=np.float64), 0.0)
    s = v.sum()
    return v / s if s > 0 else np.zeros_like(v)


def with_weights(batches: Sequence[DeviceBatch], weights: np.ndarray) -> tuple[DeviceBatch, ...]:
    """The batches with these aggregation weights."""
    # The constructor directly: dataclasses.replace costs several times more, per device, per plan.
    return tuple(DeviceBatch(b.device_id, b.offsets, b.count, b.total_size, b.predicted_seconds, float(w),
                             b.truncate_before, b.dropped) for b, w in zip(batches, weights.tolist(), strict=True))
