"""The fleet as the live service reconstructs it from Kafka: pure bookkeeping, no clients.

Everything here is fed records (feedback, published plans, watermark observations) and answers
with a `PlanningState`, so the same code rebuilds state on restart (replaying recent feedback and
assignments) and runs live, and unit tests drive it by hand.

A device's pending index is its `PendingBook` (`coordinator.pending`). With `coordinator.plan_ahead`
= 1 the plan for step s+1 is due once step s-1's feedback is in, while step s runs: the index then
holds what was reported through s-1 less plan s's samples (in flight or claimed), which is the
predicted state plan s+1 is made from. A plan ahead that would train nothing waits for step s's
feedback instead (`FleetTracker.defer`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from streamtrain.config import CoordinatorConfig
from streamtrain.wire import Assignment, DeviceProfile, StepFeedback

from .membership import Membership
from .pending import PendingBook
from .perfmodel import PerfModel, PerfTracker
from .state import DeviceState, PlanningState, after_batch

__all__ = ["DeviceRecord", "DueStep", "FleetTracker", "PendingBook", "RateEstimator"]

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
    round_trip: float = 0.0
    """The rank's latest measure of the time from its feedback to a plan made from it (0: none yet)."""
    profile: DeviceProfile | None = None
    """The rank's start-up profile, when one came before its first feedback (`FleetTracker.ingest_profile`)."""
    profile_ratio: float | None = None
    """Compute seconds of the first step it trained over what its profile predicted for that batch."""

    @property
    def model(self) -> PerfModel:
        """The time model plans use (`model_scaled`), the profile's line as the rank measured it."""
        return self.model_scaled(1.0)

    def model_scaled(self, profile_scale: float) -> PerfModel:
        """The time model plans use: the fitted one once there is feedback; before it, the start-up profile's line
        times `profile_scale` (a measurement: planned from as a fitted model is, up to `max_batch_growth` times its
        largest batch), else the warm start."""
        model = self.tracker.model
        p = self.profile
        if model.fitted or p is None:
            return model
        return PerfModel(p.slope * profile_scale, p.intercept * profile_scale, n_obs=len(p.sizes), fitted=True,
                         largest=float(max(p.sizes, default=0)) or None)

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


