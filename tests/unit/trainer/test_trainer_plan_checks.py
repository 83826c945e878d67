"""A rank's checks on a plan: the plan as a whole when it arrives, its own part when its step runs."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from fuzzing import forged_plans

from streamtrain.config import CoordinatorConfig
from streamtrain.trainer.plan_checks import PartCheck, kept_by_truncation, plan_problem
from streamtrain.trainer.plans import PlanBook
from streamtrain.wire import Assignment, DevicePlan, decode


def _plan(step: int = 5, **part: object) -> Assignment:
    own = replace(DevicePlan("d0", 0.2, 0.5), **part)
    return Assignment("job", step, "ett-stream", 0.2, 6, 1.0, (own, DevicePlan("d1", 0.2, 0.5, count=3)))


def test_a_plan_a_coordinator_could_make_passes() -> None:
    assert plan_problem(_plan(offsets=(3, 4), truncate_before=3), current_step=5, window=10) is None
    assert plan_problem(_plan(step=15), current_step=5, window=10) is None  # at the window's edge
    assert plan_problem(_plan(step=2), current_step=5, window=10) is None  # old plans are merely stale


@pytest.mark.parametrize(("plan", "reason", "words"), [
    (_plan(step=16), "plan-step-window", "more than 10 steps ahead of the group's step 5"),
    (_plan(step=10**9), "plan-step-window", "trainer.plan_window_steps"),
    (_plan(truncate_before=-1), "plan-negative", "device d0's truncate_before is -1"),
    (_plan(offsets=(-2, 4)), "plan-negative", "device d0's lowest offset is -2"),
    (_plan(size_budget=-10), "plan-negative", "size_budget"),
])
def test_a_plan_no_coordinator_makes_is_rejected(plan: Assignment, reason: str, words: str) -> None:
    found = plan_problem(plan, current_step=5, window=10)
    assert found is not None and found.reason == reason and words in found.detail


@pytest.mark.parametrize("field", ["weight", "predicted_seconds"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_in_any_part_are_rejected(field: str, value: float) -> None:
    plan = _plan()
    other = replace(plan.devices[1], **{field: value})
    found = plan_problem(replace(plan, devices=(plan.devices[0], other)), 5, 10)
    assert found is not None and found.reason == "plan-non-finite" and f"device d1's {field}" in found.detail


def test_every_forged_plan_of_the_corpus_gets_its_reason() -> None:
    records = list(forged_plans(70, "job", ("d0", "d1"), step=5))
    assert {r.kind for r in records} >= {"nan-weights", "a-billion-steps-ahead"}
    for record in records:
        found = plan_problem(decode(record.value, record.headers, Assignment), current_step=5, window=1000)
        assert found is not None and found.reason == record.reason, record.kind


@pytest.mark.parametrize(("settings", "keep"), [
    ({"truncation": "persist"}, None),
    ({"truncation": "truncate"}, 1),
    ({"truncation": "bounded", "max_lag_samples": 50}, 50),
    ({"truncation": "bounded", "max_lag_samples": 50, "max_lag_seconds": 2.0}, 0),
    ({"truncation": "bounded", "max_lag_size": 500}, 0),
])
def test_what_each_truncation_policy_always_keeps(settings: dict[str, object], keep: int | None) -> None:
    assert kept_by_truncation(CoordinatorConfig.model_validate(settings)) == keep


class _Topic:
    """The rank's view of its topic's end: a cached value that may be stale, and the broker's."""

    def __init__(self, cached: int, fresh: int) -> None:
        self.cached, self.fresh, self.asked = cached, fresh, 0

    def __call__(self, fresh: bool) -> int:
        self.asked += fresh
        return self.fresh if fresh else self.cached


def test_persist_rejects_any_truncation_and_nothing_else() -> None:
    check = PartCheck("d0", CoordinatorConfig(truncation="persist"), _Topic(100, 100))
    found = check.problem(_plan(truncate_before=1))
    assert found is not None and found.reason == "plan-truncation" and "persist" in found.detail
    assert check.problem(_plan(offsets=(5, 6))) is None
    assert check.problem(_plan()) is None
    assert check.problem(Assignment("job", 5, "p", 0.2, 3, 1.0, (DevicePlan("d1", 0.2, 1.0, truncate_before=9),))) \
        is None  # another device's part is that rank's to check


