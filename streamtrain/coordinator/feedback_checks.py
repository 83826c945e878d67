"""What the coordinator checks in a feedback record before it lets the record steer a plan.

Feedback feeds the time model, the pending index and the step period, all of which decide the next
plan. A record no trainer could have sent is rejected with a reason (dead-lettered and counted by the
service) and changes nothing: timings that are not finite, negative or longer than any streaming step
(`coordinator.max_feedback_seconds`); compute or communication longer than the whole step; sample
counts and sizes that contradict each other; a plan step that is neither the step nor -1 (local);
buffered offsets below the reported lowest unprocessed one; a step far ahead of the group's
(`coordinator.feedback_window_steps`). What passes may still be an outlier: the time model's fit is
robust to single wild points (`coordinator.perfmodel`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from streamtrain.config import CoordinatorConfig
from streamtrain.wire import StepFeedback

__all__ = ["FeedbackRejection", "feedback_problem"]

# Float rounding between the rank's clocks: compute and communication are measured inside the step.
_SLACK_SECONDS = 1e-3


@dataclass(frozen=True)
class FeedbackRejection:
    """Why a feedback record is not used: `reason` is the dead-letter reason code (and the metric's label)."""

    reason: str
    detail: str


def feedback_problem(fb: StepFeedback, group_step: int | None, config: CoordinatorConfig,  # noqa: C901  one check per way a feedback record can lie, each a line; split, the order they are tried in would hide
                     now_ms: int) -> FeedbackRejection | None:
    """Why `fb` is not credible, or None.

    Args:
        fb: the decoded record.
        group_step: the step the coordinator plans next (None before it knows: every step is plausible).
        config: `max_feedback_seconds` and `feedback_window_steps`.
        now_ms: the coordinator's wall clock, milliseconds since the epoch (a report from the future is forged).
    """
    timings = {"compute_seconds": fb.compute_seconds, "data_wait_seconds": fb.data_wait_seconds,
               "comm_seconds": fb.comm_seconds, "step_seconds": fb.step_seconds}
    for name, value in timings.items():
        if not math.isfinite(value):
            return FeedbackRejection("feedback-non-finite", f"{name} is {value}")
        if value < 0:
            return FeedbackRejection("feedback-negative", f"{name} is {value}")
        if value > config.max_feedback_seconds:
            return FeedbackRejection("feedback-impossible", f"{name} {value:g} s is longer than any step "
                                     f"(coordinator.max_feedback_seconds={config.max_feedback_seconds:g})")
    counts = {"step": fb.step, "rank": fb.rank, "samples": fb.samples, "total_size": fb.total_size,
              "memory_bytes": fb.memory_bytes, "lowest_unprocessed_offset": fb.lowest_unprocessed_offset,
              "buffer_depth": fb.buffer_depth, "dropped": fb.dropped}
    for name, count in counts.items():
        if count < 0:
            return FeedbackRejection("feedback-negative", f"{name} is {count}")
    limit = fb.step_seconds + _SLACK_SECONDS
    if fb.compute_seconds > limit or fb.comm_seconds > limit:
        return FeedbackRejection("feedback-impossible", f"compute {fb.compute_seconds:g} s / communication "
                                 f"{fb.comm_seconds:g} s exceed the whole step's {fb.step_seconds:g} s")
    if fb.total_size < fb.samples or (fb.samples == 0 and fb.total_size > 0):
        return FeedbackRejection("feedback-impossible", f"{fb.samples} samples of total size {fb.total_size} "
                                 "(every sample has size >= 1)")
    if fb.plan_step not in (-1, fb.step):
        return FeedbackRejection("feedback-impossible", f"plan_step {fb.plan_step} is neither the step "
                                 f"({fb.step}) nor -1 (a local plan)")
    if any(p.size < 1 or p.offset < fb.lowest_unprocessed_offset for p in fb.new_samples):
        return FeedbackRejection("feedback-impossible", "a newly buffered sample has size < 1 or an offset below "
                                 f"the lowest unprocessed one ({fb.lowest_unprocessed_offset})")
    if fb.sent_at > now_ms + config.max_feedback_seconds * 1000:
        return FeedbackRejection("feedback-impossible", f"sent_at {fb.sent_at} is in the future")
    window = config.feedback_window_steps
    if group_step is not None and fb.step > group_step + window:
        return FeedbackRejection("feedback-step-window", f"step {fb.step} is more than {window} steps ahead of the "
                                 f"group's {group_step} (coordinator.feedback_window_steps)")
    return None
