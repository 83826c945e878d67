"""Plans by step and the local fallback plan (last time budget via T = a*size + b, else last count)."""

from __future__ import annotations

import pytest

from streamtrain.trainer.plans import LocalPlanner, PlanBook, selection_from
from streamtrain.wire import Assignment, DevicePlan


def _plan(step: int, job: str = "job", *devices: DevicePlan) -> Assignment:
    return Assignment(job=job, step=step, policy="test", step_time_target=1.0, global_batch=8, lr_scale=1.0,
                      devices=devices)


def test_plan_book_keeps_own_job_by_step() -> None:
    book = PlanBook("job", keep=3)
    book.add(_plan(1, "other"))
    assert book.get(1) is None and book.ignored_other_jobs == 1
    for s in range(5):
        book.add(_plan(s))
    assert book.get(0) is None and book.get(4) is not None  # only the newest `keep`
    assert book.has_newer(3) and not book.has_newer(4)
    book.forget_before(4)
    assert book.get(3) is None


def test_selection_from_a_plan() -> None:
    with_offsets = _plan(3, "job", DevicePlan("d0", 0.5, 1.0, offsets=(4, 5), truncate_before=4))
    sel = selection_from(with_offsets, "d0")
    assert (sel.plan_step, sel.offsets, sel.truncate_before, sel.local) == (3, (4, 5), 4, False)
    assert selection_from(with_offsets, "d9").count == 0  # not in the plan: trains nothing
    budget = selection_from(_plan(3, "job", DevicePlan("d0", 0.5, 1.0, count=7, size_budget=30)), "d0")
    assert (budget.count, budget.size_budget, budget.offsets) == (7, 30, ())
    empty = selection_from(_plan(3, "job", DevicePlan("d0", 0.5, 1.0)), "d0")
    assert empty.count == 0


def test_local_plan_uses_default_then_last_count_then_time_budget() -> None:
    planner = LocalPlanner(default_count=5)
    assert planner.selection().count == 5 and planner.selection().local
    plan = _plan(0, "job", DevicePlan("d0", predicted_seconds=1.0, weight=1.0, count=3))
    planner.remember(plan, plan.devices[0], trained=3)
    assert planner.selection().count == 3  # no fit yet
    for size in (10, 20, 30, 40):
        planner.observe(size, 0.02 * size + 0.2)  # T = 0.02 size + 0.2
    a, b = planner.fit() or (0.0, 0.0)
    assert a == pytest.approx(0.02) and b == pytest.approx(0.2)
    assert planner.selection().size_budget == 40  # (1.0 - 0.2) / 0.02
    # A step that already waited 2.2 s for a plan that never came trains 2.2 s worth, not 1 s:
    assert planner.selection(waited_s=2.2).size_budget == 100  # (2.2 - 0.2) / 0.02
    assert planner.selection(waited_s=0.5).size_budget == 40  # the last budget is the floor


def test_fit_needs_distinct_sizes_and_positive_slope() -> None:
    planner = LocalPlanner(default_count=5)
    planner.observe(10, 1.0)
    planner.observe(10, 1.1)
    planner.observe(0, 5.0)  # an idle step says nothing
    assert planner.fit() is None
    planner.observe(20, 0.5)
    assert planner.fit() is None  # negative slope: not a usable model
