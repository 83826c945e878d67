"""The backlog a rank passes for the report hold when plans are made a step ahead, and fallbacks that do not
rob the plan ahead."""

from __future__ import annotations

import numpy as np
import pytest

from streamtrain.trainer.backlog import ReportLog, hold_backlog, named_by
from streamtrain.trainer.buffer import SampleBuffer
from streamtrain.trainer.plans import PlanBook
from streamtrain.wire import Assignment, DevicePlan, Sample


def _plan(step: int, offsets: tuple[int, ...] = (), basis: int | None = None, **budget: int) -> Assignment:
    return Assignment(job="j", step=step, policy="test", step_time_target=1.0, global_batch=len(offsets),
                      lr_scale=1.0, devices=(DevicePlan("d0", 0.1, 1.0, offsets=offsets, **budget),),  # type: ignore[arg-type]
                      basis_step=basis)


class _Rank:
    """A rank's buffer and report log, stepped by hand: arrivals, a report, a take."""

    def __init__(self) -> None:
        self.buffer = SampleBuffer(max_samples=1000, max_bytes=10**9)
        self.reports = ReportLog()
        self.next = 0

    def arrive(self, n: int, size: int = 2) -> None:
        for _ in range(n):
            self.buffer.add(self.next, Sample.from_array("d0", self.next, np.zeros((size, 4), np.float32)), 10)
            self.next += 1

    def report(self, step: int) -> None:
        self.buffer.drain_new()
        self.reports.record(step, self.buffer.first_unreported)

    def run(self, offsets: list[int]) -> None:
        self.buffer.take(offsets)


def test_samples_no_plan_has_seen_yet_are_not_backlog() -> None:
    """Plans one step ahead: plan s (made from step s-2's feedback) took all it saw. The samples reported with
    step s-1's feedback a moment ago wait for plan s+1, which has not arrived: the group may hold."""
    rank = _Rank()
    rank.arrive(6)
    rank.report(0)  # reported 0-5
    rank.arrive(4)
    rank.report(1)  # reported 6-9
    plan_2 = _plan(2, offsets=tuple(range(6)), basis=0)  # from step 0's feedback: all of 0-5
    rank.run(list(plan_2.devices[0].offsets))
    assert hold_backlog(rank.buffer, "d0", plan_2, [], rank.reports) == 0
    # The same buffer, had plan 2 been made from step 1's feedback (the old rule): 6-9 were left behind.
    assert hold_backlog(rank.buffer, "d0", _plan(2, tuple(range(6))), [], rank.reports) == 4


def test_a_warm_start_plan_saw_the_lag_so_what_it_left_buffered_is_backlog() -> None:
    """Plans made before any feedback count the device's lag, not reports: a backlog the warm plans leave is one
    (no hold), while samples a later warm plan takes are not."""
    rank = _Rank()
    rank.arrive(40)
    step_0, step_1 = _plan(0, basis=-1, count=8), _plan(1, basis=-1, count=8)
    rank.run(rank.buffer.select_oldest(8))
    assert hold_backlog(rank.buffer, "d0", step_0, [step_1], rank.reports) == 24  # 32 left, 8 of them step 1's
    rank.buffer.complete_step()
    rank.run(rank.buffer.select_oldest(32))
    assert hold_backlog(rank.buffer, "d0", step_1, [], rank.reports) == 0  # all taken: a short step may hold


