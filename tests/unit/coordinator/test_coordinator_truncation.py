"""Truncation keeps what it should: newest first, per policy, before the plan is packed."""

from __future__ import annotations

import pytest
from coordinator_helpers import device, state

from streamtrain.config import CoordinatorConfig
from streamtrain.coordinator.perfmodel import PerfModel
from streamtrain.coordinator.policies import plan_step
from streamtrain.coordinator.state import DeviceState
from streamtrain.coordinator.truncation import decide_truncation


def backlog() -> DeviceState:
    # 100 samples at offsets 1000..1099 of size 1..100, arriving one per second up to t = 99.
    return device("d", [float(s) for s in range(1, 101)], first_offset=1000, arrivals=list(range(100)),
                  arrival_rate=20.0)


def test_persist_keeps_everything() -> None:
    assert decide_truncation(backlog(), 1.0, 100.0, CoordinatorConfig()).truncate_before is None


def test_truncate_keeps_one_steps_worth_of_newest() -> None:
    # 20 samples/s x 0.5 s x 1 step = 10 kept: offsets 1090.. survive.
    cut = decide_truncation(backlog(), 0.5, 100.0, CoordinatorConfig(truncation="truncate"))
    assert cut.truncate_before == 1090 and cut.dropped == 90
    assert cut.dropped_size == pytest.approx(sum(range(1, 91)))


@pytest.mark.parametrize(
    ("limits", "first_kept"),
    [
        ({"max_lag_samples": 30}, 1070),
        ({"max_lag_seconds": 9.5}, 1091),  # arrivals at t <= 90 are older than 9.5 s
        ({"max_lag_size": 100 + 99 + 98}, 1097),  # the three newest fit, the fourth does not
        ({"max_lag_samples": 30, "max_lag_seconds": 50.0}, 1070),  # the tighter limit wins
        ({"max_lag_samples": 0}, 1100),  # nothing kept
    ],
)
def test_bounded_drops_oldest_beyond_each_limit(limits: dict[str, float], first_kept: int) -> None:
    cfg = CoordinatorConfig(truncation="bounded", **limits)  # type: ignore[arg-type]
    assert decide_truncation(backlog(), 1.0, 100.0, cfg).truncate_before == first_kept


def test_without_index_truncation_works_on_lag() -> None:
    blind = DeviceState(device_id="b", model=PerfModel(1.0, 0.0), pending=None, lag=500, end_offset=9000)
    cut = decide_truncation(blind, 1.0, 0.0, CoordinatorConfig(truncation="bounded", max_lag_samples=200))
    assert cut.truncate_before == 8800 and cut.dropped == 300


def test_plan_never_trains_what_it_truncates() -> None:
    cfg = CoordinatorConfig(truncation="bounded", max_lag_samples=10, target_step_seconds=1000.0)
    plan = plan_step(state(backlog(), last_step_seconds=1.0), cfg, "ett-stream")
    batch = plan.devices[0]
    assert batch.truncate_before == 1090 and batch.dropped == 90
    assert batch.offsets is not None and min(batch.offsets) >= 1090