class DueStep(NamedTuple):
    """A plan that is due: its step, whether every expected device reported `basis`, and the basis: the step
    whose feedback made it due (what a rank's reports up to it told, the plan may name)."""

    step: int
    complete: bool
    basis: int


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
        self._deferred: tuple[int, int] | None = None  # (step, basis) of a plan ahead left unmade
        self._first_profile: float | None = None
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
        if self.next_plan_step is not None and self.next_plan_step > 1 + self.config.plan_ahead:
            return None  # plans for later steps exist (recovered from Kafka): not a fresh job
        expected = self.expected
        if not expected or any(self.device(d).end_offset is None for d in expected):
            return None
        return 0

    def ingest_profile(self, profile: DeviceProfile, received: float) -> bool:
        """Adopt a device's start-up profile as its time model until feedback comes; False (ignored) once the device
        has reported a step, or when `coordinator.use_profiles` is off.

        Only step 0 is planned from it: the first feedback rescales the warm start as before (a profile times the
        model alone, without the optimizer step and the collectives, so its fixed cost is low; it is not kept as
        the prior the fit leans towards).

        Args:
            profile: the record (its job and credibility already checked by the caller).
            received: when it arrived, on the monotonic clock `profiles_settled` is given.
        """
        rec = self.device(profile.device_id)
        if not self.config.use_profiles or rec.last_feedback is not None or rec.tracker.model.fitted:
            return False
        rec.profile = profile
        if rec.sizes_seen == 0:
            rec.mean_size = max(profile.mean_sample_size, 1.0)  # until the feedback reports the first real sizes
        if self._first_profile is None:
            self._first_profile = received
        return True

    def profile_scale(self) -> float:
        """How much longer steps take than the start-up profiles say: the median over the profiled devices that trained
        a step of its compute over what the profile predicted (1 before any). A profile times forward and backward
        alone, a step adds the optimizer, the gradient hooks, the metrics: a device still without feedback (it sat
        the first steps out) is planned from its profile times this, not from a line its peers' steps proved short."""
        ratios = [r.profile_ratio for r in self.devices.values() if r.profile_ratio is not None]
        return float(np.median(ratios)) if ratios else 1.0

    def profiles_settled(self, now: float) -> frozenset[str] | None:
        """The expected devices whose start-up profile step 0 is planned from; None while waiting for more.

        Empty before any profile arrives (step 0 is planned from the warm start). Once one has, the others are
        waited for at most `coordinator.profile_wait_seconds`; a device whose profile has not come by then keeps
        the warm start.

        Args:
            now: the monotonic clock `ingest_profile` was given.
        """
        expected = self.expected
        profiled = frozenset(d for d in expected if self.device(d).profile is not None)
        if not profiled or len(profiled) == len(expected):
            return profiled
        assert self._first_profile is not None
        return profiled if now - self._first_profile >= self.config.profile_wait_seconds else None

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
        late = self.next_plan_step is not None and fb.step + 1 + self.config.plan_ahead < self.next_plan_step
        if not late or fb.device_id not in self.membership.absent:
            # An absent device is back with a report of a step still to plan; a late one (a node cut off
            # delivering what it had queued) says nothing about its ranks being there now.
            self.membership.heard(fb.device_id, received)
        prev = rec.last_feedback
        if prev is None or fb.step >= prev.step:
            rec.last_feedback = fb
            rec.rank = fb.rank
            rec.round_trip = fb.plan_round_trip_seconds
        rec.tracker = rec.tracker.update(float(fb.total_size), fb.compute_seconds, fb.step, self.config)
        p = rec.profile
        if p is not None and rec.profile_ratio is None and fb.total_size > 0 and fb.compute_seconds > 0:
            rec.profile_ratio = fb.compute_seconds / max(p.slope * fb.total_size + p.intercept, 1e-9)
        rec.book.ingest(fb, fb.sent_at / 1000.0)
        for s in fb.new_samples:
            if rec.sizes_seen == 0:
                rec.mean_size = float(max(s.size, 1))  # the first size seen replaces the placeholder
            rec.mean_size += _SIZE_ALPHA * (max(s.size, 1) - rec.mean_size)
            rec.sizes_seen += 1
        if late:
            return False  # late: the plan its step was due for was already published without it
        self._reports.setdefault(fb.step, set()).add(fb.device_id)
        self._first_report.setdefault(fb.step, received)
        # The step's wall period as the stream sees it: the runner's time plus the waits for the plan
        # and the data (truncate keeps arrivals over this period; step_seconds alone would keep too few).
        in_step = fb.step_seconds + max(0.0, fb.wait_seconds)
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
        reporters = self._reports.get(plan.seen_through)  # the step whose feedback the plan was made from
        if reporters:  # a plan after some feedback: whoever it did not wait for was passed over
            self.membership.passed_over({p.device_id for p in plan.devices} - reporters)
        for part in plan.devices:
            rec = self.device(part.device_id)
            rec.book.take(plan.step, part.offsets, part.count, part.size_budget)
            if part.truncate_before is not None:
                dropped[part.device_id] = rec.book.truncate(part.truncate_before)
                rec.delete_before = max(rec.delete_before, part.truncate_before)
        if self.next_plan_step is None or plan.step + 1 > self.next_plan_step:
            self.next_plan_step = plan.step + 1
        self._deferred = None
        ahead = self.config.plan_ahead
        for s in [s for s in self._reports if s + 1 + ahead < self.next_plan_step]:
            self._reports.pop(s)
            self._first_report.pop(s, None)
        for rec in self.devices.values():  # the steps whose feedback is in (or was waited for) settled theirs
            rec.book.drop_claims_before(self.next_plan_step - 2 - ahead)
        for s in [s for s in self._step_seconds if s + 2 + ahead < self.next_plan_step]:
            del self._step_seconds[s]  # only the latest measured step's time is ever read
        for s in [s for s in self._overhead if s + _OVERHEAD_STEPS < self.next_plan_step]:
            del self._overhead[s]
        return dropped

    def replay(self, plans: Sequence[Assignment], feedback: Sequence[StepFeedback], received: float) -> None:
        """Rebuild from records read back from Kafka: each plan right after the feedback it was made from.

        A plan's basis (`Assignment.seen_through`: step s-1 for step s, s-2 when made one step ahead) says which
        feedback it saw, so replaying it there finds its offsets pending, as they were when it was published.

        Args:
            plans: this job's plans, in the order they were published.
            feedback: this job's feedback, in the order it was sent.
            received: the monotonic time to apply the feedback at.
        """
        events: list[tuple[int, int, int, Assignment | StepFeedback]] = [
            (fb.step, 0, i, fb) for i, fb in enumerate(feedback)]
        events += [(p.seen_through, 1, i, p) for i, p in enumerate(plans)]
        for _s, _kind, _i, record in sorted(events, key=lambda e: e[:3]):
            if isinstance(record, Assignment):
                self.record_plan(record)
            else:
                self.ingest_feedback(record, received)

    def observe_offsets(self, device_id: str, log_start: int, end: int, committed: int | None, at: float) -> None:
        """Record a device topic's watermarks and the trainers' committed offset seen at time `at`."""
        rec = self.device(device_id)
        rec.log_start, rec.end_offset = log_start, end
        if committed is not None and committed >= 0:
            rec.committed = committed
        rec.rate.observe(end, at)

    def due_step(self, now: float) -> DueStep | None:
        """The step to plan now, or None when none is due.

        Step s's feedback (all of it, or what came within `feedback_wait_seconds` of the first) makes the plans up
        to step s + 1 + `plan_ahead` due, with s as their basis. They are returned one at a time, lowest first:
        publishing one (`record_plan`) makes the next due. So the plan for s+1 comes first when it is missing
        (at start-up without a warm start, or after an outage), then the one ahead.

        Args:
            now: the monotonic clock `ingest_feedback` was given.
        """
        ahead = self.config.plan_ahead
        nxt = self.next_plan_step
        expected = set(self.expected)
        # The newest reported step that is complete, or whose wait is over, is the freshest basis: a rank's
        # report for the next step may come in before another rank's for this one.
        for s in sorted((s for s in self._reports if nxt is None or s + 1 + ahead >= nxt), reverse=True):
            complete = expected <= self._reports[s]
            if complete or now - self._first_report[s] >= self.config.feedback_wait_seconds:
                due = DueStep(s + 1 if nxt is None else max(nxt, s + 1), complete, s)
                if (due.step, due.basis) == self._deferred:
                    return None  # not worth making from this basis: the next feedback makes it due again
                return due
        return None

    def defer(self, step: int, basis: int) -> None:
        """Leave the plan for `step`, due ahead of its basis step, unmade until feedback newer than the basis is
        in (`Plan.worth_ahead`): `due_step` does not return it again from the same basis."""
        if step <= basis + 1:
            raise ValueError(f"only a plan made ahead can wait: step {step} is next after its basis {basis}")
        self._deferred = (step, basis)

    def reporters(self, step: int) -> set[str]:
        """Devices whose feedback for `step` arrived before it was planned past."""
        return set(self._reports.get(step, ()))

    def planning_state(self, step: int, now: float, carry: object = None) -> PlanningState:
        """The policies' input for `step`, at wall-clock time `now` (seconds, the arrivals' clock)."""
        states = []
        scale = self.profile_scale()
        for device_id in self.expected:
            rec = self.device(device_id)
            fb = rec.last_feedback
            pending = rec.book.index() if rec.book.complete else None
            state = DeviceState(
                device_id=device_id, model=rec.model_scaled(scale), pending=pending, arrival_rate=rec.rate.rate,
                mean_size=max(rec.mean_size, 1e-9), lag=max(0, rec.lag - rec.book.inflight),
                end_offset=rec.end_offset, last_samples=fb.samples if fb else 0,
                last_size=float(fb.total_size) if fb else 0.0, last_seconds=fb.compute_seconds if fb else None,
            )
            for count, budget in rec.book.budget_claims():  # plans still to run that take the oldest samples
                state = after_batch(state, None, count=count, size_budget=budget)
            states.append(state)
        measured = [s for s in self._step_seconds if s < step]
        last = self._step_seconds[max(measured)] if measured else None
        # The group steps when every rank has the plan: the slowest rank's round trip is the group's.
        trip = max((self.device(d).round_trip for d in self.expected), default=0.0) if self.config.plan_ahead else 0.0
        return PlanningState(step=step, now=now, devices=tuple(states), last_step_seconds=last or None, carry=carry,
                             step_overhead_seconds=self.step_overhead_seconds(), plan_round_trip_seconds=trip)

    def step_overhead_seconds(self) -> float:
        """The least per-step time outside compute (communication, the plan's and the data's round trip) of
        the rank that waited least, over the last steps; 0 before any feedback. A fixed cost is the floor of
        what steps spend: the least, not a median, so start-up waits and hiccups do not read as overhead."""
        if len(self._overhead) < _OVERHEAD_MIN_STEPS:
            return 0.0
        return min(self._overhead.values())
