"""Fleet balance measures shared by the service, the simulator and benchmarks (pure functions)."""

from __future__ import annotations

import numpy as np

__all__ = ["dif", "straggler_effect", "summarize_times"]


def straggler_effect(seconds: np.ndarray | list[float]) -> float:
    """LBB Eq. 4: SE = (max T - min T) / mean T over the devices' compute times (0 for < 2 devices)."""
    t = np.asarray(seconds, dtype=np.float64)
    if t.size < 2:
        return 0.0
    mean = float(t.mean())
    return float((t.max() - t.min()) / mean) if mean > 0 else 0.0


def dif(values: np.ndarray | list[float]) -> float:
    """Data imbalance factor (CHRONICA): population standard deviation of the values (0 for none)."""
    v = np.asarray(values, dtype=np.float64)
    return float(v.std()) if v.size else 0.0


def summarize_times(seconds: np.ndarray | list[float]) -> dict[str, float]:
    """Median, p99, mean and max of a series of durations (empty series gives zeros)."""
    t = np.asarray(seconds, dtype=np.float64)
    if t.size == 0:
        return {"median": 0.0, "p99": 0.0, "mean": 0.0, "max": 0.0}
    return {"median": float(np.median(t)), "p99": float(np.percentile(t, 99)), "mean": float(t.mean()),
            "max": float(t.max())}
