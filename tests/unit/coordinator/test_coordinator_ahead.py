"""Plans made one step ahead (`coordinator.plan_ahead` = 1): the due-step rule, the predicted state the
plan for step s+1 is made from while step s runs, two plans in flight, and rebuilding it all from Kafka."""

from __future__ import annotations

import numpy as np
import pytest
from coordinator_helpers import device, state

from streamtrain.config import CoordinatorConfig
from streamtrain.coordinator.fleet import FleetTracker
from streamtrain.coordinator.policies import plan_step
from streamtrain.coordinator.state import after_batch, after_plan, oldest_within, plan_to_assignment
from streamtrain.trainer.backlog import named_by
from streamtrain.trainer.buffer import SampleBuffer
from streamtrain.trainer.plans import selection_from
from streamtrain.wire import Assignment, DevicePlan, PendingSample, Sample, StepFeedback


def feedback(step: int, device_id: str = "a", *, new: range | list[int] = range(0), lowest: int = 0,
             depth: int | None = None, plan_step: int | None = None, rank: int = 0, size: int = 10) -> StepFeedback:
    samples = tuple(PendingSample(o, size) for o in new)
    return StepFeedback(job="j", step=step, device_id=device_id, rank=rank,
                        plan_step=step if plan_step is None else plan_step, samples=4, total_size=40,
                        compute_seconds=0.4, data_wait_seconds=0.0, comm_seconds=0.01, step_seconds=0.41,
                        memory_bytes=0, lowest_unprocessed_offset=lowest,
                        buffer_depth=len(samples) if depth is None else depth, new_samples=samples,
                        sent_at=1_000_000 + 500 * step)


def publish(fleet: FleetTracker, step: int, now: float = 1000.0) -> Assignment:
    """What the service does for a due step (or a warm one, with no basis): plan from the fleet's state, then
    record the plan."""
    due = fleet.due_step(float("inf"))
    basis = due.basis if due is not None and due.step == step else -1
    plan = plan_to_assignment(plan_step(fleet.planning_state(step, now), fleet.config), "j", basis_step=basis)
    fleet.record_plan(plan)
    return plan


def offsets_of(plan: Assignment, device_id: str = "a") -> set[int]:
    part = plan.for_device(device_id)
    return set(part.offsets) if part is not None else set()


# --- which step is due -----------------------------------------------------------------------------


def test_step_s_feedback_makes_the_plan_for_s_plus_2_due_and_a_missing_s_plus_1_comes_first() -> None:
    fleet = FleetTracker(CoordinatorConfig(feedback_wait_seconds=2.0, devices=("a", "b")))
    assert fleet.config.plan_ahead == 1  # the default
    fleet.ingest_feedback(feedback(0, "a", new=range(20)), received=10.0)
    assert fleet.due_step(10.1) is None  # b has not reported and the wait is not over
    fleet.ingest_feedback(feedback(0, "b", new=range(20), rank=1), received=10.2)
    # No plan exists yet (the ranks ran step 0 on local plans): step 1, which they need now, comes first.
    assert fleet.due_step(10.3) == (1, True, 0)
    first = publish(fleet, 1)
    assert first.basis_step == 0 and fleet.due_step(10.3) == (2, True, 0)
    second = publish(fleet, 2)
    assert second.basis_step == 0 and fleet.due_step(10.3) is None and fleet.next_plan_step == 3
    assert not offsets_of(first) & offsets_of(second)  # plan 2 is made from the state after plan 1
    # Step 1's feedback makes step 3 due: step 2's plan is already with the ranks.
    fleet.ingest_feedback(feedback(1, "a", lowest=0, depth=20), received=11.0)
    assert fleet.due_step(11.1) is None
    assert fleet.due_step(13.0) == (3, False, 1)  # b's report is late: planned with what there is
    publish(fleet, 3)
    assert not fleet.ingest_feedback(feedback(1, "b", rank=1), received=13.5)  # late: its plan is out
    assert fleet.ingest_feedback(feedback(2, "b", rank=1), received=13.6)  # counts towards step 4


