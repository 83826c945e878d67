"""The live service's bookkeeping: arrival-rate EWMA, pending index, due steps, planning state."""

from __future__ import annotations

import pytest
from coordinator_helpers import feedback

from streamtrain.config import CoordinatorConfig
from streamtrain.coordinator.fleet import FleetTracker, PendingBook, RateEstimator
from streamtrain.coordinator.policies import plan_step
from streamtrain.coordinator.state import plan_to_assignment
from streamtrain.wire import StepFeedback

# --- arrival rate -----------------------------------------------------------------------------

def test_rate_is_zero_until_two_observations_then_exact_for_constant_growth() -> None:
    r = RateEstimator(halflife_seconds=5.0)
    assert r.observe(100, at=0.0) == 0.0
    assert r.observe(150, at=1.0) == pytest.approx(50.0)
    for t in range(2, 20):
        r.observe(100 + 50 * t, at=float(t))
    assert r.rate == pytest.approx(50.0)


def test_rate_weighs_by_elapsed_time_halflife() -> None:
    r = RateEstimator(halflife_seconds=2.0)
    r.observe(0, 0.0)
    r.observe(100, 1.0)  # primed at 100/s
    r.observe(100, 3.0)  # 0/s for one halflife: halfway
    assert r.rate == pytest.approx(50.0)


def test_rate_ignores_non_increasing_time_and_restarts_when_watermark_goes_back() -> None:
    r = RateEstimator(halflife_seconds=1.0)
    r.observe(0, 0.0)
    r.observe(10, 1.0)
    assert r.observe(999, 1.0) == pytest.approx(10.0)  # same instant: nothing to learn
    assert r.observe(5, 2.0) == 0.0  # topic re-created
    assert r.observe(25, 3.0) == pytest.approx(20.0)


def test_rate_rejects_bad_halflife() -> None:
    with pytest.raises(ValueError):
        RateEstimator(0.0)


# --- pending index ----------------------------------------------------------------------------

def test_index_is_reported_samples_above_lowest_unprocessed() -> None:
    book = PendingBook()
    book.ingest(feedback(0, new=range(0, 10), lowest=3, depth=7), arrival=5.0)
    idx = book.index()
    assert list(idx.offsets) == list(range(3, 10))
    assert list(idx.arrivals) == [5.0] * 7
    assert book.complete


def test_planned_offsets_leave_the_index_and_are_forgotten_once_trained() -> None:
    book = PendingBook()
    book.ingest(feedback(0, new=range(10), depth=10), 0.0)
    book.take(1, [0, 1, 5])
    assert list(book.index().offsets) == [2, 3, 4, 6, 7, 8, 9]
    assert book.inflight == 3 and book.complete
    # The trainer followed plan 1 (trained 0, 1, 5); its lowest unprocessed offset is now 2.
    book.ingest(feedback(1, new=[10, 11], lowest=2, depth=9), 1.0)
    assert list(book.index().offsets) == [2, 3, 4, 6, 7, 8, 9, 10, 11]
    assert book.inflight == 0


def test_offsets_of_a_plan_the_trainer_did_not_follow_come_back() -> None:
    book = PendingBook()
    book.ingest(feedback(0, new=range(6), depth=6), 0.0)
    book.take(1, [3, 4])
    # A local fallback plan trained 0 and 1 (oldest first): 4 samples left, lowest unprocessed 2.
    book.ingest(feedback(1, lowest=2, plan_step=0, depth=4), 1.0)
    assert list(book.index().offsets) == [2, 3, 4, 5]


def test_fallback_that_trained_unnamed_samples_forgets_the_oldest_extra() -> None:
    book = PendingBook()
    book.ingest(feedback(0, new=range(6), depth=6), 0.0)
    # The fallback trained 0 and 2 (lowest unprocessed stays 1): 4 left, the index had 5.
    book.ingest(feedback(1, lowest=1, plan_step=0, depth=4), 1.0)
    assert len(book) == 4 and book.complete


def test_truncation_drops_below_and_an_unreported_buffer_makes_the_index_incomplete() -> None:
    book = PendingBook()
    assert not book.complete
    book.ingest(feedback(0, new=range(20, 30), lowest=20, depth=10), 0.0)
    assert book.truncate(25) == 5
    assert list(book.index().offsets) == [25, 26, 27, 28, 29]
    # After a restart that lost old reports the trainer holds more than we know of.
    partial = PendingBook()
    partial.ingest(feedback(7, new=[50], lowest=40, depth=11), 0.0)
    assert not partial.complete


# --- fleet: due steps and planning state ------------------------------------------------------

