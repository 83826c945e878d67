"""Truncation policies: which of a device's oldest pending samples to give up (a truncate-before offset).

Truncation is decided before packing, so a plan never trains a sample it also drops, and the
oldest samples are the ones dropped (the newest are the freshest data for online training).

- `persist`: keep everything; lag may grow without bound.
- `truncate` (ScaDLES stream truncation): keep about `truncate_keep_steps` steps' worth of the
  newest arrivals (arrival rate x step time).
- `bounded`: keep at most `max_lag_samples` samples, samples younger than `max_lag_seconds`, and
  at most `max_lag_size` total size; whichever drops most wins.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

import numpy as np

from streamtrain.config import CoordinatorConfig

from .state import DeviceState

__all__ = ["TruncationDecision", "apply_truncation", "decide_truncation"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TruncationDecision:
    """Drop every pending offset below `truncate_before` (None: drop nothing)."""

    truncate_before: int | None
    dropped: int
    dropped_size: float


_KEEP_ALL = TruncationDecision(None, 0, 0.0)


def _keep_count(device: DeviceState, step_seconds: float, config: CoordinatorConfig) -> int:
    """How many of the newest samples truncation keeps (bounded: the tightest of its limits)."""
    if config.truncation == "truncate":
        return max(1, math.ceil(device.arrival_rate * step_seconds * config.truncate_keep_steps))
    keep = math.inf
    if config.max_lag_samples is not None:
        keep = min(keep, config.max_lag_samples)
    if device.pending is None:
        # Without an index only counts are known; sizes and ages are estimated from rate and mean size.
        if config.max_lag_size is not None:
            keep = min(keep, config.max_lag_size // device.mean_size)
        if config.max_lag_seconds is not None and device.arrival_rate > 0:
            keep = min(keep, math.ceil(device.arrival_rate * config.max_lag_seconds))
    return int(keep) if math.isfinite(keep) else -1


def decide_truncation(
    device: DeviceState, step_seconds: float, now: float, config: CoordinatorConfig
) -> TruncationDecision:
    """Decide what one device drops before the next step.

    Args:
        device: the device (its pending index, or lag and end offset when the index is unknown).
        step_seconds: expected step duration (the last step's, or the policy's target).
        now: current time in seconds, on the clock of the pending arrivals.
        config: `truncation` and its limits.

    Returns:
        the truncate-before offset and how many samples (and how much size) it drops.
    """
    if config.truncation == "persist":
        return _KEEP_ALL
    keep = _keep_count(device, step_seconds, config)
    pending = device.pending
    if pending is None:
        if device.end_offset is None or keep < 0 or device.lag <= keep:
            return _KEEP_ALL
        dropped = device.lag - keep
        return TruncationDecision(device.end_offset - keep, dropped, dropped * device.mean_size)
    n = len(pending)
    drop = 0 if keep < 0 else max(0, n - keep)
    if config.truncation == "bounded":
        if config.max_lag_seconds is not None:
            too_old = np.flatnonzero(pending.arrivals < now - config.max_lag_seconds)
            if len(too_old):
                drop = max(drop, int(too_old[-1]) + 1)
        if config.max_lag_size is not None:
            from_newest = np.cumsum(pending.sizes[::-1])
            kept = int(np.searchsorted(from_newest, config.max_lag_size, side="right"))
            drop = max(drop, n - kept)
    if drop <= 0:
        return _KEEP_ALL
    before = int(pending.offsets[drop]) if drop < n else int(pending.offsets[-1]) + 1
    return TruncationDecision(before, drop, float(pending.sizes[:drop].sum()))


def apply_truncation(device: DeviceState, decision: TruncationDecision) -> DeviceState:
    """The device as the policy should see it once the decision's samples are gone."""
    if decision.truncate_before is None:
        return device
    pending = device.pending.from_offset(decision.truncate_before) if device.pending is not None else None
    return replace(device, pending=pending, lag=max(0, device.lag - decision.dropped))