def test_a_report_of_the_next_step_that_comes_first_does_not_hold_back_the_due_plan() -> None:
    fleet = FleetTracker(CoordinatorConfig(devices=("a", "b"), feedback_wait_seconds=2.0))
    for rank, d in enumerate(("a", "b")):
        fleet.ingest_feedback(feedback(0, d, new=range(10), rank=rank), received=0.0)
    publish(fleet, 1)
    publish(fleet, 2)
    fleet.ingest_feedback(feedback(1, "a", lowest=0, depth=10), received=1.0)
    fleet.ingest_feedback(feedback(2, "a", lowest=0, depth=10), received=1.1)  # a's next report overtook b's
    assert fleet.due_step(1.2) is None
    fleet.ingest_feedback(feedback(1, "b", lowest=0, depth=10, rank=1), received=1.3)
    assert fleet.due_step(1.3) == (3, True, 1)  # step 1 is complete: plan 3 is due, made from it
    publish(fleet, 3)
    assert fleet.due_step(1.4) is None and fleet.due_step(3.2) == (4, False, 2)


def test_warm_start_publishes_step_0_then_step_0s_feedback_plans_step_1_and_the_step_ahead() -> None:
    fleet = FleetTracker(CoordinatorConfig())
    fleet.observe_offsets("a", log_start=0, end=50, committed=None, at=0.0)
    assert fleet.warm_start_step() == 0
    zero = publish(fleet, 0)
    assert zero.basis_step == -1 and fleet.next_plan_step == 1
    assert fleet.warm_start_step() == 0 and fleet.due_step(0.5) is None  # may be refreshed until the first feedback
    fleet.ingest_feedback(feedback(0, "a", new=range(1, 50), lowest=1), received=1.0)
    assert fleet.warm_start_step() is None and fleet.due_step(1.1) == (1, True, 0)
    publish(fleet, 1)
    assert fleet.due_step(1.1) == (2, True, 0)  # and the plan ahead, from the same feedback


def test_a_plan_ahead_that_would_train_nothing_waits_for_the_next_feedback() -> None:
    """At line rate the plan for s+1 takes everything step s-1 reported, and the plan ahead for s+2 would find
    nothing: it is left unmade, and step s+1's feedback (with what arrived meanwhile) makes it due again."""
    fleet = FleetTracker(CoordinatorConfig(devices=("a",)))
    fleet.ingest_feedback(feedback(0, new=range(6)), received=0.0)
    one = publish(fleet, 1)
    assert offsets_of(one) == set(range(6)) and fleet.due_step(0.1) == (2, True, 0)
    ahead = plan_step(fleet.planning_state(2, 1000.0), fleet.config)
    assert ahead.global_batch == 0 and not ahead.worth_ahead
    fleet.defer(2, 0)
    assert fleet.due_step(0.1) is None and fleet.due_step(100.0) is None  # not again from the same basis
    fleet.ingest_feedback(feedback(1, new=range(6, 9), lowest=6), received=0.5)
    assert fleet.due_step(0.6) == (2, True, 1)
    two = publish(fleet, 2)
    assert two.basis_step == 1 and offsets_of(two) == {6, 7, 8}
    assert fleet.due_step(0.6) == (3, True, 1)  # and plans run ahead again from there
    with pytest.raises(ValueError, match="only a plan made ahead"):
        fleet.defer(2, 1)


def test_plan_ahead_zero_keeps_plans_waiting_for_the_last_step() -> None:
    fleet = FleetTracker(CoordinatorConfig(plan_ahead=0))
    fleet.ingest_feedback(feedback(0, "a", new=range(10)), received=0.0)
    assert fleet.due_step(0.1) == (1, True, 0)
    publish(fleet, 1)
    assert fleet.due_step(0.1) is None


@pytest.mark.parametrize("ahead", [0, 1])
def test_the_plans_round_trip_is_the_slowest_ranks_when_plans_are_made_ahead(ahead: int) -> None:
    fleet = FleetTracker(CoordinatorConfig(devices=("a", "b"), plan_ahead=ahead))
    for rank, (d, trip) in enumerate((("a", 0.03), ("b", 0.05))):
        fb = feedback(0, d, new=range(4), rank=rank)
        fleet.ingest_feedback(StepFeedback(**{**fb.__dict__, "plan_round_trip_seconds": trip}), received=0.0)
    # Only a plan made ahead is waited for by a step shorter than the round trip (the other's is every step's).
    assert fleet.planning_state(1, now=1.0).plan_round_trip_seconds == pytest.approx(0.05 * ahead)


def test_plan_ahead_accepts_booleans_and_rejects_more_than_one_step() -> None:
    assert CoordinatorConfig.model_validate({"plan_ahead": False}).plan_ahead == 0
    assert CoordinatorConfig.model_validate({"plan_ahead": True}).plan_ahead == 1
    with pytest.raises(ValueError, match="plan_ahead"):
        CoordinatorConfig.model_validate({"plan_ahead": 2})


# --- the predicted state -----------------------------------------------------------------------------


