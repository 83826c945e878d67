"""The fleet as the live service reconstructs it from Kafka: pure bookkeeping, no clients.

Everything here is fed records (feedback, published plans, watermark observations) and answers
with a `PlanningState`, so the same code rebuilds state on restart (replaying recent feedback and
assignments) and runs live, and unit tests drive it by hand.

A device's pending index is what its trainer reported as newly buffered, minus what lies below
its lowest unprocessed offset, minus what a published plan gave it (in flight until the trainer's
feedback for that step says it followed the plan; returned to the index otherwise), minus what a
plan truncated.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from streamtrain.config import CoordinatorConfig
from streamtrain.wire import Assignment, PendingSample, StepFeedback

from .perfmodel import PerfTracker
from .state import DeviceState, PendingIndex, PlanningState

__all__ = ["DeviceRecord", "FleetTracker", "PendingBook", "RateEstimator"]

logger = logging.getLogger(__name__)

# Weight of the newest sample size in a device's mean-size EWMA.
_SIZE_ALPHA = 0.05


class RateEstimator:
    """Arrival rate in records/s from a topic's high watermark growth, as a time-weighted EWMA.

    Args:
        halflife_seconds: age at which an observation weighs half; observations arrive at any
            interval, so the weight of each is `1 - 0.5 ** (dt / halflife)`.
    """

    def __init__(self, halflife_seconds: float) -> None:
        if halflife_seconds <= 0:
            raise ValueError(f"halflife_seconds {halflife_seconds} must be > 0")
        self.halflife = halflife_seconds
        self.rate = 0.0
        self._last: tuple[int, float] | None = None
        self._primed = False

    def observe(self, end_offset: int, at: float) -> float:
        """Add a high watermark seen at time `at` (seconds); returns the updated rate."""
        if self._last is None:
            self._last = (end_offset, at)
            return self.rate
        last_end, last_at = self._last
        dt = at - last_at
        if dt <= 0:
            return self.rate
        if end_offset < last_end:
            # The topic was deleted and re-created: its history says nothing about the new one.
            logger.warning("high watermark went back from %d to %d; arrival rate restarts", last_end, end_offset)
            self._last = (end_offset, at)
            self.rate, self._primed = 0.0, False
            return self.rate
        instant = (end_offset - last_end) / dt
        if self._primed:
            self.rate += (1.0 - 0.5 ** (dt / self.halflife)) * (instant - self.rate)
        else:
            self.rate, self._primed = instant, True
        self._last = (end_offset, at)
        return self.rate


class PendingBook:
    """One device's pending-sample index, rebuilt from its trainer's feedback and the published plans."""

    def __init__(self) -> None:
        self._pending: dict[int, tuple[float, float]] = {}  # offset -> (size, arrival seconds)
        self._inflight: dict[int, dict[int, tuple[float, float]]] = {}  # plan step -> its offsets
        self.floor = 0
        self.buffer_depth = 0
        self.reported = False
        # The last index built; every change to `_pending` drops it (see `_changed`).
        self._cache: PendingIndex | None = None
        self._cache_len = -1

    def _changed(self) -> None:
        self._cache = None

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def inflight(self) -> int:
        """Samples handed to plans whose feedback has not come back yet."""
        return sum(len(v) for v in self._inflight.values())

    @property
    def complete(self) -> bool:
        """True when the index covers the trainer's whole buffer (not after a restart that lost old reports)."""
        return self.reported and len(self._pending) + self.inflight >= self.buffer_depth

    def ingest(self, fb: StepFeedback, arrival: float) -> None:
        """Apply one feedback record of this device.

        Args:
            fb: the trainer's report for step `fb.step`; `plan_step == step` says it followed our plan.
            arrival: when its new samples arrived, in seconds on the planning clock.
        """
        self._settle(fb.step, followed=fb.plan_step == fb.step)
        self.add(fb.new_samples, arrival)
        self.advance(fb.lowest_unprocessed_offset)
        self.buffer_depth = fb.buffer_depth
        self.reported = True
        extra = len(self._pending) + self.inflight - fb.buffer_depth
        if fb.plan_step != fb.step and extra > 0:
            # A local (fallback) plan trained samples we cannot name; trainers pack oldest first, so
            # forget the oldest rather than plan samples the trainer no longer holds.
            for offset in sorted(self._pending)[:extra]:
                del self._pending[offset]
            self._changed()

    def add(self, samples: Iterable[PendingSample], arrival: float) -> None:
        """Add newly buffered samples (those below the floor or already in flight are ignored)."""
        self._changed()
        taken = {o for step in self._inflight.values() for o in step}
        for s in samples:
            if s.offset >= self.floor and s.offset not in taken:
                self._pending[s.offset] = (float(max(s.size, 1)), arrival)

    def advance(self, lowest_unprocessed: int) -> None:
        """Forget everything below the trainer's lowest unprocessed offset (trained, dropped or committed)."""
        if lowest_unprocessed <= self.floor:
            return
        self.floor = lowest_unprocessed
        self._changed()
        self._pending = {o: v for o, v in self._pending.items() if o >= lowest_unprocessed}
        for step, offsets in list(self._inflight.items()):
            self._inflight[step] = {o: v for o, v in offsets.items() if o >= lowest_unprocessed}

    def take(self, step: int, offsets: Iterable[int]) -> None:
        """Mark the offsets a published plan gives this device for `step` as in flight."""
        self._changed()
        taken = {o: self._pending.pop(o) for o in offsets if o in self._pending}
        if taken:
            self._inflight.setdefault(step, {}).update(taken)

    def truncate(self, before: int) -> int:
        """Drop pending offsets below `before` (a plan's truncate-before); returns how many."""
        self._changed()
        gone = [o for o in self._pending if o < before]
        for o in gone:
            del self._pending[o]
        return len(gone)

    def _settle(self, step: int, followed: bool) -> None:
        self._changed()
        for s in [s for s in self._inflight if s <= step]:
            offsets = self._inflight.pop(s)
            if s == step and followed:
                continue  # trained
            # The trainer did not run that plan (late, or its feedback for it never came): still pending.
            self._pending.update({o: v for o, v in offsets.items() if o >= self.floor})

    def index(self) -> PendingIndex:
        """The pending samples, oldest first, as policies read them."""
        if self._cache is not None and self._cache_len == len(self._pending):
            return self._cache
        if not self._pending:
            return PendingIndex.empty()
        n = len(self._pending)
        offsets = np.fromiter(self._pending.keys(), dtype=np.int64, count=n)
        vals = np.array(list(self._pending.values()), dtype=np.float64).reshape(n, 2)
        order = np.argsort(offsets, kind="stable")
        self._cache = PendingIndex(offsets[order], vals[order, 0], vals[order, 1])
        self._cache_len = n
        return self._cache


