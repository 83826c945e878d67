"""Planning policies, each a pure function `(PlanningState, CoordinatorConfig) -> Plan`, by name.

`plan_step` is what the service and the simulator call: it applies the truncation policy to each
device's backlog, runs the chosen policy on what is left, and records the truncate-before offsets
in the plan.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from streamtrain.config import CoordinatorConfig

from ..state import Plan, PlanningState
from ..truncation import apply_truncation, decide_truncation
from .chronica import plan_chronica
from .ett_stream import plan_ett_stream
from .lbb import LbbCarry, plan_lbb
from .lbbsp import plan_lbbsp
from .scadles import plan_scadles
from .static import plan_static

__all__ = ["POLICIES", "LbbCarry", "Policy", "get_policy", "plan_step", "plan_with"]

logger = logging.getLogger(__name__)

Policy = Callable[[PlanningState, CoordinatorConfig], Plan]

#: Every policy by the name `coordinator.policy` selects it with.
POLICIES: dict[str, Policy] = {
    "static": plan_static,
    "lbbsp": plan_lbbsp,
    "lbb": plan_lbb,
    "scadles": plan_scadles,
    "chronica": plan_chronica,
    "ett-stream": plan_ett_stream,
}


def get_policy(name: str) -> Policy:
    """The policy called `name`; ValueError naming the known ones otherwise."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None


def plan_step(state: PlanningState, config: CoordinatorConfig, policy: str | None = None) -> Plan:
    """Truncate each device's backlog per `config.truncation`, then plan with the policy.

    Args:
        state: the fleet at the step boundary.
        config: coordinator settings.
        policy: policy name; default `config.policy`.

    Returns:
        the plan, with each device's truncate-before offset and dropped count filled in.
    """
    return plan_with(state, config, get_policy(policy or config.policy))


def plan_with(state: PlanningState, config: CoordinatorConfig, policy: Policy) -> Plan:
    """`plan_step` with a policy function rather than a name (benchmarks time reference implementations)."""
    step_seconds = state.last_step_seconds or config.target_step_seconds or config.scadles_window_seconds
    decisions = [decide_truncation(d, step_seconds, state.now, config) for d in state.devices]
    trimmed = tuple(apply_truncation(d, c) for d, c in zip(state.devices, decisions, strict=True))
    plan = policy(state.with_devices(trimmed), config)
    if any(c.truncate_before is not None for c in decisions):
        by_id = {d.device_id: c for d, c in zip(state.devices, decisions, strict=True)}
        devices = tuple(
            replace(b, truncate_before=by_id[b.device_id].truncate_before, dropped=by_id[b.device_id].dropped)
            for b in plan.devices
        )
        plan = replace(plan, devices=devices)
    return plan
