"""Membership: the coordinator plans for the devices present, leaves out those whose trainer went away,
and takes them back with their next feedback."""

from __future__ import annotations

import pytest
from coordinator_helpers import feedback

from streamtrain.config import CoordinatorConfig
from streamtrain.coordinator.fleet import FleetTracker
from streamtrain.coordinator.membership import Membership
from streamtrain.coordinator.policies import plan_step
from streamtrain.coordinator.state import plan_to_assignment

# --- Membership alone ----------------------------------------------------------------------------


def test_a_device_is_absent_only_when_silent_long_enough_and_passed_over() -> None:
    m = Membership(absent_after=30.0)
    m.heard("a", 0.0)
    m.heard("b", 0.0)
    assert m.update(["a", "b"], 100.0) == []  # silent, but no plan went out without them: a paused group
    m.passed_over(["b"])
    assert m.update(["a", "b"], 29.0) == []  # passed over, but not silent for long enough yet
    assert m.update(["a", "b"], 30.0) == ["b"] and m.absent == {"b"}
    assert m.update(["a", "b"], 60.0) == []  # reported once, not again
    assert m.silent_seconds("b", 60.0) == pytest.approx(60.0)


def test_an_absent_device_is_back_with_its_next_feedback_and_must_be_passed_over_again() -> None:
    m = Membership(absent_after=10.0)
    m.heard("a", 0.0)
    m.passed_over(["a"])
    assert m.update(["a"], 10.0) == ["a"]
    assert m.heard("a", 50.0) is True and not m.absent
    assert m.heard("a", 51.0) is False
    assert m.update(["a"], 500.0) == []  # silent again, but nothing went out without it since


def test_a_device_never_heard_counts_its_silence_from_the_fleets_first_feedback() -> None:
    m = Membership(absent_after=10.0)
    m.passed_over(["c"])
    assert m.update(["c"], 1000.0) == []  # nobody reported yet: nothing to measure silence against
    m.heard("a", 100.0)
    m.passed_over(["c"])
    assert m.update(["a", "c"], 109.0) == []
    assert m.update(["a", "c"], 110.0) == ["c"]


def test_zero_never_leaves_a_device_out() -> None:
    m = Membership(absent_after=0.0)
    m.heard("a", 0.0)
    m.passed_over(["b"])
    assert m.update(["a", "b"], 1e9) == [] and not m.absent
    with pytest.raises(ValueError):
        Membership(-1.0)


# --- in the fleet tracker: plans and the step's wait ----------------------------------------------


def _plan(fleet: FleetTracker, step: int, now: float, basis: int | None = None) -> list[str]:
    """Plan `step` from step `basis`'s feedback (default: the step before) as the service would, record it, and
    return the devices it covers."""
    plan = plan_step(fleet.planning_state(step, now=now), fleet.config)
    fleet.record_plan(plan_to_assignment(plan, "j", basis_step=basis))
    return [b.device_id for b in plan.devices]


def test_the_fleet_plans_only_for_present_devices_and_takes_a_returning_one_back() -> None:
    fleet = FleetTracker(CoordinatorConfig(plan_ahead=0, devices=("a", "b"), feedback_wait_seconds=1.0,
                                           absent_after_seconds=20.0))
    for step in range(3):  # both train
        fleet.ingest_feedback(feedback(step, "a", rank=0), received=float(step))
        fleet.ingest_feedback(feedback(step, "b", rank=1), received=float(step))
        assert fleet.due_step(step + 0.1)[:2] == (step + 1, True)
        assert _plan(fleet, step + 1, now=1000.0 + step) == ["a", "b"]
    # b's node goes away after step 2; a goes on (its node restarted without b) and reports steps 3, 4, ...
    t, step = 3.0, 3
    while t < 40.0:
        fleet.ingest_feedback(feedback(step, "a", rank=0), received=t)
        fleet.update_membership(t)
        due = fleet.due_step(t + 1.0)  # waits the bounded 1 s for b while b counts as present
        assert due is not None and due[0] == step + 1
        if "b" in fleet.membership.absent:
            break
        assert due[:2] == (step + 1, False) and _plan(fleet, step + 1, now=1000.0 + t) == ["a", "b"]
        t, step = t + 2.0, step + 1
    # Absent once silent for 20 s (since step 2 at t=2) with plans going on without it.
    assert fleet.membership.absent == {"b"} and 22.0 <= t < 26.0
    assert fleet.expected == ["a"] and fleet.members == ["a", "b"]
    assert fleet.due_step(t)[:2] == (step + 1, True)  # no wait for b any more
    assert _plan(fleet, step + 1, now=1000.0 + t) == ["a"]
    assert [d.device_id for d in fleet.planning_state(step + 2, now=1000.0 + t).devices] == ["a"]
    # b's node rejoins: its feedback makes it present again, and the next plan covers it.
    fleet.ingest_feedback(feedback(step + 1, "a", rank=0), received=t + 1.0)
    fleet.ingest_feedback(feedback(step + 1, "b", rank=2), received=t + 1.1)
    assert not fleet.membership.absent and fleet.expected == ["a", "b"]
    assert fleet.due_step(t + 1.2)[:2] == (step + 2, True)
    assert _plan(fleet, step + 2, now=1000.0 + t + 1.2) == ["a", "b"]