@dataclass
class DeviceRecord:
    """What the service knows about one device."""

    device_id: str
    tracker: PerfTracker
    rate: RateEstimator
    book: PendingBook = field(default_factory=PendingBook)
    rank: int | None = None
    mean_size: float = 1.0
    end_offset: int | None = None
    log_start: int | None = None
    committed: int | None = None
    last_feedback: StepFeedback | None = None
    truncated: int = 0
    delete_before: int = 0

    @property
    def lag(self) -> int:
        """Records not yet trained: high watermark minus the freshest of committed / lowest unprocessed."""
        if self.end_offset is None:
            return self.book.buffer_depth
        done = max(self.book.floor, self.committed or 0)
        return max(0, self.end_offset - done)

    def lag_seconds(self, now: float) -> float:
        """Age of the oldest pending sample when indexed, else the backlog over the arrival rate."""
        index = self.book.index() if len(self.book) else None
        if index is not None and self.book.complete:
            return max(0.0, now - float(index.arrivals[0]))
        return self.lag / self.rate.rate if self.rate.rate > 0 else 0.0


class FleetTracker:
    """Every device's record, and which step is due for a plan.

    Args:
        config: coordinator settings (`devices`, model and rate settings).
    """

    def __init__(self, config: CoordinatorConfig) -> None:
        self.config = config
        self.devices: dict[str, DeviceRecord] = {}
        self.next_plan_step: int | None = None
        self._reports: dict[int, set[str]] = {}
        self._first_report: dict[int, float] = {}
        self._step_seconds: dict[int, float] = {}
        for d in config.devices:
            self.device(d)

    def device(self, device_id: str) -> DeviceRecord:
        """The record of `device_id`, created on first sight."""
        rec = self.devices.get(device_id)
        if rec is None:
            rec = DeviceRecord(device_id, PerfTracker.create(self.config),
                               RateEstimator(self.config.rate_halflife_seconds))
            self.devices[device_id] = rec
        return rec

    @property
    def expected(self) -> list[str]:
        """Devices a step waits for and plans include, in rank order."""
        if self.config.devices:
            return list(self.config.devices)
        seen = [r for r in self.devices.values() if r.last_feedback is not None]
        return [r.device_id for r in sorted(seen, key=lambda r: (r.rank if r.rank is not None else 1 << 30,
                                                                   r.device_id))]

    def ingest_feedback(self, fb: StepFeedback, received: float) -> bool:
        """Apply one feedback record; True when it counts towards a step not planned for yet.

        Args:
            fb: the record (its job already checked by the caller).
            received: when it arrived, on the monotonic clock the due-step wait uses.
        """
        rec = self.device(fb.device_id)
        if rec.last_feedback is None or fb.step >= rec.last_feedback.step:
            rec.last_feedback = fb
            rec.rank = fb.rank
        rec.tracker = rec.tracker.update(float(fb.total_size), fb.compute_seconds, fb.step, self.config)
        rec.book.ingest(fb, fb.sent_at / 1000.0)
        for s in fb.new_samples:
            rec.mean_size += _SIZE_ALPHA * (max(s.size, 1) - rec.mean_size)
        if self.next_plan_step is not None and fb.step + 1 < self.next_plan_step:
            return False  # late: its step was already planned without it
        self._reports.setdefault(fb.step, set()).add(fb.device_id)
        self._first_report.setdefault(fb.step, received)
        self._step_seconds[fb.step] = max(self._step_seconds.get(fb.step, 0.0), fb.step_seconds)
        return True

    def record_plan(self, plan: Assignment) -> dict[str, int]:
        """Apply a published plan: its offsets go in flight, truncated ones leave the index.

        Returns:
            samples each device's truncation dropped from the index.
        """
        dropped: dict[str, int] = {}
        for part in plan.devices:
            rec = self.device(part.device_id)
            rec.book.take(plan.step, part.offsets)
            if part.truncate_before is not None:
                dropped[part.device_id] = rec.book.truncate(part.truncate_before)
                rec.delete_before = max(rec.delete_before, part.truncate_before)
        if self.next_plan_step is None or plan.step + 1 > self.next_plan_step:
            self.next_plan_step = plan.step + 1
        for s in [s for s in self._reports if s + 1 < self.next_plan_step]:
            self._reports.pop(s)
            self._first_report.pop(s, None)
        return dropped

    def observe_offsets(self, device_id: str, log_start: int, end: int, committed: int | None, at: float) -> None:
        """Record a device topic's watermarks and the trainers' committed offset seen at time `at`."""
        rec = self.device(device_id)
        rec.log_start, rec.end_offset = log_start, end
        if committed is not None and committed >= 0:
            rec.committed = committed
        rec.rate.observe(end, at)

    def due_step(self, now: float) -> tuple[int, bool] | None:
        """The step to plan now and whether every expected device reported, or None when none is due.

        Args:
            now: the monotonic clock `ingest_feedback` was given.
        """
        steps = [s for s in self._reports if self.next_plan_step is None or s + 1 >= self.next_plan_step]
        if not steps:
            return None
        s = max(steps)
        complete = set(self.expected) <= self._reports[s]
        if complete or now - self._first_report[s] >= self.config.plan_wait_seconds:
            return s + 1, complete
        return None

    def reporters(self, step: int) -> set[str]:
        """Devices whose feedback for `step` arrived before it was planned past."""
        return set(self._reports.get(step, ()))

    def planning_state(self, step: int, now: float, carry: object = None) -> PlanningState:
        """The policies' input for `step`, at wall-clock time `now` (seconds, the arrivals' clock)."""
        states = []
        for device_id in self.expected:
            rec = self.device(device_id)
            fb = rec.last_feedback
            pending = rec.book.index() if rec.book.complete else None
            states.append(DeviceState(
                device_id=device_id, model=rec.tracker.model, pending=pending, arrival_rate=rec.rate.rate,
                mean_size=max(rec.mean_size, 1e-9), lag=rec.lag, end_offset=rec.end_offset,
                last_samples=fb.samples if fb else 0, last_size=float(fb.total_size) if fb else 0.0,
                last_seconds=fb.compute_seconds if fb else None,
            ))
        return PlanningState(step=step, now=now, devices=tuple(states),
                             last_step_seconds=self._step_seconds.get(step - 1) or None, carry=carry)