def test_step_is_due_when_all_report_or_after_the_bounded_wait() -> None:
    # Plans made only once the last step's feedback is in (plan_ahead = 0): step t+1 is due after step t.
    fleet = FleetTracker(CoordinatorConfig(feedback_wait_seconds=2.0, plan_ahead=0))
    fleet.ingest_feedback(feedback(0, "a", new=range(5), rank=0), received=10.0)
    fleet.ingest_feedback(feedback(0, "b", new=range(5), rank=1), received=10.1)
    assert fleet.expected == ["a", "b"]
    assert fleet.due_step(10.2) == (1, True, 0)
    state = fleet.planning_state(1, now=1000.5)
    plan = plan_step(state, fleet.config)
    fleet.record_plan(plan_to_assignment(plan, "j"))
    assert fleet.next_plan_step == 2 and fleet.due_step(11.0) is None
    fleet.ingest_feedback(feedback(1, "a", lowest=0, rank=0), received=20.0)
    assert fleet.due_step(21.0) is None
    assert fleet.due_step(22.0) == (2, False, 1)  # b is late: plan with what there is
    # Late feedback of an already planned step is applied but does not make a step due again.
    fleet.record_plan(plan_to_assignment(plan_step(fleet.planning_state(2, 1001.0), fleet.config), "j"))
    assert not fleet.ingest_feedback(feedback(0, "b", rank=1), received=23.0)


def test_planning_state_carries_index_model_rate_and_lag() -> None:
    fleet = FleetTracker(CoordinatorConfig(devices=("a", "b")))
    fleet.ingest_feedback(feedback(0, "a", new=range(100, 110), lowest=100, size=7), received=0.0)
    fleet.observe_offsets("a", log_start=0, end=110, committed=95, at=0.0)
    fleet.observe_offsets("a", log_start=0, end=130, committed=100, at=1.0)
    state = fleet.planning_state(1, now=1001.0)
    a, b = state.devices
    assert a.pending is not None and list(a.pending.offsets) == list(range(100, 110))
    assert a.arrival_rate == pytest.approx(20.0)
    assert a.lag == 30 and a.end_offset == 130
    assert a.last_seconds == 0.5 and a.mean_size > 1.0
    assert b.pending is None and b.last_seconds is None  # configured but silent: count mode
    plan = plan_step(state, fleet.config)
    offsets = set(plan.devices[0].offsets.tolist()) if plan.devices[0].offsets is not None else set()
    assert offsets and offsets <= set(range(100, 110))


def test_last_step_seconds_is_the_wall_period_including_plan_and_data_waits() -> None:
    # Truncation keeps arrival rate x this period: without the waits it kept too few samples.
    fleet = FleetTracker(CoordinatorConfig(devices=("a", "b")))
    slow = feedback(0, "a", new=range(3), seconds=0.2)
    waited = StepFeedback(**{**slow.__dict__, "device_id": "b", "rank": 1, "step_seconds": 0.1,
                             "data_wait_seconds": 0.7})
    fleet.ingest_feedback(slow, received=0.0)
    fleet.ingest_feedback(waited, received=0.1)
    assert fleet.planning_state(1, now=1.0).last_step_seconds == pytest.approx(0.8)


def test_last_step_seconds_covers_the_whole_cycle_between_a_ranks_feedback_records() -> None:
    # Checkpoints and commits happen between steps, outside step and wait time; the stream arrives through them.
    fleet = FleetTracker(CoordinatorConfig(devices=("a",)))
    first = feedback(0, "a", seconds=0.2)
    fleet.ingest_feedback(first, received=0.0)
    later = StepFeedback(**{**feedback(1, "a", seconds=0.2).__dict__, "sent_at": first.sent_at + 350})
    fleet.ingest_feedback(later, received=0.35)
    assert fleet.planning_state(2, now=1.0).last_step_seconds == pytest.approx(0.35)
    skipped = StepFeedback(**{**feedback(3, "a", seconds=0.2).__dict__, "sent_at": first.sent_at + 2_000})
    fleet.ingest_feedback(skipped, received=2.0)  # not the next step: its gap spans two cycles, unused
    assert fleet.planning_state(4, now=2.0).last_step_seconds == pytest.approx(0.2)


def _timed(step: int, device: str, *, compute: float, step_s: float, wait: float, plan_step: int | None = None,
           rank: int = 0) -> StepFeedback:
    base = feedback(step, device, plan_step=plan_step, rank=rank)
    return StepFeedback(**{**base.__dict__, "compute_seconds": compute, "step_seconds": step_s,
                           "data_wait_seconds": wait})


