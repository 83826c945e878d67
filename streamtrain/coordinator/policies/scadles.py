"""`scadles`: ScaDLES §IV — batch ∝ stream rate, weighted aggregation by rate, linear LR scaling.

Device i trains b_i = S_i samples, its arrivals over `scadles_window_seconds`, clipped to
[b_min, b_max] and to its memory; gradients are weighted r_i = S_i / ΣS (Eq. 4a); the learning
rate scales linearly with the global batch against the base batch B (`global_batch`).
"""

from __future__ import annotations

import numpy as np

from streamtrain.config import CoordinatorConfig

from ..state import Plan, PlanningState
from .common import batch_from_count, normalized, with_weights

__all__ = ["plan_scadles"]


def plan_scadles(state: PlanningState, config: CoordinatorConfig) -> Plan:
    """Batch sizes from stream rates; weights from stream rates (by counts when no rate is known)."""
    devices = state.devices
    if not devices:
        return Plan("scadles", state.step, 0.0, 0.0, ())
    rates = np.array([d.arrival_rate for d in devices], dtype=np.float64)
    wanted = np.clip(np.rint(rates * config.scadles_window_seconds), config.b_min, config.b_max).astype(np.int64)
    batches = [batch_from_count(d, int(c), config) for d, c in zip(devices, wanted, strict=True)]
    counts = np.array([b.count for b in batches], dtype=np.float64)
    weights = normalized(rates) if rates.sum() > 0 else normalized(counts)
    # A device that trains nothing this step contributes no gradient, whatever its rate.
    weights = normalized(np.where(counts > 0, weights, 0.0))
    weighted = with_weights(batches, weights)
    target = max((b.predicted_seconds for b in weighted), default=0.0)
    return Plan("scadles", state.step, target, float(counts.sum()) / config.global_batch, weighted)
