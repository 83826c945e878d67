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

from .membership import Membership
from .perfmodel import PerfTracker
from .state import DeviceState, PendingIndex, PlanningState

__all__ = ["DeviceRecord", "FleetTracker", "PendingBook", "RateEstimator"]

logger = logging.getLogger(__name__)

# Weight of the newest sample size in a device's mean-size EWMA.
_SIZE_ALPHA = 0.05
_OVERHEAD_STEPS = 8
"""Steps whose measured overhead outside compute the step-time target takes the least of."""
_OVERHEAD_MIN_STEPS = 4
"""Steps measured before the overhead is used (the first steps also wait for start-up)."""


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


_Samples = tuple[np.ndarray, np.ndarray, np.ndarray]  # offsets (sorted), sizes, arrival seconds


def _no_samples() -> _Samples:
    return np.empty(0, np.int64), np.empty(0), np.empty(0)


def _select(part: _Samples, keep: np.ndarray | slice) -> _Samples:
    return part[0][keep], part[1][keep], part[2][keep]


def _merge(a: _Samples, b: _Samples) -> _Samples:
    """Two offset-sorted sets of samples with no offset in common, as one offset-sorted set."""
    if not len(b[0]):
        return a
    if not len(a[0]) or a[0][-1] < b[0][0]:
        return tuple(np.concatenate((x, y)) for x, y in zip(a, b, strict=True))  # type: ignore[return-value]
    off = np.concatenate((a[0], b[0]))
    order = np.argsort(off, kind="stable")
    return off[order], np.concatenate((a[1], b[1]))[order], np.concatenate((a[2], b[2]))[order]


class PendingBook:
    """One device's pending-sample index, rebuilt from its trainer's feedback and the published plans.

    Kept as offset-sorted numpy arrays (pending, and per plan step what is in flight), so feedback,
    plans and the policies' `index()` cost a few array operations rather than a dict walk per sample.
    """

    def __init__(self) -> None:
        self._pending: _Samples = _no_samples()
        self._inflight: dict[int, _Samples] = {}  # plan step -> the samples it handed out
        self.floor = 0
        self.buffer_depth = 0
        self.reported = False
        self._cache: PendingIndex | None = None  # the last index built; every change drops it

    def _set(self, pending: _Samples) -> None:
        self._pending = pending
        self._cache = None

    def __len__(self) -> int:
        return len(self._pending[0])

    @property
    def inflight(self) -> int:
        """Samples handed to plans whose feedback has not come back yet."""
        return sum(len(v[0]) for v in self._inflight.values())

    @property
    def complete(self) -> bool:
        """True when the index covers the trainer's whole buffer (not after a restart that lost old reports)."""
        return self.reported and len(self) + self.inflight >= self.buffer_depth

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
        extra = len(self) + self.inflight - fb.buffer_depth
        if fb.plan_step != fb.step and extra > 0:
            # A local (fallback) plan trained samples we cannot name; trainers pack oldest first, so
            # forget the oldest rather than plan samples the trainer no longer holds.
            self._set(_select(self._pending, slice(extra, None)))

    def add(self, samples: Iterable[PendingSample], arrival: float) -> None:
        """Add newly buffered samples (those below the floor or already in flight are ignored; a sample
        reported again replaces its earlier report)."""
        pairs = [(s.offset, s.size) for s in samples]
        if not pairs:
            return
        raw = np.array(pairs, dtype=np.int64).reshape(-1, 2)
        off = raw[:, 0]
        keep = off >= self.floor
        if self._inflight:
            keep &= ~np.isin(off, np.concatenate([v[0] for v in self._inflight.values()]))
        off = off[keep]
        if not len(off):
            return
        sizes = np.maximum(raw[keep, 1], 1).astype(np.float64)
        new = (off, sizes, np.full(len(off), float(arrival)))
        pending = self._pending
        if not bool(np.all(off[1:] > off[:-1])) or (len(pending[0]) and bool(np.isin(off, pending[0]).any())):
            # Out of order or reported twice: the latest report of an offset wins (dict semantics).
            both = _merge_all(pending, new)
            self._set(both)
            return
        self._set(_merge(pending, new))

    def advance(self, lowest_unprocessed: int) -> None:
        """Forget everything below the trainer's lowest unprocessed offset (trained, dropped or committed)."""
        if lowest_unprocessed <= self.floor:
            return
        self.floor = lowest_unprocessed
        k = int(np.searchsorted(self._pending[0], lowest_unprocessed, side="left"))
        if k:
            self._set(_select(self._pending, slice(k, None)))
        for step, part in list(self._inflight.items()):
            self._inflight[step] = _select(part, part[0] >= lowest_unprocessed)

    def take(self, step: int, offsets: Iterable[int]) -> None:
        """Mark the offsets a published plan gives this device for `step` as in flight."""
        wanted = np.fromiter(offsets, dtype=np.int64)
        pending = self._pending
        if not len(wanted) or not len(pending[0]):
            return
        pos = np.searchsorted(pending[0], wanted)
        pos = pos[pos < len(pending[0])]
        pos = pos[np.isin(pending[0][pos], wanted)]
        if not len(pos):
            return
        mask = np.zeros(len(pending[0]), dtype=bool)
        mask[pos] = True
        self._set(_select(pending, ~mask))
        self._inflight[step] = _merge(self._inflight.get(step, _no_samples()), _select(pending, mask))

    def truncate(self, before: int) -> int:
        """Drop pending offsets below `before` (a plan's truncate-before); returns how many."""
        k = int(np.searchsorted(self._pending[0], before, side="left"))
        if k:
            self._set(_select(self._pending, slice(k, None)))
        return k

    def _settle(self, step: int, followed: bool) -> None:
        for s in [s for s in self._inflight if s <= step]:
            part = self._inflight.pop(s)
            if s == step and followed:
                continue  # trained
            # The trainer did not run that plan (late, or its feedback for it never came): still pending.
            self._set(_merge(self._pending, _select(part, part[0] >= self.floor)))

    def index(self) -> PendingIndex:
        """The pending samples, oldest first, as policies read them."""
        if self._cache is None:
            self._cache = PendingIndex(*self._pending) if len(self) else PendingIndex.empty()
        return self._cache


