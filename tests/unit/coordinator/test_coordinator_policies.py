"""Each policy on hand-made states with answers worked out from its paper."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from coordinator_helpers import device, state

from streamtrain.config import CoordinatorConfig
from streamtrain.coordinator.policies import POLICIES, LbbCarry, get_policy, plan_step
from streamtrain.coordinator.state import plan_to_assignment
from streamtrain.wire.records import Assignment

# CHRONICA §V-B, Figs. 4-5: sample ETTs on two workers (a = 1, b = 0 so size = ETT). Worker 2's
# 156-second sample is the oldest in the fleet, so it is the first pivot.
W1 = [171.0, 129.0, 117.0, 105.0]
W2 = [156.0, 88.0]


def chronica_example(**kw: object) -> tuple:
    w1 = device("w1", W1, arrivals=[1, 2, 3, 4], **kw)  # type: ignore[arg-type]
    w2 = device("w2", W2, arrivals=[0, 5], **kw)  # type: ignore[arg-type]
    return w1, w2


def test_chronica_packs_the_paper_example_to_244_seconds() -> None:
    plan = plan_step(state(*chronica_example()), CoordinatorConfig(global_batch=4), "chronica")
    w1, w2 = plan.devices
    assert w1.predicted_seconds == 234.0  # 129 + 105
    assert w2.predicted_seconds == 244.0  # 156 + 88
    assert plan.predicted_step_seconds == 244.0
    assert list(w1.offsets) == [1, 3] and list(w2.offsets) == [0, 1]
    # Eq. 7: weights by the amount of data trained.
    assert w1.weight == pytest.approx(234 / 478) and w2.weight == pytest.approx(244 / 478)


def test_counting_samples_alone_takes_417_seconds() -> None:
    # The paper's counter-example: worker 1 three times faster, so it gets three of four samples.
    w1, w2 = chronica_example()
    w1 = replace(w1, speed=3.0)
    w2 = replace(w2, speed=1.0)
    plan = plan_step(state(w1, w2), CoordinatorConfig(global_batch=4), "lbbsp")
    assert [d.count for d in plan.devices] == [3, 1]
    assert plan.devices[0].predicted_seconds == 417.0  # 171 + 129 + 117
    assert plan.predicted_step_seconds == 417.0


def test_lbbsp_split_is_proportional_to_speed() -> None:
    # x_i = v_i / Σv · X with v = 1, 2, 5 samples/s and X = 80 -> 10, 20, 50.
    devs = [device(f"d{i}", [1.0] * 100, speed=v) for i, v in enumerate([1.0, 2.0, 5.0])]
    plan = plan_step(state(*devs), CoordinatorConfig(global_batch=80), "lbbsp")
    assert [d.count for d in plan.devices] == [10, 20, 50]
    assert [d.weight for d in plan.devices] == pytest.approx([10 / 80, 20 / 80, 50 / 80])


def test_lbbsp_speed_from_model_and_memory_guard() -> None:
    # Models: 0.01 s and 0.04 s per unit-size sample -> speeds 4:1; the fast one's memory holds 50.
    fast = device("fast", [1.0] * 200, a=0.01, size_limit=50 / 0.95)
    slow = device("slow", [1.0] * 200, a=0.04)
    plan = plan_step(state(fast, slow), CoordinatorConfig(global_batch=100), "lbbsp")
    assert [d.count for d in plan.devices] == [50, 50]
    assert plan.devices[0].total_size <= 50 + 1e-9
    unguarded = plan_step(state(device("fast", [1.0] * 200, a=0.01), slow), CoordinatorConfig(global_batch=100),
                          "lbbsp")
    assert [d.count for d in unguarded.devices] == [80, 20]


def lbb_state(times: list[float], carry: LbbCarry | None, counts: list[int]) -> object:
    devs = [device(f"d{i}", [1.0] * 100, a=0.1, last_seconds=t, last_samples=c)
            for i, (t, c) in enumerate(zip(times, counts, strict=True))]
    return state(*devs, carry=carry)


def test_lbb_thresholds_keep_fine_tune_and_rapid() -> None:
    cfg = CoordinatorConfig(global_batch=20)
    carry = LbbCarry((("d0", 10), ("d1", 10)))
    keep = plan_step(lbb_state([1.0, 1.02], carry, [10, 10]), cfg, "lbb")  # SE ≈ 0.02 < 0.05
    assert [d.count for d in keep.devices] == [10, 10] and keep.carry.action == "keep"
    fine = plan_step(lbb_state([1.0, 1.15], carry, [10, 10]), cfg, "lbb")  # SE ≈ 0.14
    assert [d.count for d in fine.devices] == [11, 9] and fine.carry.action == "fine"
    rapid = plan_step(lbb_state([1.0, 2.0], carry, [10, 10]), cfg, "lbb")  # SE ≈ 0.67 > 0.3
    # Rough models 0.1 and 0.2 s/sample: equal time at x0 = 2·x1, x0 + x1 = 20 -> 13, 7.
    assert [d.count for d in rapid.devices] == [13, 7] and rapid.carry.action == "rapid"
    assert rapid.carry.window_left == cfg.lbb_observation_window
    # Inside the observation window a large SE only fine-tunes (no oscillating re-solves).
    again = plan_step(lbb_state([2.0, 1.0], rapid.carry, [13, 7]), cfg, "lbb")
    assert again.carry.action == "fine" and [d.count for d in again.devices] == [12, 8]


def test_lbb_first_step_solves_equal_time_from_models() -> None:
    devs = [device("a", [1.0] * 100, a=0.1), device("b", [1.0] * 100, a=0.3)]
    plan = plan_step(state(*devs), CoordinatorConfig(global_batch=40), "lbb")
    assert [d.count for d in plan.devices] == [30, 10]


def test_scadles_batch_tracks_stream_rate_within_bounds() -> None:
    devs = [device(f"d{i}", [1.0] * 500, arrival_rate=r) for i, r in enumerate([2.0, 40.0, 900.0])]
    cfg = CoordinatorConfig(b_min=8, b_max=256, global_batch=100)
    plan = plan_step(state(*devs), cfg, "scadles")
    assert [d.count for d in plan.devices] == [8, 40, 256]
    assert [d.weight for d in plan.devices] == pytest.approx([2 / 942, 40 / 942, 900 / 942])
    assert plan.lr_scale == pytest.approx(304 / 100)


def test_static_splits_evenly_and_averages() -> None:
    devs = [device(f"d{i}", [1.0] * 50, a=0.1 * (i + 1)) for i in range(3)]
    plan = plan_step(state(*devs, step=0), CoordinatorConfig(global_batch=10), "static")
    assert sorted(d.count for d in plan.devices) == [3, 3, 4]
    assert all(d.weight == pytest.approx(1 / 3) for d in plan.devices)
    nxt = plan_step(state(*devs, step=1), CoordinatorConfig(global_batch=10), "static")
    assert [d.count for d in nxt.devices] != [d.count for d in plan.devices]  # the extra sample rotates


def test_registry_and_unknown_policy() -> None:
    assert set(POLICIES) == {"static", "lbbsp", "lbb", "scadles", "chronica", "ett-stream"}
    with pytest.raises(ValueError, match="known: static"):
        get_policy("nope")


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_plans_to_a_valid_wire_assignment(policy: str) -> None:
    devs = [device("x", [3.0, 5.0, 7.0], a=0.01, arrival_rate=5.0), device("y", [2.0, 2.0], a=0.02, first_offset=40)]
    plan = plan_step(state(*devs), CoordinatorConfig(global_batch=4), policy)
    record = plan_to_assignment(plan, job="j")
    again = Assignment.from_dict(record.to_dict())
    assert again.policy == policy and again.global_batch == plan.global_batch
    for d, p in zip(again.devices, plan.devices, strict=True):
        assert list(d.offsets) == [int(o) for o in p.offsets]
        assert d.count is None and d.size_budget is None
    weights = np.array([d.weight for d in again.devices])
    assert weights.sum() == pytest.approx(1.0)