def test_what_the_newest_plan_saw_and_no_plan_names_is_backlog() -> None:
    rank = _Rank()
    rank.arrive(6)
    rank.report(0)
    rank.arrive(4)
    rank.report(1)
    plan_2 = _plan(2, offsets=(0, 1), basis=0)  # saw 0-5, took 0 and 1: 2-5 are left behind
    rank.run([0, 1])
    assert hold_backlog(rank.buffer, "d0", plan_2, [], rank.reports) == 4
    # Plan 3 has arrived (made from step 1's feedback: saw up to 9) and names 2-9: nothing is left behind.
    plan_3 = _plan(3, offsets=tuple(range(2, 10)), basis=1)
    assert hold_backlog(rank.buffer, "d0", plan_2, [plan_3], rank.reports) == 0
    # It names only 2-7: 8 and 9, which it saw, are a backlog.
    short = _plan(3, offsets=tuple(range(2, 8)), basis=1)
    assert hold_backlog(rank.buffer, "d0", plan_2, [short], rank.reports) == 2
    # A later plan without offsets takes the oldest within its count.
    counted = _plan(3, basis=1, count=6)
    assert hold_backlog(rank.buffer, "d0", plan_2, [counted], rank.reports) == 2
    # Truncation's drops count as today.
    rank.buffer.truncate_before(3)
    assert hold_backlog(rank.buffer, "d0", plan_2, [plan_3], rank.reports) == 1


def test_a_local_fallback_counts_every_reported_sample() -> None:
    rank = _Rank()
    rank.arrive(5)
    rank.report(0)
    rank.arrive(2)  # not reported
    rank.run([0])
    assert hold_backlog(rank.buffer, "d0", None, [], rank.reports) == 4


def test_report_log_bounds_by_step() -> None:
    log = ReportLog(keep=3)
    assert log.bound(5) == 0  # nothing reported by this rank (e.g. just restarted)
    for step, bound in enumerate((4, 9, 9, 15)):
        log.record(step, bound)
    assert log.bound(3) == 15 and log.bound(2) == 9 and log.bound(10) == 15
    assert log.bound(0) == 0  # forgotten: older than the reports kept


def test_a_fallback_passes_over_the_samples_the_plan_ahead_names() -> None:
    rank = _Rank()
    rank.arrive(8)
    rank.report(0)
    plan_2 = _plan(2, offsets=(0, 1, 2, 5), basis=0)
    reserved = named_by([plan_2], "d0")
    assert reserved == {0, 1, 2, 5} and named_by([plan_2], "other") == set()
    # Step 1's plan is late: the local plan takes the oldest samples plan 2 does not name.
    assert rank.buffer.select_oldest(count=3, exclude=reserved) == [3, 4, 6]
    assert rank.buffer.select_oldest(size_budget=5, exclude=reserved) == [3, 4]


def test_round_trip_runs_from_the_feedback_a_plan_was_made_from_to_the_plan() -> None:
    log = ReportLog()
    log.record(0, 5, sent=10.0)
    log.record(1, 9, sent=10.3)
    assert log.time_plans([]) == 0.0  # nothing measured yet
    # Plan 2 made from step 0's feedback, polled at 10.45; plan 3 from step 1's, polled late (during compute).
    trips = log.time_plans([(_plan(2, basis=0), 10.45), (_plan(3, basis=1), 10.9)])
    assert trips == pytest.approx(0.45)
    assert log.time_plans([(_plan(2, basis=0), 10.45)]) == pytest.approx(0.45)  # each plan is timed once
    # One made from a report not remembered is not timed.
    assert log.time_plans([(_plan(9, basis=7), 11.0)]) == pytest.approx(0.45)
    log.record(2, 12, sent=10.8)
    assert log.time_plans([(_plan(3, basis=2), 11.0)]) == pytest.approx(0.45)  # plan 3 was already timed
    assert log.time_plans([(_plan(4, basis=2), 11.0)]) == pytest.approx(0.2)
    # A plan with no basis was made from the report of the step before it.
    fresh = ReportLog()
    fresh.record(0, 3, sent=1.0)
    assert fresh.time_plans([(_plan(1), 1.03)]) == pytest.approx(0.03)


def test_plan_book_remembers_when_each_plan_was_polled() -> None:
    book = PlanBook("j")
    book.add(_plan(1))
    book.add(_plan(2))
    (p1, t1), (p2, t2) = book.received()
    assert (p1.step, p2.step) == (1, 2) and t1 <= t2
    book.forget_before(2)
    assert [p.step for p, _ in book.received()] == [2]