def test_the_plan_ahead_is_made_from_the_index_less_the_plan_in_flight_and_its_truncation() -> None:
    cfg = CoordinatorConfig(devices=("a",), truncation="bounded", max_lag_samples=30, b_max=8)
    fleet = FleetTracker(cfg)
    fleet.ingest_feedback(feedback(0, new=range(100)), received=0.0)
    one = publish(fleet, 1)
    part = one.devices[0]
    assert part.truncate_before == 70 and offsets_of(one) == set(range(70, 78))
    # Plan 2, made before step 1 runs: nothing plan 1 takes or drops, and only reported offsets.
    two = publish(fleet, 2)
    assert offsets_of(two) == set(range(78, 86)) and two.devices[0].truncate_before is None
    rec = fleet.devices["a"].book
    assert rec.inflight == 16 and len(rec) == 100 - 70 - 16


def test_feedback_settles_only_its_own_step_with_two_plans_in_flight() -> None:
    fleet = FleetTracker(CoordinatorConfig(devices=("a",), b_max=4))
    fleet.ingest_feedback(feedback(0, new=range(12)), received=0.0)
    one, two = publish(fleet, 1), publish(fleet, 2)
    assert offsets_of(one) == {0, 1, 2, 3} and offsets_of(two) == {4, 5, 6, 7}
    book = fleet.devices["a"].book
    # Step 1 followed plan 1 (trained 0-3); 12 and 13 arrived. Plan 2's offsets stay in flight.
    fleet.ingest_feedback(feedback(1, new=[12, 13], lowest=4, depth=10), received=1.0)
    assert book.inflight == 4 and list(book.index().offsets) == [8, 9, 10, 11, 12, 13] and book.complete
    three = publish(fleet, 3)
    assert offsets_of(three) == {8, 9, 10, 11}
    # Step 2 fell back to a local plan (plan 2 was late): oldest first, passing over plan 3's samples.
    fleet.ingest_feedback(feedback(2, lowest=6, depth=8, plan_step=-1), received=2.0)
    assert list(book.index().offsets) == [6, 7, 12, 13]  # plan 2's untrained samples come back
    assert book.inflight == 4  # plan 3's are still out


def test_a_plan_without_offsets_claims_the_oldest_samples_within_its_budget() -> None:
    fleet = FleetTracker(CoordinatorConfig(devices=("a",)))
    # Warm plans 0 and 1 were budgets (no index existed); the first feedback brings the index.
    fleet.record_plan(Assignment("j", 0, "x", 0.0, 2, 1.0, (DevicePlan("a", 0.1, 1.0, count=2),), basis_step=-1))
    fleet.record_plan(Assignment("j", 1, "x", 0.0, 3, 1.0, (DevicePlan("a", 0.1, 1.0, size_budget=25),),
                                 basis_step=-1))
    fleet.ingest_feedback(feedback(0, new=range(2, 12), lowest=2), received=0.0)
    # Plan 1 will take the oldest within a size budget of 25 (sizes 10): offsets 2 and 3.
    state_2 = fleet.planning_state(2, now=1.0)
    assert list(state_2.devices[0].pending.offsets) == list(range(4, 12))  # type: ignore[union-attr]
    two = publish(fleet, 2)
    assert min(offsets_of(two)) >= 4
    # Step 1 ran plan 1 but took only offset 2 (its sizes differed from the report): its lowest unprocessed
    # offset says so, and offset 3 is pending again.
    fleet.ingest_feedback(feedback(1, lowest=3, depth=9), received=2.0)
    book = fleet.devices["a"].book
    assert not book.budget_claims() and len(book) + book.inflight == 9 and 3 in book.index().offsets
    assert set(book.index().offsets) | offsets_of(two) == set(range(3, 12))


def test_the_simulators_predicted_state_is_the_services() -> None:
    """`after_plan` (the simulator's prediction) and the fleet's book (the service's) agree on what the plan
    ahead may use: the same policy on either gives the same plan."""
    cfg = CoordinatorConfig(devices=("a", "b"), truncation="bounded", max_lag_samples=40, b_max=16)
    fleet = FleetTracker(cfg)
    rng = np.random.default_rng(3)
    sizes = {d: rng.integers(1, 60, 100).tolist() for d in ("a", "b")}
    for rank, d in enumerate(("a", "b")):
        fb = feedback(0, d, rank=rank)
        fleet.ingest_feedback(StepFeedback(**{**fb.__dict__, "buffer_depth": 100, "new_samples": tuple(
            PendingSample(o, s) for o, s in enumerate(sizes[d]))}), received=0.0)
    before = fleet.planning_state(1, now=5.0)
    one = plan_step(before, cfg)
    fleet.record_plan(plan_to_assignment(one, "j"))
    live = fleet.planning_state(2, now=5.0)
    predicted = after_plan(before, one)
    for x, y in zip(live.devices, predicted.devices, strict=True):
        assert x.pending is not None and y.pending is not None
        assert list(x.pending.offsets) == list(y.pending.offsets) and x.lag == y.lag
    assert [list(p.offsets) for p in plan_step(live, cfg).devices] == \
        [list(p.offsets) for p in plan_step(predicted, cfg).devices]  # type: ignore[arg-type]


