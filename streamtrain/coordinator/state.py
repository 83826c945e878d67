"""What every planning policy reads (the fleet's state) and writes (a plan), as explicit frozen records.

Policies are pure functions `(PlanningState, CoordinatorConfig) -> Plan`; the live service, the
simulator and the tests build these records and call the same functions. A policy that needs to
remember something between steps (lbb) reads `PlanningState.carry` and returns `Plan.carry`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from streamtrain.wire.records import Assignment, DevicePlan, now_ms

from .perfmodel import PerfModel

__all__ = ["DeviceBatch", "DeviceState", "PendingIndex", "Plan", "PlanningState", "after_batch", "after_plan",
           "oldest_within", "plan_to_assignment"]

logger = logging.getLogger(__name__)


def _frozen_array(values: Any, dtype: type) -> np.ndarray:
    arr: np.ndarray = np.array(values, dtype=dtype).reshape(-1)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class PendingIndex:
    """A device's buffered, not yet trained samples, oldest (lowest offset) first.

    Attributes:
        offsets: Kafka offsets, strictly increasing.
        sizes: each sample's size (frames, tokens, bytes ...), > 0.
        arrivals: when each sample arrived, in seconds on the same clock as `PlanningState.now`.
    """

    offsets: np.ndarray
    sizes: np.ndarray
    arrivals: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "offsets", _frozen_array(self.offsets, np.int64))
        object.__setattr__(self, "sizes", _frozen_array(self.sizes, np.float64))
        object.__setattr__(self, "arrivals", _frozen_array(self.arrivals, np.float64))
        n = len(self.offsets)
        if len(self.sizes) != n or len(self.arrivals) != n:
            raise ValueError(f"pending index arrays differ in length: {n}, {len(self.sizes)}, {len(self.arrivals)}")
        if n > 1 and not bool(np.all(np.diff(self.offsets) > 0)):
            raise ValueError("pending offsets must be strictly increasing (oldest first)")

    @classmethod
    def empty(cls) -> PendingIndex:
        return cls(np.empty(0, np.int64), np.empty(0), np.empty(0))

    def __len__(self) -> int:
        return len(self.offsets)

    def from_offset(self, first: int) -> PendingIndex:
        """The samples at or above offset `first` (what is left after truncating below it)."""
        k = int(np.searchsorted(self.offsets, first, side="left"))
        return PendingIndex(self.offsets[k:], self.sizes[k:], self.arrivals[k:])


@dataclass(frozen=True, eq=False)
class DeviceState:
    """Everything a policy knows about one device (one trainer rank, one device topic).

    Attributes:
        device_id: the device's name (its topic is <prefix>.device.<id>).
        model: predicted compute seconds for a batch of a given total size.
        pending: the buffered samples, or None while the coordinator has no index for this device
            (then plans give a count and size budget instead of offsets).
        arrival_rate: samples per second arriving on the device's topic.
        mean_size: mean size of recent samples (used when counting samples rather than packing them).
        lag: records not yet trained (high watermark - lowest unprocessed offset).
        end_offset: the topic's high watermark (next offset to be produced), when known.
        size_limit: largest batch total size the device's memory holds, None when unbounded.
        speed: an outside speed estimate in samples/s (e.g. a profiler's); None derives it from `model`.
        last_samples: samples trained in the last completed step (0 when none yet).
        last_size: their total size.
        last_seconds: compute seconds of the last completed step, None before the first.
    """

    device_id: str
    model: PerfModel
    pending: PendingIndex | None = None
    arrival_rate: float = 0.0
    mean_size: float = 1.0
    lag: int = 0
    end_offset: int | None = None
    size_limit: float | None = None
    speed: float | None = None
    last_samples: int = 0
    last_size: float = 0.0
    last_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.arrival_rate < 0 or not np.isfinite(self.arrival_rate):
            raise ValueError(f"device {self.device_id}: arrival_rate {self.arrival_rate} must be finite and >= 0")
        if self.mean_size <= 0:
            raise ValueError(f"device {self.device_id}: mean_size {self.mean_size} must be > 0")
        if self.size_limit is not None and self.size_limit <= 0:
            raise ValueError(f"device {self.device_id}: size_limit {self.size_limit} must be > 0")

    @property
    def pending_count(self) -> int:
        """Samples this device could train now (its index length, else its lag)."""
        return len(self.pending) if self.pending is not None else self.lag


@dataclass(frozen=True, eq=False)
class PlanningState:
    """The fleet at a step boundary: the input of every policy.

    Attributes:
        step: the step being planned.
        now: current time in seconds (same clock as pending arrivals).
        devices: one entry per device, in rank order.
        last_step_seconds: wall time of the last completed step, None before the first.
        carry: what the policy returned in `Plan.carry` last step (None at the start).
        step_overhead_seconds: the part of a step's wall period spent outside compute by the rank
            that waited least (exposed communication, the plan's and the data's round trip): a fixed
            cost of every step, measured (the least over recent steps); 0 before it is known.
        plan_round_trip_seconds: with plans made a step ahead, the time from a rank sending a step's
            feedback to receiving the plan made from it, measured by the ranks (0: unknown, or plans
            not made ahead). A step shorter than that waits for its next plan: a floor of the period.
    """

    step: int
    now: float
    devices: tuple[DeviceState, ...]
    last_step_seconds: float | None = None
    carry: Any = None
    step_overhead_seconds: float = 0.0
    plan_round_trip_seconds: float = 0.0

    def __post_init__(self) -> None:
        ids = [d.device_id for d in self.devices]
        if len(set(ids)) != len(ids):
            raise ValueError("device ids in a planning state must be unique")

    def with_devices(self, devices: tuple[DeviceState, ...]) -> PlanningState:
        return replace(self, devices=devices)


@dataclass(frozen=True, eq=False)
class DeviceBatch:
    """One device's part of a plan.

    Attributes:
        device_id: the device.
        offsets: the samples to train, or None when the device's pending index is unknown.
        count: samples to train (len(offsets) when offsets are given).
        total_size: their total size (a budget when offsets are None).
        predicted_seconds: the model's compute time for this batch.
        weight: aggregation weight; the weights of a plan sum to 1 (or are all 0).
        truncate_before: drop every pending offset below this one, None to keep all.
        dropped: samples that truncation drops.
    """

    device_id: str
    offsets: np.ndarray | None
    count: int
    total_size: float
    predicted_seconds: float
    weight: float = 0.0
    truncate_before: int | None = None
    dropped: int = 0


@dataclass(frozen=True, eq=False)
class Plan:
    """A policy's answer for one step."""

    policy: str
    step: int
    step_time_target: float
    lr_scale: float
    devices: tuple[DeviceBatch, ...]
    carry: Any = None
    notes: dict[str, float] = field(default_factory=dict)

    @property
    def global_batch(self) -> int:
        return sum(d.count for d in self.devices)

    @property
    def predicted_step_seconds(self) -> float:
        return max((d.predicted_seconds for d in self.devices), default=0.0)

    @property
    def worth_ahead(self) -> bool:
        """Whether this plan, made a step ahead from predicted state (`after_plan`), is worth publishing.

        One that trains nothing on any device is not: the group drained everything the plans could see,
        which at line rate is every step (the ranks hold each report until the target, `streamtrain.pacing`,
        and the plan before took what that report brought). Published, it runs an empty group step between
        every two steps that train. Left unmade, the next step is planned from the feedback of the step
        before it, which brings what arrived during the hold. The live coordinator and the simulator both
        follow this rule.
        """
        return self.global_batch > 0


def oldest_within(sizes: np.ndarray, count: int | None, size_budget: float | None) -> int:
    """How many of the oldest samples (`sizes`, oldest first) a part of a plan without offsets trains.

    The trainer's rule: at most `count` (None: no bound) while their total stays within `size_budget` (None: no
    bound), and the oldest one even when it alone is larger, so a large sample cannot starve at the head.
    """
    n = len(sizes) if count is None else min(len(sizes), max(count, 0))
    if size_budget is None or n == 0:
        return n
    if size_budget <= 0:
        return 0
    return max(int(np.searchsorted(np.cumsum(sizes[:n]), size_budget, side="right")), 1)


def after_batch(device: DeviceState, offsets: np.ndarray | None, *, count: int | None = None,
                size_budget: float | None = None, truncate_before: int | None = None) -> DeviceState:
    """The device as a later plan must see it while a plan that has not run yet holds its part.

    Args:
        device: the device now.
        offsets: the samples that part names; None for a part without offsets, which takes the oldest
            samples within `count` and `size_budget` (`oldest_within`).
        count: sample bound of a part without offsets.
        size_budget: total-size bound of a part without offsets.
        truncate_before: the part's truncation: pending samples below it are dropped first.

    Returns:
        the device without what that part truncates and takes; without an index, only its lag shrinks.
    """
    pending, lag = device.pending, device.lag
    if pending is None:
        if truncate_before is not None and device.end_offset is not None:
            lag = min(lag, max(0, device.end_offset - truncate_before))
        if offsets is not None:
            taken = len(offsets)
        elif count is not None:
            taken = count
        elif size_budget is not None:
            taken = max(1, int(size_budget // device.mean_size)) if size_budget > 0 else 0
        else:
            taken = lag
        return replace(device, lag=max(0, lag - taken))
    before = len(pending)
    if truncate_before is not None:
        pending = pending.from_offset(truncate_before)
    if offsets is not None:
        keep = ~np.isin(pending.offsets, offsets)
        pending = PendingIndex(pending.offsets[keep], pending.sizes[keep], pending.arrivals[keep])
    else:
        k = oldest_within(pending.sizes, count, size_budget)
        pending = PendingIndex(pending.offsets[k:], pending.sizes[k:], pending.arrivals[k:])
    return replace(device, pending=pending, lag=max(0, lag - (before - len(pending))))


def after_plan(state: PlanningState, plan: Plan) -> PlanningState:
    """The state the plan for the step after `plan` is made from, while `plan` has not run yet.

    `plan`'s samples are taken and its truncation applied; the time models, rates and the last step's
    timings stay those of `state` (the results of `plan`'s step are not known yet: they correct the plan
    after this one). The live service gets the same state from its pending book, where a published plan's
    offsets are in flight and its budget is claimed from the oldest pending samples.
    """
    parts = {b.device_id: b for b in plan.devices}
    devices = []
    for d in state.devices:
        b = parts.get(d.device_id)
        if b is None:
            devices.append(d)
            continue
        budget = None if b.offsets is not None else float(np.ceil(b.total_size))
        devices.append(after_batch(d, b.offsets, count=None if b.offsets is not None else b.count,
                                   size_budget=budget, truncate_before=b.truncate_before))
    return replace(state, step=plan.step + 1, devices=tuple(devices), carry=plan.carry)


def plan_to_assignment(plan: Plan, job: str, created_at: int | None = None,
                       basis_step: int | None = None) -> Assignment:
    """The wire record of a plan (what the coordinator publishes on the assignments topic).

    Args:
        plan: the plan.
        job: the training job.
        created_at: creation time in ms since the epoch; default now.
        basis_step: the last step whose feedback the plan was made from (None: the step before it).
    """
    devices = tuple(
        DevicePlan(
            device_id=d.device_id,
            predicted_seconds=float(d.predicted_seconds),
            weight=float(d.weight),
            offsets=() if d.offsets is None else tuple(int(o) for o in d.offsets),
            # With an index the offsets say it all; without one the trainer takes a count and a budget.
            count=None if d.offsets is not None else int(d.count),
            size_budget=None if d.offsets is not None else int(np.ceil(d.total_size)),
            truncate_before=None if d.truncate_before is None else int(d.truncate_before),
        )
        for d in plan.devices
    )
    return Assignment(
        job=job,
        step=plan.step,
        policy=plan.policy,
        step_time_target=float(plan.step_time_target),
        global_batch=plan.global_batch,
        lr_scale=float(plan.lr_scale),
        devices=devices,
        created_at=now_ms() if created_at is None else created_at,
        basis_step=basis_step,
    )
