"""What a warm-start plan keeps when no sample size is known yet (the service's step-0 plan)."""

from __future__ import annotations

from coordinator.policies import plan_step
from coordinator.service import Coordinator
from coordinator.state import plan_to_assignment
from streamtrain.config import CoordinatorConfig, StreamtrainConfig


def _warm(policy: str) -> list[tuple[int | None, int | None]]:
    cfg = StreamtrainConfig(coordinator=CoordinatorConfig(policy=policy, devices=("a", "b"), global_batch=64))
    service = Coordinator(cfg, serve_http=False)
    for device, end in (("a", 500), ("b", 700)):
        service.fleet.observe_offsets(device, log_start=0, end=end, committed=None, at=0.0)
    plan = plan_step(service.fleet.planning_state(0, now=0.0), service.ccfg)
    assignment = service._without_guessed_bounds(plan_to_assignment(plan, cfg.job))
    return [(p.count, p.size_budget) for p in assignment.devices]


def test_ett_stream_warm_plan_bounds_by_size_budget_only() -> None:
    parts = _warm("ett-stream")
    assert all(count is None and budget is not None and budget > 0 for count, budget in parts)


def test_count_based_warm_plan_bounds_by_count_only() -> None:
    parts = _warm("static")
    assert parts == [(32, None), (32, None)]
