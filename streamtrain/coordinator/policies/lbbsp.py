"""`lbbsp`: LB-BSP's analytical split — counts ∝ predicted sample speed, x_i = v_i / Σv · X (§3.2).

Speeds come from each device's `speed` estimate when it has one, else from its performance model
at its current operating point (samples per compute second). Counts are rounded to sum to X
(Alg. 1 line 6); a device capped by memory (LB-BSP's guard), b_max or its buffer hands its excess
to the others in proportion to their speeds. Gradients are weighted by batch size (Eq. 7).
"""

from __future__ import annotations

import numpy as np

from streamtrain.config import CoordinatorConfig

from ..state import DeviceState, Plan, PlanningState
from .common import batch_from_count, count_caps, normalized, round_to_total, with_weights

__all__ = ["plan_lbbsp", "predicted_speeds"]


def predicted_speeds(devices: tuple[DeviceState, ...], config: CoordinatorConfig) -> np.ndarray:
    """Samples per second each device is expected to train at its current batch size."""
    n = max(len(devices), 1)
    speeds = np.empty(len(devices))
    for i, d in enumerate(devices):
        if d.speed is not None:
            speeds[i] = d.speed
            continue
        x = d.last_samples if d.last_samples > 0 else max(config.global_batch / n, 1.0)
        seconds = float(d.model.predict(x * d.mean_size))
        speeds[i] = x / seconds if seconds > 0 else 0.0
    return speeds


def plan_lbbsp(state: PlanningState, config: CoordinatorConfig) -> Plan:
    """Split the global batch in proportion to predicted speed, within memory, b_max and buffers."""
    devices = state.devices
    if not devices:
        return Plan("lbbsp", state.step, 0.0, 0.0, ())
    speeds = predicted_speeds(devices, config)
    counts = round_to_total(speeds, config.global_batch, count_caps(devices, config))
    batches = [batch_from_count(d, int(c), config) for d, c in zip(devices, counts, strict=True)]
    weights = normalized(np.array([b.count for b in batches], dtype=np.float64))
    weighted = with_weights(batches, weights)
    total = sum(b.count for b in weighted)
    target = max((b.predicted_seconds for b in weighted), default=0.0)
    return Plan("lbbsp", state.step, target, total / config.global_batch, weighted)