def test_oldest_within_is_the_trainers_rule() -> None:
    sizes = np.array([5.0, 30.0, 5.0, 5.0])
    assert oldest_within(sizes, None, None) == 4
    assert oldest_within(sizes, 2, None) == 2
    assert oldest_within(sizes, None, 3) == 1  # the oldest even when it alone is larger
    assert oldest_within(sizes, None, 35) == 2 and oldest_within(sizes, 3, 1000) == 3
    assert oldest_within(sizes, None, 0) == 0 and oldest_within(sizes[:0], 5, 5) == 0


def test_after_batch_without_an_index_shrinks_the_lag() -> None:
    d = state(device("a", [1.0] * 10)).devices[0]
    blind = d.__class__(**{**d.__dict__, "pending": None, "lag": 40, "end_offset": 50, "mean_size": 4.0})
    assert after_batch(blind, None, count=6).lag == 34
    assert after_batch(blind, None, size_budget=20).lag == 35
    assert after_batch(blind, None, count=3, truncate_before=20).lag == 27  # 30 left after truncation, 3 taken


# --- rebuilding from Kafka ----------------------------------------------------------------------------


def test_replay_puts_each_plan_after_the_feedback_it_was_made_from() -> None:
    cfg = CoordinatorConfig(devices=("a",), b_max=3)
    live = FleetTracker(cfg)
    sent_feedback = [feedback(0, new=range(10), depth=10)]
    live.ingest_feedback(sent_feedback[-1], received=0.0)
    plans = [publish(live, 1), publish(live, 2)]  # plan 1 (urgent) and plan 2 (ahead), both from step 0
    sent_feedback.append(feedback(1, new=range(10, 14), lowest=3, depth=11))
    live.ingest_feedback(sent_feedback[-1], received=1.0)
    plans.append(publish(live, 3))  # from step 1: it names 10-13's neighbours only once reported
    sent_feedback.append(feedback(2, new=[14], lowest=6, depth=9))
    live.ingest_feedback(sent_feedback[-1], received=2.0)
    plans.append(publish(live, 4))
    assert [p.basis_step for p in plans] == [0, 0, 1, 2]
    rebuilt = FleetTracker(cfg)
    rebuilt.replay(plans, sent_feedback, received=5.0)
    a, b = live.devices["a"].book, rebuilt.devices["a"].book
    assert list(a.index().offsets) == list(b.index().offsets) and a.inflight == b.inflight == 6  # plans 3 and 4
    assert rebuilt.next_plan_step == live.next_plan_step == 5 and rebuilt.due_step(5.0) is None
    # Step 3's feedback makes step 5 due, as it would have live.
    rebuilt.ingest_feedback(feedback(3, lowest=9, depth=6), received=6.0)
    assert rebuilt.due_step(6.0) == (5, True, 3)


# --- the whole loop, with the trainer's own buffer -----------------------------------------------------


