"""What a rank counts as backlog for the report hold, with plans made ahead of the step they are for.

The hold (`streamtrain.pacing`) asks whether the group left behind samples the coordinator knew of
and could have planned. A plan names only samples reported in the feedback it was made from (its
`Assignment.seen_through`): the step before it when plans wait for the last feedback; two steps before
when the coordinator plans one step ahead. So at the start of step s with plans one step ahead, the
samples reported with step s-1's feedback (sent a moment ago) are not backlog: no plan has seen them,
and plan s+1, made from them, will. The backlog is what the newest plan this rank holds saw and no plan
names: reported samples up to that plan's basis, less those named by a received plan for a later step.

The rank passes it on its step's first collective, before plan s+1 has usually arrived, so this is
decided from what the plans say they saw, not from whether the next plan is there yet.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable, Sequence

from streamtrain.wire import Assignment

from .buffer import SampleBuffer

__all__ = ["ReportLog", "hold_backlog", "named_by"]

logger = logging.getLogger(__name__)


class ReportLog:
    """This rank's recent reports: where each ended (every buffered sample below its bound was reported) and
    when it was sent, so the time until a plan made from it arrived can be measured.

    Args:
        keep: reports remembered (plans are at most a few steps ahead of their basis), and round trips kept.
    """

    def __init__(self, keep: int = 16) -> None:
        self.keep = keep
        self._bounds: dict[int, int] = {}
        self._sent: dict[int, float] = {}
        self._trips: deque[float] = deque(maxlen=keep)
        self._timed: set[int] = set()  # plan steps whose round trip was taken

    def record(self, step: int, first_unreported: int, sent: float | None = None) -> None:
        """The feedback of `step` reported every buffered sample below `first_unreported`; sent at `sent`
        (`time.perf_counter()`; default now)."""
        self._bounds[step] = first_unreported
        self._sent[step] = time.perf_counter() if sent is None else sent
        for s in sorted(self._bounds)[:-self.keep]:
            del self._bounds[s], self._sent[s]
        self._timed = {s for s in self._timed if s >= min(self._bounds) - 1}

    def time_plans(self, received: Iterable[tuple[Assignment, float]]) -> float:
        """Take the round trips of newly received plans; returns the shortest of the recent ones (0: none yet).

        A plan's round trip runs from this rank sending the feedback the plan was made from to the plan being
        polled. The consumer polls only while the rank waits (for a plan, data, a hold), so a plan that came
        during compute is seen late; the shortest recent trip is the one measured as it arrived.
        """
        for plan, arrived in received:
            sent = self._sent.get(plan.seen_through)
            if plan.step not in self._timed and sent is not None and arrived >= sent:
                self._timed.add(plan.step)
                self._trips.append(arrived - sent)
        return min(self._trips, default=0.0)

    def bound(self, step: int) -> int:
        """Buffered samples below this offset were reported with this rank's feedback up to `step` (0: none)."""
        done = [s for s in self._bounds if s <= step]
        return self._bounds[max(done)] if done else 0


def named_by(plans: Sequence[Assignment], device_id: str) -> set[int]:
    """The offsets `plans` name for this device (parts with a count or size budget name none)."""
    named: set[int] = set()
    for plan in plans:
        part = plan.for_device(device_id)
        if part is not None:
            named.update(part.offsets)
    return named


def hold_backlog(buffer: SampleBuffer, device_id: str, plan: Assignment | None, later: Sequence[Assignment],
                 reports: ReportLog) -> int:
    """The backlog this rank passes for the hold rule, once the step's samples are taken from `buffer`.

    Args:
        buffer: the rank's buffer after taking this step's samples.
        device_id: this rank's device.
        plan: this step's plan (None: a local fallback).
        later: the plans received for later steps, in step order.
        reports: where this rank's recent reports ended.

    Returns:
        buffered samples the newest plan saw that no later plan names, plus what truncation dropped since
        the last report; with no plan at all, every reported sample still buffered counts, and with only
        warm-start plans (made from the lag, before any report) every buffered sample.
    """
    plans = [p for p in (plan, *later) if p is not None]
    named = named_by(later, device_id)
    for p in later:  # a later part without offsets will take the oldest samples left
        part = p.for_device(device_id)
        if part is not None and not part.offsets and (part.count is not None or part.size_budget is not None):
            named.update(buffer.select_oldest(part.count, part.size_budget, exclude=named))
    basis = max(p.seen_through for p in plans) if plans else None
    if basis is not None and basis < 0:
        # Warm-start plans, made before any feedback, saw the device's lag rather than reports: every sample
        # buffered (it was on the topic to be seen) that no later plan takes is left behind.
        return buffer.count_buffered(named) + buffer.dropped_since_report
    before = reports.bound(basis) if basis is not None else None
    return buffer.count_reported(before, named) + buffer.dropped_since_report