def _merge_all(old: _Samples, new: _Samples) -> _Samples:
    """Union by offset where `new` may repeat offsets of `old` or of itself: the last report of each wins."""
    off = np.concatenate((old[0], new[0]))[::-1]
    _, first = np.unique(off, return_index=True)  # first in reversed order = last reported
    pick = len(off) - 1 - first
    return tuple(np.concatenate((x, y))[pick] for x, y in zip(old, new, strict=True))  # type: ignore[return-value]


@dataclass
class DeviceRecord:
    """What the service knows about one device."""

    device_id: str
    tracker: PerfTracker
    rate: RateEstimator
    book: PendingBook = field(default_factory=PendingBook)
    rank: int | None = None
    mean_size: float = 1.0
    sizes_seen: int = 0
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
        self._overhead: dict[int, float] = {}
        self.membership = Membership(config.absent_after_seconds)
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
    def members(self) -> list[str]:
        """Devices of the job, present or not, in rank order.

        Without `devices` configured: those that sent feedback, or, before anyone has, every device
        known from its topic (so a warm-start plan can cover them).
        """
        if self.config.devices:
            return list(self.config.devices)
        seen = [r for r in self.devices.values() if r.last_feedback is not None]
        if not seen:
            return sorted(self.devices)
        return [r.device_id for r in sorted(seen, key=lambda r: (r.rank if r.rank is not None else 1 << 30,
                                                                   r.device_id))]

    @property
    def expected(self) -> list[str]:
        """Devices a step waits for and plans include, in rank order: the present `members` (see `Membership`)."""
        return [d for d in self.members if d not in self.membership.absent]

    def update_membership(self, now: float) -> list[str]:
        """Declare absent the members silent too long while plans went on; returns those newly absent.

        Args:
            now: the monotonic clock `ingest_feedback` was given.
        """
        return self.membership.update(self.members, now)

    def warm_start_step(self) -> int | None:
        """Step 0 while the job has no feedback and no plan yet but its devices and their lag are known.

        The plan for it comes from the warm-start models and each device's lag (no index exists yet), so
        trainers start on a coordinator plan instead of their local fallback. It may be re-published
        (a later plan for a step replaces an earlier one) until the first feedback arrives.
        """
        if self._reports or any(r.last_feedback is not None for r in self.devices.values()):
            return None
        if self.next_plan_step is not None and self.next_plan_step != 1:
            return None  # plans for later steps exist (recovered from Kafka): not a fresh job
        expected = self.expected
        if not expected or any(self.device(d).end_offset is None for d in expected):
            return None
        return 0

    def step_seconds(self, step: int) -> float | None:
        """Wall time of `step` (the slowest device's report), None when no one reported it."""
        return self._step_seconds.get(step)

    def ingest_feedback(self, fb: StepFeedback, received: float) -> bool:
        """Apply one feedback record; True when it counts towards a step not planned for yet.

        Args:
            fb: the record (its job already checked by the caller).
            received: when it arrived, on the monotonic clock the due-step wait uses.
        """
        rec = self.device(fb.device_id)
        late = self.next_plan_step is not None and fb.step + 1 < self.next_plan_step
        if not late or fb.device_id not in self.membership.absent:
            # An absent device is back with a report of a step still to plan; a late one (a node cut off
            # delivering what it had queued) says nothing about its ranks being there now.
            self.membership.heard(fb.device_id, received)
        prev = rec.last_feedback
        if prev is None or fb.step >= prev.step:
            rec.last_feedback = fb
            rec.rank = fb.rank
        rec.tracker = rec.tracker.update(float(fb.total_size), fb.compute_seconds, fb.step, self.config)
        rec.book.ingest(fb, fb.sent_at / 1000.0)
        for s in fb.new_samples:
            if rec.sizes_seen == 0:
                rec.mean_size = float(max(s.size, 1))  # the first size seen replaces the placeholder
            rec.mean_size += _SIZE_ALPHA * (max(s.size, 1) - rec.mean_size)
            rec.sizes_seen += 1
        if late:
            return False  # its step was already planned without it
        self._reports.setdefault(fb.step, set()).add(fb.device_id)
        self._first_report.setdefault(fb.step, received)
        # The step's wall period as the stream sees it: the runner's time plus the waits for the plan
        # and the data (truncate keeps arrivals over this period; step_seconds alone would keep too few).
        in_step = fb.step_seconds + max(0.0, fb.data_wait_seconds)
        period = in_step
        if prev is not None and fb.step == prev.step + 1 and fb.sent_at > prev.sent_at:
            # Between two feedback records the rank may also have checkpointed, committed or idled: the stream
            # arrives through those too.
            period = max(period, (fb.sent_at - prev.sent_at) / 1000.0)
        self._step_seconds[fb.step] = max(self._step_seconds.get(fb.step, 0.0), period)
        if fb.plan_step == fb.step:  # a local fallback's wait is the missing plan's, not a cost of every step
            # The rank that waited least (the step's straggler) spent the rest of its step on fixed costs
            # (occasional checkpoints and idle waits are not per-step costs, so the cycle is not used here).
            outside = max(0.0, in_step - fb.compute_seconds)
            self._overhead[fb.step] = min(self._overhead.get(fb.step, outside), outside)
        return True

    def record_plan(self, plan: Assignment) -> dict[str, int]:
        """Apply a published plan: its offsets go in flight, truncated ones leave the index.

        Returns:
            samples each device's truncation dropped from the index.
        """
        dropped: dict[str, int] = {}
        reporters = self._reports.get(plan.step - 1)
        if reporters:  # a plan after some feedback: whoever it did not wait for was passed over
            self.membership.passed_over({p.device_id for p in plan.devices} - reporters)
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
        for s in [s for s in self._step_seconds if s + 2 < self.next_plan_step]:
            del self._step_seconds[s]  # only the last step's time is ever read
        for s in [s for s in self._overhead if s + _OVERHEAD_STEPS < self.next_plan_step]:
            del self._overhead[s]
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
                             last_step_seconds=self._step_seconds.get(step - 1) or None, carry=carry,
                             step_overhead_seconds=self.step_overhead_seconds())

    def step_overhead_seconds(self) -> float:
        """The least per-step time outside compute (communication, the plan's and the data's round trip) of
        the rank that waited least, over the last steps; 0 before any feedback. A fixed cost is the floor of
        what steps spend: the least, not a median, so start-up waits and hiccups do not read as overhead."""
        if len(self._overhead) < _OVERHEAD_MIN_STEPS:
            return 0.0
        return min(self._overhead.values())
