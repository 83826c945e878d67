"""Step plans of one rank: the coordinator's Assignments by step, and the local fallback when one is late.

A late plan must not stall training (docs/architecture.md, "Semantics"). The fallback repeats the last time budget
the coordinator gave this device, turned into a size budget by a local fit of T = a*size + b over
the rank's own recent steps; without a usable fit it repeats the last planned count, and before
any plan at all it trains `local_batch` samples. Either way the oldest samples go first.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np
from confluent_kafka import Message

from streamtrain.wire import Assignment, DevicePlan

from .plan_checks import PlanRejection, plan_problem

__all__ = ["LocalPlanner", "PlanBook", "Selection", "selection_from"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Selection:
    """What a rank trains this step, before the offsets are looked up in its buffer.

    Attributes:
        plan_step: The Assignment's step, or -1 for a local plan.
        offsets: Exact offsets to train (a coordinator plan with a buffer index).
        count: At most this many of the oldest samples (when no offsets are listed).
        size_budget: At most this total size of the oldest samples (when no offsets are listed).
        truncate_before: Drop buffered samples below this offset first.
    """

    plan_step: int
    offsets: tuple[int, ...] = ()
    count: int | None = None
    size_budget: int | None = None
    truncate_before: int | None = None

    @property
    def local(self) -> bool:
        return self.plan_step < 0


class PlanBook:
    """Assignments of one job received so far, by step (other jobs' plans are ignored, bad ones rejected).

    Args:
        job: This training job's name.
        keep: Plans kept at most (the newest), so a coordinator far ahead cannot grow memory.
        window: Plans more than this many steps ahead of the current step are rejected (`plan_problem`).
    """

    def __init__(self, job: str, keep: int = 256, window: int = 1000) -> None:
        self.job = job
        self.keep = keep
        self.window = window
        self.current = 0
        """The step the rank runs next (plans for earlier steps are dropped)."""
        self._plans: dict[int, Assignment] = {}
        self._sources: dict[int, Message] = {}
        self._arrived: dict[int, float] = {}
        self.ignored_other_jobs = 0
        self.rejected: Counter[str] = Counter()
        """Plans rejected, by reason (when they arrived or when their step ran)."""

    def add(self, plan: Assignment, source: Message | None = None) -> PlanRejection | None:
        """Remember `plan` (a later plan for the same step replaces an earlier one) and when it arrived, unless
        it is rejected.

        Args:
            plan: the decoded plan.
            source: the record it came from (dead-lettered if its step's part is rejected later).

        Returns:
            Why the plan was rejected, or None when it was kept (or belongs to another job).
        """
        if plan.job != self.job:
            self.ignored_other_jobs += 1
            return None
        rejection = plan_problem(plan, self.current, self.window)
        if rejection is not None:
            self.rejected[rejection.reason] += 1
            return rejection
        self._plans[plan.step] = plan
        self._arrived[plan.step] = time.perf_counter()
        if source is not None:
            self._sources[plan.step] = source
        else:
            self._sources.pop(plan.step, None)
        if len(self._plans) > self.keep:
            oldest = min(self._plans)
            del self._plans[oldest], self._arrived[oldest]
            self._sources.pop(oldest, None)
        return None

    def get(self, step: int) -> Assignment | None:
        """The plan for `step`, if it has arrived."""
        return self._plans.get(step)

    def source(self, step: int) -> Message | None:
        """The record the plan for `step` came from, when known."""
        return self._sources.get(step)

    def has_newer(self, step: int) -> bool:
        """A plan for a later step exists, so the one for `step` is not coming."""
        return any(s > step for s in self._plans)

    def later(self, step: int) -> list[Assignment]:
        """The plans received for steps after `step` (made ahead), in step order."""
        return [self._plans[s] for s in sorted(self._plans) if s > step]

    def received(self) -> list[tuple[Assignment, float]]:
        """Each plan held, with the `time.perf_counter()` at which it was polled."""
        return [(plan, self._arrived[step]) for step, plan in self._plans.items()]

    def forget_before(self, step: int) -> None:
        """Drop plans of steps already run; `step` is the one the rank runs next."""
        self.current = max(self.current, step)
        for s in [s for s in self._plans if s < step]:
            del self._plans[s], self._arrived[s]
            self._sources.pop(s, None)


class LocalPlanner:
    """The fallback plan: last time budget via a local T = a*size + b fit, else last count.

    Args:
        default_count: Samples per step before any plan was seen.
        window: Recent steps the fit uses.
    """

    def __init__(self, default_count: int, window: int = 32) -> None:
        self.default_count = default_count
        self._points: deque[tuple[float, float]] = deque(maxlen=window)
        self.last_target_s: float | None = None
        self.last_count: int | None = None

    def observe(self, total_size: int, compute_seconds: float) -> None:
        """Record one completed step of this rank (steps with no samples say nothing about a)."""
        if total_size > 0:
            self._points.append((float(total_size), float(compute_seconds)))

    def remember(self, plan: Assignment, device: DevicePlan | None, trained: int) -> None:
        """Keep the time budget and sample count of the last coordinator plan this rank followed."""
        target = device.predicted_seconds if device is not None and device.predicted_seconds > 0 else None
        self.last_target_s = target if target is not None else (plan.step_time_target or None)
        self.last_count = trained

    def fit(self) -> tuple[float, float] | None:
        """(a, b) of T = a*size + b by least squares, or None without two distinct sizes or with a <= 0."""
        if len(self._points) < 2:
            return None
        sizes = np.array([p[0] for p in self._points])
        times = np.array([p[1] for p in self._points])
        if np.ptp(sizes) == 0:
            return None
        a, b = np.polyfit(sizes, times, 1)
        return (float(a), float(b)) if a > 0 else None

    def selection(self, waited_s: float = 0.0) -> Selection:
        """A local plan for the next step.

        Args:
            waited_s: seconds this step already spent waiting for the plan that never came. The
                budget covers at least that long, so a rank whose coordinator is down keeps pace
                with the time passing (and its stream) instead of training the last tiny budget
                once per plan timeout.
        """
        fit = self.fit()
        if self.last_target_s is not None and fit is not None:
            a, b = fit
            target = max(self.last_target_s, waited_s)
            budget = max(1, int((target - b) / a))
            return Selection(plan_step=-1, size_budget=budget)
        count = self.last_count if self.last_count else self.default_count
        return Selection(plan_step=-1, count=count)


def selection_from(plan: Assignment, device_id: str) -> Selection:
    """This device's part of a coordinator plan (a device left out of the plan trains nothing)."""
    part = plan.for_device(device_id)
    if part is None:
        return Selection(plan_step=plan.step, count=0)
    if part.offsets or (part.count is None and part.size_budget is None):
        # An empty offset list with no budget is a plan to train nothing, not "everything buffered".
        count = None if part.offsets else 0
        return Selection(plan.step, offsets=part.offsets, count=count, truncate_before=part.truncate_before)
    return Selection(
        plan_step=plan.step, count=part.count, size_budget=part.size_budget, truncate_before=part.truncate_before
    )
