"""`chronica`: CHRONICA's data scheduler (§V-B, Alg. 2) — a fixed global batch packed so every device
gets the same estimated training time (ETT).

Each pending sample's ETT on its own device is a_i·size (the step's fixed cost b_i starts every
device's load). The first pivot is the oldest pending sample in the fleet (the paper draws it at
random; in a stream the oldest is the natural start and keeps plans reproducible). Then, X - 1
times: the device with the least ETT so far takes, first-fit-decreasing, its largest sample whose
ETT fits the gap to the most loaded device, or its smallest when none fits. Memory limits and
b_max bound what a device can take. Gradients are weighted by the size trained (Eq. 7).

Without a pending index for every device, counts are split by equal predicted time instead.
"""

from __future__ import annotations

import bisect
import heapq
import logging
import math

import numpy as np

from streamtrain.config import CoordinatorConfig

from ..state import DeviceBatch, Plan, PlanningState
from .common import batch_from_count, count_caps, normalized, size_limit, solve_equal_time, with_weights

__all__ = ["plan_chronica"]

logger = logging.getLogger(__name__)


def plan_chronica(state: PlanningState, config: CoordinatorConfig) -> Plan:
    """Pack `global_batch` pending samples onto the devices by first-fit decreasing on ETT."""
    devices = state.devices
    if not devices:
        return Plan("chronica", state.step, 0.0, 0.0, ())
    if any(d.pending is None for d in devices):
        logger.debug("chronica: a device has no pending index; splitting counts by equal time")
        slopes = np.array([d.model.a * d.mean_size for d in devices])
        intercepts = np.array([d.model.b for d in devices])
        counts = solve_equal_time(slopes, intercepts, config.global_batch, count_caps(devices, config))
        batches: list[DeviceBatch] = [
            batch_from_count(d, int(c), config) for d, c in zip(devices, counts, strict=True)
        ]
    else:
        batches = _pack(state, config)
    weights = normalized(np.array([b.total_size for b in batches]))
    weighted = with_weights(batches, weights)
    target = max((b.predicted_seconds for b in weighted), default=0.0)
    total = sum(b.count for b in weighted)
    return Plan("chronica", state.step, target, total / config.global_batch, weighted)


def _pack(state: PlanningState, config: CoordinatorConfig) -> list[DeviceBatch]:
    devices = state.devices
    n = len(devices)
    # Per device: pending positions sorted by ETT (ascending), as parallel lists for bisect and pop.
    etts: list[list[float]] = []
    positions: list[list[int]] = []
    for d in devices:
        assert d.pending is not None
        ett = d.model.a * d.pending.sizes
        order = np.argsort(ett, kind="stable")
        etts.append(ett[order].tolist())
        positions.append(order.tolist())
    loads = [d.model.b for d in devices]
    room = [size_limit(d, config) for d in devices]
    chosen: list[list[int]] = [[] for _ in range(n)]
    budget = config.global_batch

    def take(i: int, k: int) -> None:
        pos = positions[i].pop(k)
        ett = etts[i].pop(k)
        chosen[i].append(pos)
        loads[i] += ett
        room[i] -= float(devices[i].pending.sizes[pos])  # type: ignore[union-attr]

    pivot = _oldest(state)
    if pivot is not None and budget > 0:
        i, pos = pivot
        if devices[i].pending.sizes[pos] <= room[i]:  # type: ignore[union-attr]
            take(i, positions[i].index(pos))
            budget -= 1
    heap = [(loads[i], i) for i in range(n) if etts[i]]
    heapq.heapify(heap)
    max_load = max(loads)
    while budget > 0 and heap:
        load, i = heapq.heappop(heap)
        if load != loads[i]:
            continue
        if len(chosen[i]) >= config.b_max or not etts[i]:
            continue
        a = devices[i].model.a
        room_ett = a * room[i] if math.isfinite(room[i]) else math.inf
        k = bisect.bisect_right(etts[i], min(max_load - loads[i], room_ett)) - 1
        if k < 0:
            if etts[i][0] > room_ett:
                continue  # memory full: this device takes no more
            k = 0  # nothing fits the gap: the smallest sample overshoots it least
        take(i, k)
        budget -= 1
        max_load = max(max_load, loads[i])
        if etts[i]:
            heapq.heappush(heap, (loads[i], i))
    out = []
    for i, d in enumerate(devices):
        assert d.pending is not None
        picked = np.sort(np.array(chosen[i], dtype=np.int64))
        total = float(d.pending.sizes[picked].sum()) if len(picked) else 0.0
        predicted = float(d.model.predict(total)) if len(picked) else 0.0
        out.append(DeviceBatch(d.device_id, d.pending.offsets[picked], len(picked), total, predicted))
    return out


def _oldest(state: PlanningState) -> tuple[int, int] | None:
    """(device index, position) of the fleet's oldest pending sample."""
    best: tuple[float, int, int] | None = None
    for i, d in enumerate(state.devices):
        if d.pending is not None and len(d.pending):
            pos = int(np.argmin(d.pending.arrivals))
            key = (float(d.pending.arrivals[pos]), i, pos)
            if best is None or key < best:
                best = key
    return None if best is None else (best[1], best[2])
