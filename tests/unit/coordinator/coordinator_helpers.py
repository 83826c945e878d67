"""Builders of hand-made planning states for the coordinator tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from coordinator.perfmodel import PerfModel
from coordinator.state import DeviceState, PendingIndex, PlanningState


def device(
    name: str,
    sizes: Sequence[float],
    a: float = 1.0,
    b: float = 0.0,
    first_offset: int = 0,
    arrivals: Sequence[float] | None = None,
    **kw: object,
) -> DeviceState:
    """A device whose pending samples have these sizes at consecutive offsets, oldest first."""
    n = len(sizes)
    times = np.arange(n, dtype=float) if arrivals is None else np.asarray(arrivals, dtype=float)
    pending = PendingIndex(np.arange(first_offset, first_offset + n), np.asarray(sizes, dtype=float), times)
    return DeviceState(device_id=name, model=PerfModel(a=a, b=b, fitted=True), pending=pending, lag=n,
                       end_offset=first_offset + n, **kw)  # type: ignore[arg-type]


def state(*devices: DeviceState, step: int = 1, now: float = 100.0, **kw: object) -> PlanningState:
    return PlanningState(step=step, now=now, devices=tuple(devices), **kw)  # type: ignore[arg-type]
