"""The specification of the fast planners, written plainly: one device, one sample at a time.

`ett_stream` and `chronica` plan a whole fleet with hand-tuned numpy passes (runs of equal sizes,
binary searches on running sums, masked maxima over flattened arrays). What those passes must
compute is written here as directly as it can be said; the tests check, over many random fleets,
that the fast paths give exactly these answers. Plans never call this module except where a fast
path hands an input it does not handle back to it (chronica with an infinite or NaN cost), and
`streamtrain bench scheduler --reference` times it next to the fast paths.

Sizes are compared as running sums in the order written here; for the integer sizes the wire
carries, that is exact in any order.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence

import numpy as np

from streamtrain.config import CoordinatorConfig

from ..state import DeviceBatch, DeviceState, PlanningState
from .common import size_limit

__all__ = ["fill_device", "fill_reference", "oldest_pending", "pack_chronica_reference"]


def fill_device(sizes: Sequence[float], budget: float, limit: float, config: CoordinatorConfig) -> list[int]:
    """ett-stream's fill of one device: which of its pending samples it trains this step.

    1. Samples larger than `limit` (its memory) are never planned; the rest are taken oldest first
       while their total stays within `budget`, up to `b_max` samples.
    2. However small the budget, at least max(b_min, 1) of them (at most b_max) are taken while
       their total stays within `limit`.
    3. Then `best_fit_rounds` times: among the `best_fit_lookahead` samples that fit in memory just
       past the oldest-first part (all of them when the lookahead is None), the largest that still
       fits the budget left (the oldest of equals) is added, while fewer than `b_max` are taken.

    Args:
        sizes: the device's pending sample sizes, oldest first.
        budget: the most total size the step-time target allows this device (within `limit`).
        limit: the most total size its memory holds (inf when unbounded).
        config: b_min, b_max, best_fit_rounds, best_fit_lookahead.

    Returns:
        Positions in `sizes` of the chosen samples, ascending.
    """
    fitting = [i for i, size in enumerate(sizes) if size <= limit]
    chosen: list[int] = []
    used = 0.0
    for i in fitting:  # 1. oldest first, within the budget
        if len(chosen) == config.b_max or used + sizes[i] > budget:
            break
        chosen.append(i)
        used += sizes[i]
    floor = min(max(config.b_min, 1), config.b_max)
    while len(chosen) < min(floor, len(fitting)):  # 2. the floor, within memory
        i = fitting[len(chosen)]
        if used + sizes[i] > limit:
            break
        chosen.append(i)
        used += sizes[i]
    # 3. best fit, among the samples just past the oldest-first part
    ahead = len(fitting) if config.best_fit_lookahead is None else config.best_fit_lookahead
    candidates = fitting[len(chosen):len(chosen) + ahead]
    for _ in range(config.best_fit_rounds):
        if len(chosen) >= config.b_max:
            break
        gap = budget - used
        fits_gap = [i for i in candidates if sizes[i] <= gap]
        if not fits_gap:
            break
        best = max(fits_gap, key=lambda i: (sizes[i], -i))  # the largest; the oldest of equals
        candidates.remove(best)
        chosen.append(best)
        used += sizes[best]
    return sorted(chosen)


def fill_reference(
    devices: list[DeviceState], budgets: np.ndarray, limits: np.ndarray, config: CoordinatorConfig
) -> list[np.ndarray]:
    """`fill_device` for each device with a pending index, in the shape ett-stream's planner takes a fill in.

    Args:
        devices: devices that each have a non-empty pending index.
        budgets: each device's size budget at the step-time target.
        limits: each device's memory limit (inf when unbounded).
        config: the coordinator settings.

    Returns:
        Each device's chosen positions in its pending index, ascending.
    """
    out = []
    for d, budget, limit in zip(devices, budgets.tolist(), limits.tolist(), strict=True):
        assert d.pending is not None
        out.append(np.array(fill_device(d.pending.sizes.tolist(), budget, limit, config), dtype=np.int64))
    return out


def oldest_pending(state: PlanningState) -> tuple[int, int] | None:
    """(device index, position) of the fleet's oldest pending sample (the first device's, among equals).

    Returns:
        None when nothing is pending.
    """
    best: tuple[float, int, int] | None = None
    for i, d in enumerate(state.devices):
        if d.pending is not None and len(d.pending):
            pos = int(np.argmin(d.pending.arrivals))
            key = (float(d.pending.arrivals[pos]), i, pos)
            if best is None or key < best:
                best = key
    return None if best is None else (best[1], best[2])


def pack_chronica_reference(state: PlanningState, config: CoordinatorConfig) -> list[DeviceBatch]:  # noqa: PLR0915  the paper's algorithm as written, step by step: the specification the fast path is tested against
    """CHRONICA's greedy (Alg. 2) over devices that all have a pending index, one sample at a time.

    A sample's ETT on its device is a·size; a device's load starts at its fixed cost b. The fleet's
    oldest pending sample is taken first. Then, while fewer than `global_batch` are taken: the
    device with the least load takes its largest sample whose ETT fits the gap to the most loaded
    device (the newest of equal ETTs), or its smallest (the oldest of equals) when none fits; a device stops at
    `b_max` samples, when it has none left, or when its smallest sample no longer fits its memory.

    Returns:
        Each device's batch (offsets ascending), unweighted.
    """
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

    pivot = oldest_pending(state)
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
