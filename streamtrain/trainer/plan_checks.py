"""What a rank checks in a plan before obeying it.

A plan is an order to drop data (truncate-before) and to train named offsets, read from a topic other
clients may write (ACLs keep them out; these checks hold even when they do not). A plan no coordinator
following the configured truncation policy could have made is rejected: the rank dead-letters it with
the reason, counts and logs it, and runs its local fallback plan for that step instead, so its group's
collectives still line up. Two kinds of check:

- the plan as a whole, once, when it arrives (`plan_problem`): its step within `trainer.plan_window_steps`
  of the rank's, and every number in it finite and not negative. Every rank reads the same plan and
  decides the same, so a forged plan is refused by the whole group;
- the rank's own part, when its step runs (`PartCheck`): a truncation the policy would never ask for
  (any under `persist`; one beyond the topic's high watermark less what `truncate` or `bounded` always
  keep), or offsets past the topic's end. Only that rank falls back; the others keep their parts of the
  same plan (the plan is per device, and weights are each rank's own sample counts).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from streamtrain.config import CoordinatorConfig
from streamtrain.wire import Assignment, DevicePlan

__all__ = ["PartCheck", "PlanRejection", "kept_by_truncation", "plan_problem"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlanRejection:
    """Why a plan is not obeyed: `reason` is the dead-letter reason code (and the metric's label)."""

    reason: str
    detail: str


def _bad_numbers(values: Iterable[tuple[str, float | int | None]]) -> PlanRejection | None:
    for name, value in values:
        if value is None:
            continue
        if not math.isfinite(value):
            return PlanRejection("plan-non-finite", f"{name} is {value}")
        if value < 0:
            return PlanRejection("plan-negative", f"{name} is {value}")
    return None


def plan_problem(plan: Assignment, current_step: int, window: int) -> PlanRejection | None:
    """What is wrong with a plan as a whole, or None; the same answer on every rank.

    Args:
        plan: the plan as it arrived.
        current_step: the step the rank is at (all ranks of a group run the same steps).
        window: how far ahead of `current_step` a plan may be (`trainer.plan_window_steps`).
    """
    if plan.step > current_step + window:
        return PlanRejection("plan-step-window", f"plan for step {plan.step} is more than {window} steps ahead of "
                             f"the group's step {current_step} (trainer.plan_window_steps)")
    numbers: list[tuple[str, float | int | None]] = [
        ("step", plan.step), ("step_time_target", plan.step_time_target), ("lr_scale", plan.lr_scale),
        ("global_batch", plan.global_batch)]
    for part in plan.devices:
        where = f"device {part.device_id}'s"
        numbers += [(f"{where} weight", part.weight), (f"{where} predicted_seconds", part.predicted_seconds),
                    (f"{where} count", part.count), (f"{where} size_budget", part.size_budget),
                    (f"{where} truncate_before", part.truncate_before)]
        if part.offsets:
            numbers.append((f"{where} lowest offset", min(part.offsets)))
    found = _bad_numbers(numbers)
    if found is not None:
        return PlanRejection(found.reason, f"plan for step {plan.step}: {found.detail}")
    return None


def kept_by_truncation(config: CoordinatorConfig) -> int | None:
    """The fewest newest records the configured truncation policy always keeps; None when it truncates nothing.

    `truncate` keeps at least one step's arrivals (at least one record); `bounded` with only a sample limit
    keeps that many, and with an age or size limit may drop everything.
    """
    if config.truncation == "persist":
        return None
    if config.truncation == "truncate":
        return 1
    if config.max_lag_seconds is None and config.max_lag_size is None and config.max_lag_samples is not None:
        return config.max_lag_samples
    return 0


class PartCheck:
    """Checks one device's part of each plan against the truncation policy and its topic's end.

    Args:
        device_id: the rank's device.
        coordinator: the coordinator's settings this job runs with (its truncation policy and limits).
        high_watermark: the device topic's end offset; `fresh=True` asks the broker, otherwise a cached value
            may be given (a plan is only rejected once the fresh one confirms it).
        wait_for: waits (bounded: the rank's data wait) until the topic holds a given offset. A plan may name
            records the rank has not fetched yet; before calling them missing, the rank gives them the time it
            would give any planned record to arrive.
    """

    def __init__(self, device_id: str, coordinator: CoordinatorConfig, high_watermark: Callable[[bool], int],
                 wait_for: Callable[[int], object] | None = None) -> None:
        self.device_id = device_id
        self.policy = coordinator.truncation
        self.keep = kept_by_truncation(coordinator)
        self.high_watermark = high_watermark
        self.wait_for = wait_for

    def problem(self, plan: Assignment) -> PlanRejection | None:
        """What is wrong with this device's part of `plan`, or None (a device left out has nothing to check)."""
        part = plan.for_device(self.device_id)
        if part is None:
            return None
        if part.truncate_before is not None and self.keep is None:
            return PlanRejection("plan-truncation", f"plan for step {plan.step} truncates device {self.device_id} "
                                 f"below offset {part.truncate_before}, but coordinator.truncation is persist")
        found = self._against_end(plan.step, part, self.high_watermark(False))
        if found is not None:  # the cached end may be stale: ask the broker before refusing
            found = self._against_end(plan.step, part, self.high_watermark(True))
        if found is not None and found.reason == "plan-offsets" and self.wait_for is not None:
            self.wait_for(max(part.offsets))  # records on their way are not missing ones
            found = self._against_end(plan.step, part, self.high_watermark(True))
        return found

    def _against_end(self, step: int, part: DevicePlan, end: int) -> PlanRejection | None:
        if part.truncate_before is not None and self.keep is not None and part.truncate_before > end - self.keep:
            return PlanRejection("plan-truncation", f"plan for step {step} truncates device {self.device_id} below "
                                 f"offset {part.truncate_before}, beyond what {self.policy} could drop: the topic "
                                 f"ends at {end} and {self.policy} keeps at least its newest {self.keep}")
        if part.offsets and max(part.offsets) >= end:
            return PlanRejection("plan-offsets", f"plan for step {step} names offset {max(part.offsets)} of device "
                                 f"{self.device_id}, past the end of its topic ({end})")
        return None