def test_truncate_and_bounded_may_not_drop_past_what_they_keep() -> None:
    topic = _Topic(100, 100)
    truncate = PartCheck("d0", CoordinatorConfig(truncation="truncate"), topic)
    assert truncate.problem(_plan(truncate_before=99)) is None  # keeps the newest record
    found = truncate.problem(_plan(truncate_before=100))
    assert found is not None and found.reason == "plan-truncation" and "the topic ends at 100" in found.detail
    found = truncate.problem(_plan(truncate_before=10**12))  # the forged plan of the report: far past the end
    assert found is not None and found.reason == "plan-truncation"
    bounded = PartCheck("d0", CoordinatorConfig(truncation="bounded", max_lag_samples=30), topic)
    assert bounded.problem(_plan(truncate_before=70)) is None
    assert bounded.problem(_plan(truncate_before=71)) is not None
    by_age = PartCheck("d0", CoordinatorConfig(truncation="bounded", max_lag_seconds=5.0), topic)
    assert by_age.problem(_plan(truncate_before=100)) is None  # an age limit may drop everything
    assert by_age.problem(_plan(truncate_before=101)) is not None


def test_a_stale_cached_end_is_refreshed_before_a_plan_is_rejected() -> None:
    topic = _Topic(cached=50, fresh=200)  # the coordinator saw records this rank has not fetched yet
    check = PartCheck("d0", CoordinatorConfig(truncation="truncate"), topic)
    assert check.problem(_plan(truncate_before=150, offsets=(160,))) is None
    assert topic.asked == 1
    assert check.problem(_plan(truncate_before=20)) is None and topic.asked == 1  # within the cached end: no call


def test_planned_records_on_their_way_are_waited_for_missing_ones_rejected_after_the_wait() -> None:
    topic = _Topic(cached=100, fresh=100)
    waited: list[int] = []

    def arrive(offset: int) -> None:  # the rank's bounded data wait, during which the records arrive
        waited.append(offset)
        topic.fresh = 103

    check = PartCheck("d0", CoordinatorConfig(), topic, wait_for=arrive)
    assert check.problem(_plan(offsets=(101, 102))) is None and waited == [102]
    found = check.problem(_plan(offsets=(5_000,)))  # still past the end after the wait: not coming
    assert found is not None and found.reason == "plan-offsets" and waited == [102, 5_000]
    truncating = PartCheck("d0", CoordinatorConfig(truncation="truncate"), topic, wait_for=arrive)
    assert truncating.problem(_plan(truncate_before=10**9)) is not None and waited == [102, 5_000]  # no wait


def test_offsets_past_the_topic_end_are_rejected() -> None:
    check = PartCheck("d0", CoordinatorConfig(), _Topic(100, 100))
    found = check.problem(_plan(offsets=(98, 99, 100)))
    assert found is not None and found.reason == "plan-offsets" and "offset 100" in found.detail
    assert check.problem(_plan(offsets=(98, 99))) is None


def test_plan_book_rejects_plans_beyond_the_window_of_its_current_step() -> None:
    book = PlanBook("job", window=10)
    book.forget_before(100)  # the rank resumed at step 100
    assert book.add(_plan(step=110)) is None and book.get(110) is not None
    rejected = book.add(_plan(step=111))
    assert rejected is not None and rejected.reason == "plan-step-window" and book.get(111) is None
    assert not book.has_newer(110)  # a rejected plan does not make the rank skip its real plans
    assert book.add(_plan(step=105, weight=math.nan)) is not None and book.get(105) is None
    assert book.rejected == {"plan-step-window": 1, "plan-non-finite": 1}
    assert book.add(Assignment("other", 10**9, "p", 1.0, 1, 1.0, ())) is None  # another job's: not ours to judge
    assert book.ignored_other_jobs == 1


def test_plan_book_keeps_the_record_of_each_plan_it_keeps() -> None:
    book = PlanBook("job", keep=2)
    sources = [object(), object(), object()]
    for step, source in enumerate(sources):
        book.add(_plan(step=step), source)  # type: ignore[arg-type]
    assert book.source(0) is None and book.source(2) is sources[2]
    book.add(_plan(step=2))  # a later plan for the same step replaces the earlier one, record and all
    assert book.source(2) is None
    book.forget_before(2)
    assert book.source(1) is None
