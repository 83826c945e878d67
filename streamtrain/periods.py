"""Where a step's wall period goes: the split the run report, the coordinator's metrics and the benchmarks share.

A step's wall period is the time between the group's reports of consecutive steps. The ranks meet in
every step's collectives, so the period follows its critical path: the slowest rank's compute, the
communication it still waited for (exposed communication: what overlapping with backward did not
hide), and, before the step, its wait for the plan and then for the plan's samples; after the step,
the report hold (line rate). What is left (committing offsets, checkpoints, sending the feedback,
scheduling) is `other`. Every part is read from the rank with the largest compute time, whose waits
are on the critical path: a rank that waited longer for its data makes the slowest one wait in the
all-reduce, which shows as its communication.
"""

from __future__ import annotations

from collections.abc import Sequence

from streamtrain.wire import StepFeedback

__all__ = ["WALL_PARTS", "split_wall_period"]

#: The parts of a step's wall period, in the order they are reported and stacked.
WALL_PARTS: tuple[str, ...] = ("compute", "communication", "plan_wait", "data_wait", "hold", "other")


def split_wall_period(records: Sequence[StepFeedback], period: float | None = None) -> dict[str, float]:
    """The split of one step's wall period, in seconds.

    Args:
        records: the step's feedback, one record per rank (at least one).
        period: the step's wall period when known; `other` is what the parts leave of it (0 without one).

    Returns:
        seconds per part of `WALL_PARTS`.
    """
    if not records:
        raise ValueError("a step's wall period is split from at least one rank's feedback")
    slowest = max(records, key=lambda fb: fb.compute_seconds)
    parts = {
        "compute": slowest.compute_seconds,
        "communication": slowest.comm_seconds,
        "plan_wait": slowest.plan_wait_seconds,
        "data_wait": slowest.data_wait_seconds,
        "hold": slowest.hold_seconds,
    }
    parts = {k: max(0.0, v) for k, v in parts.items()}
    parts["other"] = max(0.0, period - sum(parts.values())) if period is not None else 0.0
    return parts
