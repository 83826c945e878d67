"""`lbb`: LBB's batch coordinator (Alg. 2) driven by the straggler effect of the last step.

- first step (no carry): solve Eq. 3 — equal predicted time, Σx = X — from the devices' models;
- SE < fine threshold: leave the batch sizes alone;
- fine ≤ SE < rapid threshold, or any SE inside the observation window: fine-tune, moving
  `lbb_fine_step` samples from the straggler (longest compute) to the leader (shortest, among
  devices with memory to spare);
- SE ≥ rapid threshold outside the window: rapid re-solve from a rough linear model per device,
  slope (CT - a0) / CB with a0 its fixed cost, then open the observation window so rapid tuning
  cannot repeat on the next steps and oscillate.

The batch sizes and the window are the policy's carry (`LbbCarry`), passed back in each state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from streamtrain.config import CoordinatorConfig

from ..balance import straggler_effect
from ..state import Plan, PlanningState
from .common import batch_from_count, count_caps, normalized, solve_equal_time, with_weights

__all__ = ["LbbCarry", "plan_lbb"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LbbCarry:
    """What lbb remembers between steps.

    Attributes:
        counts: configured batch size per device id.
        window_left: steps during which rapid tuning stays barred.
        action: what the last plan did: solve, keep, fine or rapid.
        straggler_effect: SE of the step the last plan reacted to.
    """

    counts: tuple[tuple[str, int], ...]
    window_left: int = 0
    action: str = "solve"
    straggler_effect: float = 0.0


def plan_lbb(state: PlanningState, config: CoordinatorConfig) -> Plan:
    """Plan the next step from the last one's compute times and the carried batch sizes."""
    devices = state.devices
    if not devices:
        return Plan("lbb", state.step, 0.0, 0.0, ())
    caps = count_caps(devices, config, pending=False)
    carry = state.carry if isinstance(state.carry, LbbCarry) else None
    known = dict(carry.counts) if carry is not None else {}
    times = [d.last_seconds for d in devices]
    fresh = carry is None or any(d.device_id not in known for d in devices) or any(t is None for t in times)
    window_left = 0 if carry is None else max(carry.window_left - 1, 0)
    se = 0.0
    if fresh:
        slopes = np.array([d.model.a * d.mean_size for d in devices])
        intercepts = np.array([d.model.b for d in devices])
        counts = solve_equal_time(slopes, intercepts, config.global_batch, caps)
        action = "solve"
    else:
        counts = np.array([known[d.device_id] for d in devices], dtype=np.int64)
        t = np.array(times, dtype=np.float64)
        se = straggler_effect(t)
        if se < config.lbb_fine_threshold:
            action = "keep"
        elif se < config.lbb_rapid_threshold or window_left > 0:
            counts = _fine_tune(counts, t, caps, config.lbb_fine_step)
            action = "fine"
        else:
            counts = _rapid(state, counts, t, caps, config)
            window_left = config.lbb_observation_window
            action = "rapid"
    batches = [batch_from_count(d, int(c), config) for d, c in zip(devices, counts, strict=True)]
    weighted = with_weights(batches, normalized(np.array([b.count for b in batches], dtype=np.float64)))
    new_carry = LbbCarry(tuple((d.device_id, int(c)) for d, c in zip(devices, counts, strict=True)),
                         window_left, action, se)
    target = max((b.predicted_seconds for b in weighted), default=0.0)
    total = sum(b.count for b in weighted)
    logger.debug("lbb step %d: SE %.3f -> %s", state.step, se, action)
    return Plan("lbb", state.step, target, total / config.global_batch, weighted, carry=new_carry,
                notes={"straggler_effect": se, "window_left": float(window_left)})


def _fine_tune(counts: np.ndarray, times: np.ndarray, caps: np.ndarray, step: int) -> np.ndarray:
    counts = counts.copy()
    straggler = int(np.argmax(times))
    room = counts + step <= caps
    room[straggler] = False
    if not room.any() or counts[straggler] <= step:
        # Nobody can take more (memory), or the straggler would be emptied: LB-BSP keeps the sizes.
        return counts
    leader = int(np.flatnonzero(room)[np.argmin(times[room])])
    counts[straggler] -= step
    counts[leader] += step
    return counts


def _rapid(
    state: PlanningState, counts: np.ndarray, times: np.ndarray, caps: np.ndarray, config: CoordinatorConfig
) -> np.ndarray:
    slopes = np.empty(len(counts))
    intercepts = np.empty(len(counts))
    for i, d in enumerate(state.devices):
        a0 = d.model.b
        trained = d.last_samples if d.last_samples > 0 else int(counts[i])
        # LBB's rough model: the last step's throughput with the profiled start-up cost a0.
        slopes[i] = max(times[i] - a0, 1e-9) / trained if trained > 0 else d.model.a * d.mean_size
        intercepts[i] = a0
    return solve_equal_time(slopes, intercepts, config.global_batch, caps)