def test_a_group_that_paused_together_is_all_present_when_it_comes_back() -> None:
    # A broker outage or a restart of every rank: nobody reports for a long time, no plan goes out meanwhile.
    fleet = FleetTracker(CoordinatorConfig(plan_ahead=0, devices=("a", "b"), absent_after_seconds=5.0))
    fleet.ingest_feedback(feedback(0, "a", rank=0), received=0.0)
    fleet.ingest_feedback(feedback(0, "b", rank=1), received=0.0)
    assert _plan(fleet, 1, now=1000.0) == ["a", "b"]
    fleet.ingest_feedback(feedback(1, "a", rank=0), received=100.0)  # the first to come back
    assert fleet.update_membership(100.0) == [] and fleet.expected == ["a", "b"]
    assert fleet.due_step(100.1) is None  # b is waited for, as before the pause


def test_without_configured_devices_an_absent_device_still_counts_as_a_member() -> None:
    fleet = FleetTracker(CoordinatorConfig(plan_ahead=0, feedback_wait_seconds=0.5, absent_after_seconds=1.0))
    fleet.ingest_feedback(feedback(0, "a", rank=0), received=0.0)
    fleet.ingest_feedback(feedback(0, "b", rank=1), received=0.0)
    _plan(fleet, 1, now=1000.0)
    fleet.ingest_feedback(feedback(1, "a", rank=0), received=1.0)
    assert fleet.due_step(1.5)[:2] == (2, False)
    _plan(fleet, 2, now=1001.5)
    assert fleet.update_membership(2.0) == ["b"]
    assert fleet.members == ["a", "b"] and fleet.expected == ["a"]


def test_late_feedback_of_an_absent_device_does_not_bring_it_back() -> None:
    # A node cut off delivers, once its cable is back, the reports it had queued: steps long since planned.
    fleet = FleetTracker(CoordinatorConfig(plan_ahead=0, devices=("a", "b"), feedback_wait_seconds=0.5,
                                           absent_after_seconds=1.0))
    fleet.ingest_feedback(feedback(0, "a", rank=0), received=0.0)
    fleet.ingest_feedback(feedback(0, "b", rank=1), received=0.0)
    _plan(fleet, 1, now=1000.0)
    for step in (1, 2, 3):
        fleet.ingest_feedback(feedback(step, "a", rank=0), received=float(step))
        assert fleet.due_step(step + 0.5) is not None
        _plan(fleet, step + 1, now=1000.0 + step)
        fleet.update_membership(step + 0.5)
    assert fleet.membership.absent == {"b"}
    assert not fleet.ingest_feedback(feedback(1, "b", rank=1), received=5.0)  # step 1: planned long ago
    assert fleet.membership.absent == {"b"} and fleet.expected == ["a"]
    fleet.ingest_feedback(feedback(4, "a", rank=0), received=6.0)
    fleet.ingest_feedback(feedback(4, "b", rank=1), received=6.1)  # b's node rejoined: a step still to plan
    assert not fleet.membership.absent and fleet.expected == ["a", "b"]


def test_with_plans_made_ahead_a_report_is_late_once_the_plan_it_would_make_is_out() -> None:
    # One step ahead, step s's feedback makes the plan for step s+2: a report of step s is late once that plan
    # went out without it, and only a late report leaves an absent device absent.
    fleet = FleetTracker(CoordinatorConfig(devices=("a", "b"), feedback_wait_seconds=0.5, absent_after_seconds=1.0))
    for step in (0, 1):
        _plan(fleet, step, now=1000.0, basis=-1)  # the warm plans for steps 0 and 1
    fleet.ingest_feedback(feedback(0, "a", rank=0), received=0.0)
    fleet.ingest_feedback(feedback(0, "b", rank=1), received=0.0)
    due = fleet.due_step(0.1)
    assert due == (2, True, 0)
    _plan(fleet, 2, now=1000.0, basis=0)
    for step in (1, 2, 3):  # b goes silent; a reports, and each report makes the plan two steps on
        fleet.ingest_feedback(feedback(step, "a", rank=0), received=float(step))
        due = fleet.due_step(step + 0.6)  # without b: after the wait for it, then (b absent) at once
        assert due is not None and (due.step, due.basis) == (step + 2, step)
        _plan(fleet, step + 2, now=1000.0 + step, basis=step)
        fleet.update_membership(step + 0.6)
    assert fleet.membership.absent == {"b"} and fleet.next_plan_step == 6
    assert not fleet.ingest_feedback(feedback(3, "b", rank=1), received=5.0)  # plan 5 went out without it
    assert fleet.membership.absent == {"b"}
    fleet.ingest_feedback(feedback(4, "b", rank=1), received=5.1)  # its node is back: plan 6 is still to make
    assert not fleet.membership.absent and fleet.expected == ["a", "b"]
