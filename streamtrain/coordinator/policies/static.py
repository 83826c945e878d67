"""`static`: conventional data-parallel training — the same sample count on every device, plain average."""

from __future__ import annotations

import numpy as np

from streamtrain.config import CoordinatorConfig

from ..state import Plan, PlanningState
from .common import batch_from_count

__all__ = ["plan_static"]


def plan_static(state: PlanningState, config: CoordinatorConfig) -> Plan:
    """Give every device global_batch / n of its oldest samples (fewer if it has fewer or memory is short).

    The remainder of the division rotates with the step so no device always carries the extra sample.
    """
    n = len(state.devices)
    if n == 0:
        return Plan("static", state.step, 0.0, 0.0, ())
    base, extra = divmod(config.global_batch, n)
    counts = base + ((np.arange(n) - state.step) % n < extra)
    batches = tuple(
        batch_from_count(d, int(c), config, weight=1.0 / n) for d, c in zip(state.devices, counts, strict=True)
    )
    total = sum(b.count for b in batches)
    target = max((b.predicted_seconds for b in batches), default=0.0)
    return Plan("static", state.step, target, total / config.global_batch, batches)