@pytest.mark.parametrize("truncation", ["persist", "bounded"])
@pytest.mark.parametrize("ahead", [0, 1])
def test_plans_name_only_reported_samples_once_and_lose_none(truncation: str, ahead: int) -> None:
    """The coordinator's bookkeeping driven by ranks that follow every plan with the trainer's own buffer: a
    stream with bursts (a backlog builds, then drains), then no arrivals. Every plan names only samples its
    rank reported and has not trained, truncates below nothing unreported, never robs the plan before it, and
    every sample ends trained once (or, under bounded, dropped)."""
    devices = ("a", "b")
    cfg = CoordinatorConfig(devices=devices, plan_ahead=ahead, truncation=truncation,  # type: ignore[arg-type]
                            max_lag_samples=40 if truncation == "bounded" else None, b_max=24, target_step_seconds=0.5)
    fleet = FleetTracker(cfg)
    rng = np.random.default_rng(11)
    buffers = {d: SampleBuffer(10**6, 10**12) for d in devices}
    produced = dict.fromkeys(devices, 0)
    reported: dict[str, set[int]] = {d: set() for d in devices}
    trained: dict[str, set[int]] = {d: set() for d in devices}
    dropped = dict.fromkeys(devices, 0)
    plans: dict[int, Assignment] = {}
    for d in devices:
        fleet.observe_offsets(d, log_start=0, end=0, committed=None, at=0.0)
    plans[0] = publish(fleet, 0)  # the warm-start plan; step 1's waits for step 0's feedback
    for step in range(80):
        t = float(step)
        for i, d in enumerate(devices):
            burst = 60 if step in (5, 6, 20) else 4 + i
            for _ in range(int(rng.poisson(burst)) if step < 40 else 0):
                size = int(rng.integers(1, 30))
                buffers[d].add(produced[d], Sample.from_array(d, produced[d], np.zeros((size, 2), np.float32)), 8)
                produced[d] += 1
            fleet.observe_offsets(d, log_start=0, end=produced[d], committed=None, at=t)
        plan = plans[step]  # always there: made a step ahead (or after the last feedback: plan_ahead 0, step 1)
        later = [p for s, p in sorted(plans.items()) if s > step]
        for rank, d in enumerate(devices):
            buf, sel = buffers[d], selection_from(plan, d)
            named = set(sel.offsets)
            assert named <= reported[d] - trained[d], f"step {step}: {d} named unreported or trained offsets"
            if sel.truncate_before is not None:
                assert sel.truncate_before <= max(reported[d]) + 1
                buf.truncate_before(sel.truncate_before)
            reserved = named_by(later, d)
            assert not named & reserved  # the plan ahead never names this step's samples
            offsets = list(sel.offsets) if sel.offsets else buf.select_oldest(sel.count, sel.size_budget,
                                                                              exclude=reserved)
            samples = buf.take(offsets)
            assert len(samples) == len(offsets)  # every named sample was there to train
            assert not set(offsets) & trained[d]
            trained[d] |= set(offsets)
            buf.complete_step()
            size = sum(s.size for s in samples)
            fb = StepFeedback(job="j", step=step, device_id=d, rank=rank, plan_step=step, samples=len(samples),
                              total_size=size, compute_seconds=0.01 + 1e-3 * (rank + 1) * size,
                              data_wait_seconds=0.0, comm_seconds=0.0, step_seconds=0.01 + 1e-3 * size,
                              memory_bytes=0, lowest_unprocessed_offset=buf.lowest_unprocessed(),
                              buffer_depth=len(buf), dropped=len(buf.drain_dropped()), new_samples=buf.drain_new(),
                              sent_at=1_000_000 + 1000 * step)
            dropped[d] += fb.dropped
            reported[d] |= {p.offset for p in fb.new_samples}
            fleet.ingest_feedback(fb, received=t)
        while (due := fleet.due_step(t)) is not None:
            assert due[0] > step
            plans[due[0]] = publish(fleet, due[0], now=1000.0 + t)
    for d in devices:
        assert len(buffers[d]) == 0, f"{d}: {len(buffers[d])} samples never planned"
        assert len(trained[d]) + dropped[d] == produced[d]
        assert (dropped[d] > 0) == (truncation == "bounded")


def test_a_device_that_never_reports_keeps_its_backlog_in_the_plans_view() -> None:
    # Device b has no rank (or lost it): its plans without offsets are claims no feedback ever settles. Only
    # the claims of steps still in the pipeline count; older ones would pile up, one per plan, until b's whole
    # backlog looked taken and truncation never reached it.
    fleet = FleetTracker(CoordinatorConfig(devices=("a", "b"), feedback_wait_seconds=0.1, absent_after_seconds=0.0))
    fleet.observe_offsets("b", 0, 5_000, 0, at=0.0)
    for step in range(40):
        fleet.ingest_feedback(feedback(step, "a", rank=0), received=float(step))
        due = fleet.due_step(step + 0.2)
        if due is None:
            continue
        plan = plan_step(fleet.planning_state(due.step, now=1000.0 + step), fleet.config)
        fleet.record_plan(plan_to_assignment(plan, "j", basis_step=due.basis))
    claims = fleet.device("b").book.budget_claims()
    assert 0 < len(claims) <= 2 + fleet.config.plan_ahead
    view = fleet.planning_state(fleet.next_plan_step or 0, now=2000.0).devices
    (b,) = [d for d in view if d.device_id == "b"]
    assert b.lag >= 5_000 - sum(count or 0 for count, _ in claims) > 0
