"""Builders of hand-made planning states and feedback records for the coordinator tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from streamtrain.coordinator.perfmodel import PerfModel
from streamtrain.coordinator.state import DeviceState, PendingIndex, PlanningState
from streamtrain.wire import PendingSample, StepFeedback


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


def feedback(step: int, device: str = "a", *, new: range | list[int] | tuple[int, ...] = (), lowest: int = 0,
             plan_step: int | None = None, depth: int | None = None, size: int = 10, rank: int = 0,
             seconds: float = 0.5) -> StepFeedback:
    """A rank's report of `step` that followed the plan (unless `plan_step` says otherwise)."""
    samples = tuple(PendingSample(o, size) for o in new)
    return StepFeedback(job="j", step=step, device_id=device, rank=rank, plan_step=step if plan_step is None
                        else plan_step, samples=4, total_size=40, compute_seconds=seconds, data_wait_seconds=0.0,
                        comm_seconds=0.0, step_seconds=seconds, memory_bytes=0, lowest_unprocessed_offset=lowest,
                        buffer_depth=len(samples) if depth is None else depth, new_samples=samples,
                        sent_at=1_000_000)
