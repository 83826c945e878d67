"""The coordinator's checks on feedback: what no trainer could report is rejected with its reason."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from fuzzing import forged_feedback

from streamtrain.config import CoordinatorConfig
from streamtrain.coordinator.feedback_checks import feedback_problem
from streamtrain.wire import PendingSample, StepFeedback, decode, now_ms

CFG = CoordinatorConfig()


def _fb(**changes: object) -> StepFeedback:
    fb = StepFeedback(job="job", step=40, device_id="d0", rank=0, plan_step=40, samples=6, total_size=180,
                      compute_seconds=0.08, data_wait_seconds=0.01, comm_seconds=0.004, step_seconds=0.09,
                      memory_bytes=1 << 26, lowest_unprocessed_offset=500, buffer_depth=12,
                      new_samples=(PendingSample(505, 30), PendingSample(506, 31)), sent_at=now_ms())
    if "step" in changes and "plan_step" not in changes:
        changes["plan_step"] = changes["step"]  # the plan of its own step
    return replace(fb, **changes)


@pytest.mark.parametrize("fb", [
    _fb(),
    _fb(plan_step=-1),  # a local plan
    _fb(samples=0, total_size=0, compute_seconds=0.0, loss=None),  # an empty step
    _fb(compute_seconds=0.09),  # compute is the whole step
    _fb(step=41 + 999),  # at the window's edge
    _fb(loss=math.nan),  # the model's business, not the time model's
])
def test_feedback_a_rank_sends_passes(fb: StepFeedback) -> None:
    assert feedback_problem(fb, group_step=41, config=CFG, now_ms=now_ms()) is None


@pytest.mark.parametrize(("fb", "reason", "words"), [
    (_fb(compute_seconds=math.nan), "feedback-non-finite", "compute_seconds is nan"),
    (_fb(step_seconds=math.inf), "feedback-non-finite", "step_seconds is inf"),
    (_fb(comm_seconds=-0.5), "feedback-negative", "comm_seconds is -0.5"),
    (_fb(samples=-1), "feedback-negative", "samples is -1"),
    (_fb(buffer_depth=-3), "feedback-negative", "buffer_depth"),
    (_fb(compute_seconds=2.0), "feedback-impossible", "exceed the whole step"),
    (_fb(comm_seconds=0.5), "feedback-impossible", "exceed the whole step"),
    (_fb(compute_seconds=4000.0, step_seconds=4000.0), "feedback-impossible", "coordinator.max_feedback_seconds"),
    (_fb(samples=7, total_size=3), "feedback-impossible", "every sample has size >= 1"),
    (_fb(samples=0, total_size=9), "feedback-impossible", "every sample has size >= 1"),
    (_fb(plan_step=12), "feedback-impossible", "plan_step 12"),
    (_fb(new_samples=(PendingSample(20, 4),)), "feedback-impossible", "below the lowest unprocessed"),
    (_fb(new_samples=(PendingSample(505, 0),)), "feedback-impossible", "size < 1"),
    (_fb(sent_at=now_ms() + 10 * 3600 * 1000), "feedback-impossible", "in the future"),
    (_fb(step=41 + 1000 + 1), "feedback-step-window", "coordinator.feedback_window_steps"),
    (_fb(step=10**12), "feedback-step-window", "more than 1000 steps ahead"),
])
def test_feedback_no_rank_sends_is_rejected(fb: StepFeedback, reason: str, words: str) -> None:
    found = feedback_problem(fb, group_step=41, config=CFG, now_ms=now_ms())
    assert found is not None and found.reason == reason and words in found.detail


def test_before_the_coordinator_knows_a_step_any_step_is_plausible() -> None:
    assert feedback_problem(_fb(step=10**12), group_step=None, config=CFG, now_ms=now_ms()) is None


def test_every_forged_feedback_of_the_corpus_gets_its_reason() -> None:
    records = list(forged_feedback(90, "job", "d0", step=3))
    assert len({r.kind for r in records}) == 9
    for record in records:
        fb = decode(record.value, record.headers, StepFeedback)
        found = feedback_problem(fb, group_step=3, config=CFG, now_ms=now_ms())
        assert found is not None and found.reason == record.reason, record.kind
