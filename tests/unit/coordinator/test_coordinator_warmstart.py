"""What a warm-start plan keeps when no sample size is known yet (the service's step-0 plan)."""

from __future__ import annotations

from streamtrain.config import CoordinatorConfig, StreamtrainConfig
from streamtrain.coordinator.policies import plan_step
from streamtrain.coordinator.service import Coordinator
from streamtrain.coordinator.state import plan_to_assignment


def _warm(policy: str) -> list[tuple[int | None, int | None]]:
    cfg = StreamtrainConfig(coordinator=CoordinatorConfig(policy=policy, devices=("a", "b"), global_batch=64))
    service = Coordinator(cfg, serve_http=False)
    for device, end in (("a", 500), ("b", 700)):
        service.fleet.observe_offsets(device, log_start=0, end=end, committed=None, at=0.0)
    plan = plan_step(service.fleet.planning_state(0, now=0.0), service.ccfg)
    assignment = service._without_guessed_bounds(plan_to_assignment(plan, cfg.job))
    return [(p.count, p.size_budget) for p in assignment.devices]


def test_ett_stream_warm_plan_gives_each_device_its_share_by_count_only() -> None:
    # Neither sizes nor speeds known: the equal share of global_batch, by count (a size budget would be in
    # placeholder units the trainer's samples do not have).
    assert _warm("ett-stream") == [(32, None), (32, None)]


def test_count_based_warm_plan_bounds_by_count_only() -> None:
    parts = _warm("static")
    assert parts == [(32, None), (32, None)]
