"""CHRONICA's fast greedy (`plan_chronica`, on runs of equal ETT) against the sample-at-a-time greedy it
replaced (`plan_chronica_reference`), plan for plan, on random fleets.

The states mix what takes the fast path's different branches: small integer sizes (radix sort),
float and very large sizes (general sort), many equal ETTs, memory limits that bind, small b_max,
empty and unequal pending indexes, equal fixed costs (ties in the heap), a slope of zero, and global
batches larger than everything pending.
"""

from __future__ import annotations

import numpy as np

from coordinator.perfmodel import PerfModel
from coordinator.policies.chronica import _pack_fast, plan_chronica, plan_chronica_reference
from coordinator.state import DeviceState, PendingIndex, Plan, PlanningState
from streamtrain.config import CoordinatorConfig


def _sizes(rng: np.random.Generator, k: int) -> np.ndarray:
    kind = rng.integers(0, 5)
    if kind == 0:
        return rng.integers(1, 6, k).astype(float)  # few distinct values: long runs of ties
    if kind == 1:
        return rng.integers(1, 300, k).astype(float)
    if kind == 2:
        return rng.uniform(0.5, 80.0, k)  # no ties at all
    if kind == 3:
        return rng.integers(60_000, 70_000, k).astype(float)  # past the radix path's range
    return np.maximum(np.rint(rng.lognormal(3.6, 0.6, k)), 1.0)


def _random_state(rng: np.random.Generator, step: int) -> PlanningState:
    n = int(rng.integers(1, 12))
    same_b = rng.random() < 0.5
    equal_len = rng.random() < 0.5
    base = int(rng.integers(0, 80))
    devices = []
    for i in range(n):
        k = base if equal_len else int(rng.integers(0, 80))
        sizes = _sizes(rng, k)
        a = 0.0 if rng.random() < 0.03 else float(rng.uniform(1e-4, 1e-2))
        b = 0.02 if same_b else float(rng.uniform(0, 0.1))
        limit = None if rng.random() < 0.5 else float(rng.uniform(1, 2000))
        arrivals = np.sort(rng.integers(0, 5, k).astype(float))  # equal arrival times happen
        devices.append(DeviceState(
            f"d{i}", PerfModel(a=a, b=b, fitted=True),
            pending=PendingIndex(np.sort(rng.choice(100_000, k, replace=False)), sizes, arrivals),
            mean_size=float(sizes.mean()) if k else 1.0, lag=k, size_limit=limit))
    return PlanningState(step=step, now=10.0, devices=tuple(devices))


def _assert_same(fast: Plan, slow: Plan) -> None:
    assert (fast.policy, fast.step, fast.step_time_target, fast.lr_scale) == (
        slow.policy, slow.step, slow.step_time_target, slow.lr_scale)
    assert len(fast.devices) == len(slow.devices)
    for x, y in zip(fast.devices, slow.devices, strict=True):
        assert x.device_id == y.device_id
        assert x.offsets is not None and y.offsets is not None
        assert x.offsets.tolist() == y.offsets.tolist()
        assert (x.count, x.total_size, x.predicted_seconds, x.weight) == (
            y.count, y.total_size, y.predicted_seconds, y.weight)


def test_fast_chronica_plans_exactly_what_the_reference_plans() -> None:
    rng = np.random.default_rng(5)
    planned = fast_path = 0
    for step in range(1200):
        state = _random_state(rng, step)
        cfg = CoordinatorConfig(global_batch=int(rng.integers(1, 400)), b_max=int(rng.integers(1, 60)))
        fast, slow = plan_chronica(state, cfg), plan_chronica_reference(state, cfg)
        _assert_same(fast, slow)
        planned += sum(d.count for d in slow.devices)
        fast_path += _pack_fast(state, cfg) is not None
    assert planned > 50_000  # the states really exercise the packing
    assert fast_path > 900  # ... through the fast path (it hands a few odd states to the reference)


def test_fast_chronica_matches_on_a_large_backlogged_fleet() -> None:
    rng = np.random.default_rng(9)
    devices = []
    for i in range(64):
        sizes = np.maximum(np.rint(rng.lognormal(3.6, 0.6, 512)), 1.0)
        speed = rng.uniform(1.0, 4.0)
        devices.append(DeviceState(
            f"d{i}", PerfModel(a=2e-4 / speed, b=0.02, fitted=True),
            pending=PendingIndex(np.arange(512), sizes, np.sort(rng.uniform(0, 10, 512))),
            mean_size=45.0, lag=512, size_limit=20_000.0))
    state = PlanningState(step=3, now=10.0, devices=tuple(devices))
    cfg = CoordinatorConfig(global_batch=64 * 32)
    fast, slow = plan_chronica(state, cfg), plan_chronica_reference(state, cfg)
    _assert_same(fast, slow)
    assert sum(d.count for d in fast.devices) == 64 * 32
