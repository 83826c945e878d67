"""The fast planners against their plain specification (`coordinator.policies.reference`), on random fleets.

- ett-stream's fill: the numpy fill of the whole fleet (`_fill_indexed`) picks, device by device,
  exactly what `reference.fill_device` picks; whole plans equal `plan_ett_stream_reference`'s;
- chronica: `plan_chronica` (the greedy on runs of equal ETT) equals the sample-at-a-time greedy
  (`plan_chronica_reference`), plan for plan;
- a few hand-made cases that say what the specification means.

Sizes are integers, as on the wire (the fast paths promise exact equality for those).
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain.config import CoordinatorConfig
from streamtrain.coordinator.perfmodel import PerfModel
from streamtrain.coordinator.policies.chronica import _pack_fast, plan_chronica, plan_chronica_reference
from streamtrain.coordinator.policies.ett_stream import _fill_indexed, plan_ett_stream, plan_ett_stream_reference
from streamtrain.coordinator.policies.reference import fill_device, fill_reference
from streamtrain.coordinator.state import DeviceState, PendingIndex, Plan, PlanningState

#: Integer sizes of one device's pending samples: a few distinct values (ties), or many.
SIZES = st.sampled_from([5, 60, 3000]).flatmap(lambda top: st.lists(st.integers(1, top), min_size=1, max_size=60))


@st.composite
def configs(draw: st.DrawFn) -> CoordinatorConfig:
    b_max = draw(st.integers(1, 40))
    return CoordinatorConfig(
        b_min=draw(st.integers(0, min(4, b_max))), b_max=b_max, best_fit_rounds=draw(st.integers(0, 6)),
        global_batch=draw(st.integers(1, 300)), best_fit_lookahead=draw(st.sampled_from([None, 1, 2, 5, 20])),
        weight_by=draw(st.sampled_from(["samples", "size"])))


def _device(name: str, sizes: list[int], a: float, b: float, limit: float | None, first: int = 0,
            **kw: object) -> DeviceState:
    n = len(sizes)
    pending = PendingIndex(np.arange(first, first + 2 * n, 2), np.asarray(sizes, dtype=float),
                           np.arange(n, dtype=float))
    return DeviceState(name, PerfModel(a=a, b=b, fitted=True), pending=pending, lag=n, size_limit=limit,
                       **kw)  # type: ignore[arg-type]


@st.composite
def fills(draw: st.DrawFn) -> tuple[list[DeviceState], np.ndarray, np.ndarray, CoordinatorConfig]:
    """Devices with pending samples, each with a memory limit and a size budget within it."""
    devices, budgets, limits = [], [], []
    for i in range(draw(st.integers(1, 8))):
        sizes = draw(SIZES)
        limit = draw(st.one_of(st.just(math.inf), st.floats(5.0, 400.0)))
        # Budgets below zero (a fixed cost past the target), anywhere, exactly everything pending, or cutting the
        # oldest-first part short somewhere inside the backlog (so that best fit has a gap to fill).
        inside = float(sum(sizes[:draw(st.integers(0, len(sizes)))])) + draw(st.floats(0.0, 1.0)) * max(sizes)
        budget = draw(st.one_of(st.floats(-20.0, 600.0), st.just(float(sum(sizes))),
                                st.just(float(sum(sizes)) + 0.5), st.just(inside)))
        devices.append(_device(f"d{i}", sizes, 1e-3, 0.01, None if math.isinf(limit) else limit))
        limits.append(limit)
        budgets.append(min(budget, limit))
    return devices, np.array(budgets), np.array(limits), draw(configs())


@settings(max_examples=500, deadline=None)
@given(fills())
def test_the_fast_fill_picks_exactly_what_the_plain_fill_picks(
        case: tuple[list[DeviceState], np.ndarray, np.ndarray, CoordinatorConfig]) -> None:
    devices, budgets, limits, cfg = case
    fast = _fill_indexed(devices, budgets, limits, cfg)
    plain = fill_reference(devices, budgets, limits, cfg)
    assert [f.tolist() for f in fast] == [p.tolist() for p in plain]


@st.composite
def fleets(draw: st.DrawFn, indexed: bool = True) -> tuple[PlanningState, CoordinatorConfig]:
    """Fleets of measured devices with streams, backlogs, memory limits, and (unless `indexed`) some devices
    the coordinator has no pending index for (plans give them a count)."""
    devices = []
    for i in range(draw(st.integers(1, 7))):
        sizes = draw(SIZES)
        limit = draw(st.one_of(st.none(), st.floats(5.0, 400.0)))
        a, b = draw(st.floats(1e-4, 1e-2)), draw(st.floats(0.0, 0.1))
        rate = draw(st.one_of(st.just(0.0), st.floats(1.0, 200.0)))
        mean = draw(st.floats(1.0, 50.0))
        if indexed or draw(st.booleans()):
            devices.append(_device(f"d{i}", sizes, a, b, limit, first=draw(st.integers(0, 5000)),
                                   arrival_rate=rate, mean_size=mean))
        else:
            devices.append(DeviceState(f"d{i}", PerfModel(a=a, b=b, fitted=True), arrival_rate=rate,
                                       mean_size=mean, lag=len(sizes), size_limit=limit))
    return PlanningState(step=draw(st.integers(0, 50)), now=10.0, devices=tuple(devices)), draw(configs())


def _assert_same_plan(fast: Plan, plain: Plan) -> None:
    assert (fast.policy, fast.step, fast.step_time_target, fast.lr_scale, fast.notes) == (
        plain.policy, plain.step, plain.step_time_target, plain.lr_scale, plain.notes)
    assert len(fast.devices) == len(plain.devices)
    for x, y in zip(fast.devices, plain.devices, strict=True):
        assert (x.device_id, x.count, x.total_size, x.predicted_seconds, x.weight) == (
            y.device_id, y.count, y.total_size, y.predicted_seconds, y.weight)
        assert (x.offsets is None) == (y.offsets is None)
        if x.offsets is not None and y.offsets is not None:
            assert x.offsets.tolist() == y.offsets.tolist()


@settings(max_examples=300, deadline=None)
@given(fleets(indexed=False))
def test_the_fast_ett_stream_plan_is_the_plain_one(fleet: tuple[PlanningState, CoordinatorConfig]) -> None:
    state, cfg = fleet
    _assert_same_plan(plan_ett_stream(state, cfg), plan_ett_stream_reference(state, cfg))


@st.composite
def chronica_fleets(draw: st.DrawFn) -> tuple[PlanningState, CoordinatorConfig]:
    """What takes the fast greedy's different branches: small integer sizes (radix sort), sizes past its range
    (general sort), long runs of ties, memory limits that bind, equal fixed costs (ties in the heap), a zero
    slope, empty pending indexes, and global batches larger than everything pending."""
    devices = []
    same_b = draw(st.booleans())
    for i in range(draw(st.integers(1, 10))):
        sizes = draw(st.one_of(SIZES, st.lists(st.integers(60_000, 70_000), max_size=30), st.just([])))
        a = draw(st.one_of(st.just(0.0), st.floats(1e-4, 1e-2)))
        b = 0.02 if same_b else draw(st.floats(0.0, 0.1))
        limit = draw(st.one_of(st.none(), st.floats(1.0, 2000.0)))
        arrivals = sorted(draw(st.lists(st.integers(0, 4), min_size=len(sizes), max_size=len(sizes))))
        pending = PendingIndex(np.arange(len(sizes)) * 3 + i, np.asarray(sizes, dtype=float),
                               np.asarray(arrivals, dtype=float))  # equal arrival times happen
        devices.append(DeviceState(f"d{i}", PerfModel(a=a, b=b, fitted=True), pending=pending,
                                   mean_size=float(np.mean(sizes)) if sizes else 1.0, lag=len(sizes),
                                   size_limit=limit))
    cfg = CoordinatorConfig(global_batch=draw(st.integers(1, 400)), b_max=draw(st.integers(1, 60)))
    return PlanningState(step=draw(st.integers(0, 50)), now=10.0, devices=tuple(devices)), cfg


@settings(max_examples=400, deadline=None)
@given(chronica_fleets())
def test_the_fast_chronica_plan_is_the_sample_at_a_time_greedys(
        fleet: tuple[PlanningState, CoordinatorConfig]) -> None:
    state, cfg = fleet
    _assert_same_plan(plan_chronica(state, cfg), plan_chronica_reference(state, cfg))


def test_the_fast_chronica_plan_is_the_greedys_on_a_large_backlogged_fleet() -> None:
    rng = np.random.default_rng(9)
    devices = []
    for i in range(64):
        sizes = np.maximum(np.rint(rng.lognormal(3.6, 0.6, 512)), 1.0)
        devices.append(DeviceState(
            f"d{i}", PerfModel(a=2e-4 / rng.uniform(1.0, 4.0), b=0.02, fitted=True),
            pending=PendingIndex(np.arange(512), sizes, np.sort(rng.uniform(0, 10, 512))),
            mean_size=45.0, lag=512, size_limit=20_000.0))
    state = PlanningState(step=3, now=10.0, devices=tuple(devices))
    cfg = CoordinatorConfig(global_batch=64 * 32)
    assert _pack_fast(state, cfg) is not None  # the fast path itself, not its hand-back to the reference
    fast = plan_chronica(state, cfg)
    _assert_same_plan(fast, plan_chronica_reference(state, cfg))
    assert sum(d.count for d in fast.devices) == 64 * 32


def test_the_plain_fill_says_what_the_fill_means() -> None:
    cfg = CoordinatorConfig(b_min=0, b_max=10, best_fit_rounds=1, best_fit_lookahead=None)
    # Oldest first while the total fits 10 (4 + 3), then the largest later sample that fits the gap of 3.
    assert fill_device([4, 3, 5, 2, 3, 1], 10.0, math.inf, cfg) == [0, 1, 4]
    # A sample past memory is never planned; the floor of one sample holds even past the budget.
    assert fill_device([50, 8, 2], 1.0, 20.0, cfg) == [1]
    # The lookahead bounds where best fit looks: only the first sample past the oldest-first part.
    near = cfg.model_copy(update={"best_fit_lookahead": 1})
    assert fill_device([4, 3, 5, 2, 3], 10.0, math.inf, near) == [0, 1]
    # b_max caps the count; b_min lifts it within memory.
    assert fill_device([1] * 20, 100.0, math.inf, cfg) == list(range(10))
    assert fill_device([5, 5, 5], 0.0, 12.0, cfg.model_copy(update={"b_min": 3})) == [0, 1]
