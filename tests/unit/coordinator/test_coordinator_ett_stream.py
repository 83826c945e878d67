"""ett-stream: step-time choice, equal-ETT fill, and properties over random fleets."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from coordinator_helpers import device, state
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain.config import CoordinatorConfig
from streamtrain.coordinator.perfmodel import ModelBank, PerfModel
from streamtrain.coordinator.policies import POLICIES, plan_step
from streamtrain.coordinator.policies.ett_stream import choose_step_time
from streamtrain.coordinator.state import DeviceState, PlanningState


def test_backlogged_devices_get_equal_ett_whatever_their_speed() -> None:
    rng = np.random.default_rng(0)
    devs = [device(f"d{i}", rng.integers(5, 120, 400).astype(float), a=a, b=0.02)
            for i, a in enumerate([1e-3, 5e-4, 2.5e-4, 1e-4])]
    # Every device trains b_min each step (no sitting out): the b_min bound sets T here.
    plan = plan_step(state(*devs), CoordinatorConfig(global_batch=200, sit_out_every=0), "ett-stream")
    predicted = np.array([d.predicted_seconds for d in plan.devices])
    assert predicted.max() <= plan.step_time_target + 1e-9
    assert (predicted.max() - predicted.min()) / predicted.mean() < 0.02
    # Faster devices train proportionally more.
    assert [d.count for d in plan.devices] == sorted(d.count for d in plan.devices)


def test_oldest_samples_go_first_and_best_fit_closes_the_gap() -> None:
    # Budget 10 (T fixed at 10 s, a = 1): oldest-first takes 4 + 3, then 5 does not fit, best fit adds 2.
    d = device("d", [4.0, 3.0, 5.0, 1.0, 2.0, 9.0], a=1.0)
    plan = plan_step(state(d), CoordinatorConfig(target_step_seconds=10.0), "ett-stream")
    assert list(plan.devices[0].offsets) == [0, 1, 3, 4]  # in offset order, as a trainer reads them
    assert plan.devices[0].total_size == 10.0


def test_best_fit_looks_only_a_bounded_way_past_the_prefix() -> None:
    # Budget 10: oldest-first takes 4 + 3; the 3 that would close the gap is the 5th sample past the prefix.
    d = device("d", [4.0, 3.0, 5.0, 9.0, 8.0, 7.0, 3.0], a=1.0)
    near = plan_step(state(d), CoordinatorConfig(target_step_seconds=10.0, best_fit_lookahead=4), "ett-stream")
    assert list(near.devices[0].offsets) == [0, 1]
    whole = plan_step(state(d), CoordinatorConfig(target_step_seconds=10.0, best_fit_lookahead=None), "ett-stream")
    assert list(whole.devices[0].offsets) == [0, 1, 6]
    assert whole.devices[0].total_size == 10.0


def test_step_time_trains_at_line_rate() -> None:
    # a·r·m = 0.001·100·5 = 0.5, headroom 10%: T = b / (1 - 0.55) = 0.1 / 0.45.
    keeps_up = device("k", [5.0] * 10, a=1e-3, b=0.1, arrival_rate=100.0, mean_size=5.0)
    # This one cannot keep up at any step time (rho = 2): it fills T and does not set it.
    saturated = device("s", [5.0] * 10_000, a=1e-3, b=0.1, arrival_rate=400.0, mean_size=5.0)
    cfg = CoordinatorConfig(max_overhead_fraction=1.0)
    target, bounds = choose_step_time((keeps_up, saturated), cfg)
    assert bounds["line_rate"] == pytest.approx(0.1 / 0.45)
    assert target == pytest.approx(0.1 / 0.45)
    plan = plan_step(state(keeps_up, saturated), cfg, "ett-stream")
    # Enough for what arrives in a step plus the 10% headroom.
    assert plan.devices[1].predicted_seconds == pytest.approx(target, abs=5e-3)


def test_measured_step_overhead_lengthens_the_step_so_fixed_costs_stay_a_fraction_of_it() -> None:
    # Streams arrive through the whole period T + o: T >= (b + rho'·o) / (1 - rho'), rho' = 0.55 here.
    keeps_up = device("k", [5.0] * 10, a=1e-3, b=0.1, arrival_rate=100.0, mean_size=5.0)
    cfg = CoordinatorConfig(max_overhead_fraction=1.0)
    _, bounds = choose_step_time((keeps_up,), cfg, overhead_s=0.2)
    assert bounds["line_rate"] == pytest.approx((0.1 + 0.55 * 0.2) / 0.45)
    # And the fixed costs b + o are at most max_overhead_fraction of a step: (0.1 + 0.2) / 0.2.
    target, bounds = choose_step_time((keeps_up,), CoordinatorConfig(max_overhead_fraction=0.2), overhead_s=0.2)
    assert bounds["overhead"] == pytest.approx(1.5) and target == pytest.approx(1.5)
    # The policy reads it from the planning state: a longer target, more samples in the step.
    short = plan_step(state(keeps_up), CoordinatorConfig(max_overhead_fraction=0.2), "ett-stream")
    long = plan_step(PlanningState(step=0, now=0.0, devices=(keeps_up,), step_overhead_seconds=0.2),
                     CoordinatorConfig(max_overhead_fraction=0.2), "ett-stream")
    assert short.step_time_target == pytest.approx(0.5) and long.step_time_target == pytest.approx(1.5)


def test_a_step_made_ahead_is_at_least_the_plans_round_trip_while_streams_keep_up() -> None:
    # A plan made a step ahead reaches the ranks 0.9 s after they report: a shorter period waits for it anyway,
    # so the step batches until then (period T + o >= 0.9) instead of idling at the boundary.
    keeps_up = device("k", [5.0] * 10, a=1e-3, b=0.1, arrival_rate=100.0, mean_size=5.0)
    cfg = CoordinatorConfig(max_overhead_fraction=0.2)
    target, bounds = choose_step_time((keeps_up,), cfg, overhead_s=0.05, round_trip_s=0.9)
    assert bounds["round_trip"] == pytest.approx(0.85) and target == pytest.approx(0.85)
    assert choose_step_time((keeps_up,), cfg, overhead_s=0.05, round_trip_s=0.2)[0] == pytest.approx(0.75)
    assert "round_trip" not in choose_step_time((keeps_up,), cfg, overhead_s=0.05)[1]  # not measured yet
    # Under a backlog only (no stream it keeps up with) steps are long anyway: no floor.
    backlog = device("b", [5.0] * 1000, a=1e-3, b=0.1)
    assert "round_trip" not in choose_step_time((backlog,), cfg, round_trip_s=0.9)[1]
    ahead = PlanningState(step=0, now=0.0, devices=(keeps_up,), step_overhead_seconds=0.05,
                          plan_round_trip_seconds=0.9)
    assert plan_step(ahead, cfg, "ett-stream").step_time_target == pytest.approx(0.85)


def test_warm_start_guesses_do_not_set_the_step_time_once_a_speed_is_measured() -> None:
    """A device still on its warm-start model (slow by design) would make the fleet look backlogged and T
    seconds long; measured devices set T, and the guessed one is filled to it."""
    measured = device("m", [5.0] * 4, a=1e-3, b=0.1, arrival_rate=100.0, mean_size=5.0)
    # Its first sample would take 0.5 s by the guess (a b_min bound) and it "cannot keep up" (rho = 22.5).
    guess = replace(device("g", [450.0] * 4, a=1e-3, b=0.05, arrival_rate=50.0, mean_size=450.0),
                    model=PerfModel(a=1e-3, b=0.05, fitted=False))
    cfg = CoordinatorConfig(max_overhead_fraction=1.0)
    alone, _ = choose_step_time((measured,), cfg)
    target, bounds = choose_step_time((measured, guess), cfg)
    assert target == pytest.approx(alone) and bounds["line_rate"] == pytest.approx(0.1 / 0.45)
    plan = plan_step(state(measured, guess), cfg, "ett-stream")
    assert plan.devices[1].count >= 1  # filled to T (at least its floor), not left out
    # Before any device is measured, T is the guessed time of each device's equal share of global_batch (the
    # fixed policies' first batch): steps that measure the fleet and train, not a line-rate or backlog target
    # built on guesses, nor steps of one sample each (a noisy update at the full learning rate).
    unmeasured = replace(measured, model=PerfModel(a=1e-3, b=0.1, fitted=False))
    cold = cfg.model_copy(update={"global_batch": 4})
    both, bounds = choose_step_time((unmeasured, guess), cold)
    assert bounds == {"warm_share": pytest.approx(0.05 + 2 * 0.45)} and both == pytest.approx(0.95)
    first = plan_step(state(unmeasured, guess), cold, "ett-stream")
    assert [d.count for d in first.devices] == [4, 2]  # each at least its share; the small samples fill to T


def test_a_device_known_by_nothing_but_its_lag_is_given_its_share_of_the_global_batch_by_count() -> None:
    """No index and no fitted model: neither its sample sizes nor its speed are known, so a size budget would rest
    on guesses in units nobody reported; it gets a count, its equal share of global_batch, as under static."""
    blind = [DeviceState(device_id=f"b{i}", model=PerfModel(a=1e-3, b=0.05, fitted=False), pending=None, lag=lag,
                         end_offset=lag) for i, lag in enumerate((1000, 10))]
    cfg = CoordinatorConfig(global_batch=64)
    plan = plan_step(PlanningState(step=0, now=0.0, devices=tuple(blind)), cfg, "ett-stream")
    assert [d.count for d in plan.devices] == [32, 10] and plan.notes.keys() == {"warm_share"}
    assert [d.total_size for d in plan.devices] == [32.0, 10.0]  # the placeholder mean size, dropped on the wire
    # The same device beside a measured one still gets its share, not the measured T over a guessed speed.
    measured = device("m", [5.0] * 400, a=1e-4, b=0.01, arrival_rate=0.0, mean_size=5.0)
    mixed = plan_step(PlanningState(step=0, now=0.0, devices=(measured, blind[0])), cfg, "ett-stream")
    assert mixed.devices[1].count == 32


def test_unknown_index_gives_count_and_size_budget() -> None:
    blind = DeviceState(device_id="b", model=device("x", [1.0]).model, pending=None, lag=1000, mean_size=10.0,
                        end_offset=5000)
    plan = plan_step(PlanningState(step=0, now=0.0, devices=(blind,)),
                     CoordinatorConfig(target_step_seconds=101.0), "ett-stream")
    only = plan.devices[0]
    assert only.offsets is None and only.count == 10 and only.total_size == pytest.approx(101.0)


@st.composite
def fleets(draw: st.DrawFn) -> tuple[PlanningState, CoordinatorConfig]:
    n = draw(st.integers(1, 6))
    devs = []
    for i in range(n):
        sizes = draw(st.lists(st.integers(1, 60), min_size=0, max_size=40))
        limit = draw(st.one_of(st.none(), st.floats(5.0, 400.0)))
        devs.append(device(
            f"d{i}", [float(s) for s in sizes], a=draw(st.floats(1e-4, 1e-1)), b=draw(st.floats(0.0, 0.5)),
            first_offset=draw(st.integers(0, 10_000)), arrival_rate=draw(st.floats(0.0, 200.0)),
            mean_size=draw(st.floats(1.0, 60.0)), size_limit=limit,
        ))
    cfg = CoordinatorConfig(
        b_min=draw(st.integers(0, 5)), b_max=draw(st.integers(5, 30)), global_batch=draw(st.integers(1, 100)),
        target_step_seconds=draw(st.one_of(st.none(), st.floats(0.01, 5.0))),
    )
    return state(*devs), cfg


@settings(max_examples=150, deadline=None)
@given(fleets(), st.sampled_from(sorted(POLICIES)))
def test_no_plan_repeats_a_sample_or_breaks_memory(fleet: tuple[PlanningState, CoordinatorConfig],
                                                    policy: str) -> None:
    st_, cfg = fleet
    plan = plan_step(st_, cfg, policy)
    for dev, batch in zip(st_.devices, plan.devices, strict=True):
        assert dev.pending is not None and batch.offsets is not None
        offsets = list(batch.offsets)
        assert len(set(offsets)) == len(offsets) == batch.count
        assert set(offsets) <= set(dev.pending.offsets.tolist())
        if dev.size_limit is not None:
            assert batch.total_size <= dev.size_limit * cfg.memory_headroom + 1e-9
        assert batch.count <= cfg.b_max or policy in ("static",)


@settings(max_examples=150, deadline=None)
@given(fleets())
def test_ett_stream_never_idles_a_device_with_trainable_samples(fleet: tuple[PlanningState, CoordinatorConfig]) -> None:
    st_, cfg = fleet
    plan = plan_step(st_, cfg.model_copy(update={"sit_out_every": 0}), "ett-stream")
    for dev, batch in zip(st_.devices, plan.devices, strict=True):
        assert dev.pending is not None
        limit = np.inf if dev.size_limit is None else dev.size_limit * cfg.memory_headroom
        if (dev.pending.sizes <= limit).any():
            assert batch.count >= 1
            # The oldest trainable sample is always in the batch: nothing starves.
            oldest = dev.pending.offsets[np.flatnonzero(dev.pending.sizes <= limit)[0]]
            assert oldest in set(batch.offsets.tolist())
        else:
            assert batch.count == 0


def test_a_fit_flat_over_the_sizes_it_saw_does_not_promise_a_batch_far_beyond_them() -> None:
    """A device measured at sizes 4,000-6,000 whose time hardly varied there (fixed costs dominate) fits a slope near
    zero: its line says ten times the batch takes the same time. Its batch grows at most max_batch_growth times
    the largest it was measured at; a well-measured device beside it fills the target as before."""
    cfg = CoordinatorConfig(global_batch=400, model_window=8)
    bank = ModelBank.create(1, cfg)
    for step, (size, seconds) in enumerate([(5000, 0.150), (6000, 0.152), (4000, 0.149), (5500, 0.151)]):
        bank = bank.update(np.array([size]), np.array([seconds]), np.array([True]), step, cfg)
    flat = bank.model(0)
    assert flat.fitted and flat.largest == 6000 and flat.capacity(0.3) > 50_000
    fast = replace(device("flat", [50.0] * 2000), model=flat)
    steady = device("steady", [50.0] * 2000, a=2.5e-5, b=0.05)
    plan = plan_step(state(fast, steady), cfg.model_copy(update={"target_step_seconds": 0.3}), "ett-stream")
    assert plan.devices[0].total_size <= 2 * 6000 and plan.devices[0].count == 240
    assert plan.devices[1].total_size == pytest.approx(10_000, abs=50)  # (0.3 - 0.05) / 2.5e-5: not capped
    unbounded = cfg.model_copy(update={"target_step_seconds": 0.3, "max_batch_growth": None})
    assert plan_step(state(fast, steady), unbounded, "ett-stream").devices[0].total_size > 50_000


@settings(max_examples=60, deadline=None)
@given(fleets())
def test_a_device_sitting_out_trains_its_oldest_sample_within_sit_out_every_steps(
    fleet: tuple[PlanningState, CoordinatorConfig],
) -> None:
    st_, cfg = fleet
    cfg = cfg.model_copy(update={"sit_out_every": 4})
    plans = [plan_step(replace(st_, step=s), cfg, "ett-stream") for s in range(4)]
    for i, dev in enumerate(st_.devices):
        assert dev.pending is not None
        limit = np.inf if dev.size_limit is None else dev.size_limit * cfg.memory_headroom
        if (dev.pending.sizes <= limit).any():
            oldest = dev.pending.offsets[np.flatnonzero(dev.pending.sizes <= limit)[0]]
            assert any(oldest in set(p.devices[i].offsets.tolist()) for p in plans)


def test_a_device_whose_fixed_cost_alone_outlasts_the_fleets_step_sits_out_but_one_step_in_n() -> None:
    # Tecator's shape: each rank's step costs b + a per sample, the slow rank 4x both (an emulated device).
    sizes = np.full(400, 100.0)
    fast = [device(f"d{i}", sizes, a=2.4e-5, b=0.027, mean_size=100.0) for i in range(3)]
    slow = device("slow", sizes, a=9.6e-5, b=0.109, mean_size=100.0)
    cfg = CoordinatorConfig(global_batch=64, sit_out_every=8)
    counts = []
    for step in range(8):
        plan = plan_step(replace(state(*fast, slow), step=step), cfg, "ett-stream")
        counts.append([b.count for b in plan.devices])
        if plan.devices[3].count == 0:  # the others carry the global batch, at their equal time
            assert sum(counts[-1]) >= 63 and plan.step_time_target < 0.085
    assert sum(c[3] == 0 for c in counts) == 7 and sum(c[3] > 0 for c in counts) == 1
    always = plan_step(state(*fast, slow), cfg.model_copy(update={"sit_out_every": 0}), "ett-stream")
    assert always.devices[3].count >= 1 and always.step_time_target >= 0.109 + 9.6e-3