def test_step_overhead_is_the_least_waiting_ranks_time_outside_compute_least_over_recent_steps() -> None:
    fleet = FleetTracker(CoordinatorConfig(devices=("a", "b")))
    waits = [(1.5, 2.0), (0.9, 0.7), (0.25, 0.05), (0.04, 0.30), (0.06, 0.08)]  # steps 0-1: start-up waits
    for step, (o_a, o_b) in enumerate(waits):
        if step < 4:  # unknown until four steps are measured: no fixed cost assumed from start-up steps alone
            assert fleet.planning_state(step, now=step).step_overhead_seconds == 0.0
        # Rank a waits for the plan and data, computes 0.1 s; b computes 0.1 s and waits for a in the all-reduce.
        fleet.ingest_feedback(_timed(step, "a", compute=0.1, step_s=0.1 + o_a / 2, wait=o_a / 2), received=step)
        fleet.ingest_feedback(_timed(step, "b", compute=0.1, step_s=0.1 + o_b, wait=0.0, rank=1), received=step)
    # Per step the smaller of the two (1.5, 0.7, 0.05, 0.04, 0.06); the least of those.
    assert fleet.planning_state(5, now=5.0).step_overhead_seconds == pytest.approx(0.04)


def test_step_overhead_ignores_steps_a_rank_trained_on_a_local_fallback_plan() -> None:
    # A fallback step waited trainer.plan_wait_seconds for a plan that never came: not a cost of every step.
    fleet = FleetTracker(CoordinatorConfig(devices=("a",)))
    for step in range(4):
        fleet.ingest_feedback(_timed(step, "a", compute=0.1, step_s=0.1, wait=2.0, plan_step=-1), received=step)
    assert fleet.planning_state(4, now=4.0).step_overhead_seconds == 0.0
    for step in range(4, 8):
        fleet.ingest_feedback(_timed(step, "a", compute=0.1, step_s=0.12, wait=0.01), received=step)
    assert fleet.planning_state(8, now=8.0).step_overhead_seconds == pytest.approx(0.03)


def test_recorded_truncation_sets_the_delete_target() -> None:
    cfg = CoordinatorConfig(truncation="bounded", max_lag_samples=3)
    fleet = FleetTracker(cfg)
    fleet.ingest_feedback(feedback(0, "a", new=range(10), depth=10), received=0.0)
    plan = plan_step(fleet.planning_state(1, now=1000.0), cfg)
    assert plan.devices[0].truncate_before == 7
    dropped = fleet.record_plan(plan_to_assignment(plan, "j"))
    assert dropped == {"a": 7}
    rec = fleet.devices["a"]
    assert rec.delete_before == 7 and rec.book.index().offsets.min(initial=99) >= 7


def test_warm_start_plans_step_zero_once_devices_and_lag_are_known_and_stops_at_feedback() -> None:
    fleet = FleetTracker(CoordinatorConfig())
    assert fleet.warm_start_step() is None  # no device known yet
    fleet.observe_offsets("b", log_start=0, end=40, committed=None, at=0.0)
    fleet.observe_offsets("a", log_start=0, end=90, committed=10, at=0.0)
    assert fleet.expected == ["a", "b"] and fleet.warm_start_step() == 0
    state = fleet.planning_state(0, now=100.0)
    assert [d.lag for d in state.devices] == [80, 40] and all(d.pending is None for d in state.devices)
    plan = plan_step(state, fleet.config)
    assert all(b.count > 0 for b in plan.devices)  # a plan from warm-start models and lag
    fleet.record_plan(plan_to_assignment(plan, "j"))
    assert fleet.warm_start_step() == 0  # may be refreshed until someone reports
    fleet.ingest_feedback(feedback(0, "a", new=range(10, 20), lowest=10), received=1.0)
    assert fleet.warm_start_step() is None and fleet.expected == ["a"]
    configured = FleetTracker(CoordinatorConfig(devices=("x", "y")))
    configured.observe_offsets("x", log_start=0, end=5, committed=None, at=0.0)
    assert configured.warm_start_step() is None  # y's lag is still unknown
    configured.observe_offsets("y", log_start=0, end=0, committed=None, at=0.0)
    assert configured.warm_start_step() == 0


def test_mean_size_starts_from_the_first_reported_size() -> None:
    fleet = FleetTracker(CoordinatorConfig())
    fleet.ingest_feedback(feedback(0, "a", new=range(3), size=40), received=0.0)
    rec = fleet.devices["a"]
    assert rec.sizes_seen == 3 and rec.mean_size == pytest.approx(40.0)
