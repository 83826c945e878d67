"""`ett-stream` (default): equal estimated training time per step, consuming at each device's line rate.

1. Step-time target T. A device with arrival rate r, mean sample size m and model T(s) = a·s + b
   keeps up with its stream iff its utilisation rho = a·r·m < 1, and then needs a step of at least
   b / (1 - rho·(1 + headroom)) to train, within it, what arrives during it plus some spare to drain
   backlog. T is the longest such need over the devices that can keep up (so every one of them
   trains at line rate), and at least long enough that the fixed cost b is at most
   `max_overhead_fraction` of a step. When no device has a stream it can keep up with (backlog
   only, e.g. an epoch over stored data), T is the equal time in which the fleet trains
   `global_batch` samples. Either way every device must be able to train b_min samples; T is
   clamped to [min_step_seconds, max_step_seconds]; `target_step_seconds` fixes it instead.
   Devices that cannot keep up at any T simply fill T; their backlog is the truncation policy's.
2. Fill. Each device's size budget is (T - b) / a, within its memory. It takes its oldest pending
   samples while they fit (so nothing starves), then up to `best_fit_rounds` more, each the largest
   remaining sample that still fits the gap (size-aware best fit). A device with pending samples
   always trains at least max(b_min, 1) of them when memory allows, even past T. Samples larger
   than memory allows are never planned (the trainer dead-letters them).

All devices are packed at once on flattened arrays, so planning a thousand devices costs a few
numpy passes rather than a Python loop per sample.
"""

from __future__ import annotations

import numpy as np

from streamtrain.config import CoordinatorConfig

from ..state import DeviceBatch, DeviceState, Plan, PlanningState
from .common import normalized, size_limit, with_weights

__all__ = ["choose_step_time", "plan_ett_stream"]


def choose_step_time(devices: tuple[DeviceState, ...], config: CoordinatorConfig) -> tuple[float, dict[str, float]]:
    """The step-time target T and the bounds it came from (line rate, overhead, backlog batch, b_min)."""
    if config.target_step_seconds is not None:
        return config.target_step_seconds, {"fixed": config.target_step_seconds}
    a = np.array([d.model.a for d in devices])
    b = np.array([d.model.b for d in devices])
    m = np.array([d.mean_size for d in devices])
    rate = np.array([d.arrival_rate for d in devices])
    active = np.array([d.pending_count > 0 for d in devices]) | (rate > 0)
    need = a * rate * m * (1.0 + config.line_rate_headroom)
    keeps_up = active & (rate > 0) & (need < 1.0)
    bounds: dict[str, float] = {}
    if keeps_up.any():
        bounds["line_rate"] = float((b[keeps_up] / (1.0 - need[keeps_up])).max())
        bounds["overhead"] = float(b[active].max() / config.max_overhead_fraction)
    elif active.any():
        # Backlog only: the equal time at which the fleet trains global_batch samples (LB-BSP, CHRONICA).
        inv = 1.0 / np.maximum(a[active] * m[active], 1e-12)
        bounds["global_batch"] = float((config.global_batch + (b[active] * inv).sum()) / inv.sum())
    want = max(config.b_min, 1)
    bmin = 0.0
    for d in devices:
        if d.pending is not None and len(d.pending):
            first = float(d.pending.sizes[:want].sum())
        elif d.pending is None and d.lag > 0:
            first = min(want, d.lag) * d.mean_size
        else:
            continue
        bmin = max(bmin, float(d.model.predict(first)))
    bounds["b_min"] = bmin
    target = float(np.clip(max(bounds.values()), config.min_step_seconds, config.max_step_seconds))
    return target, bounds


def _segment_cumsum(values: np.ndarray, starts: np.ndarray, seg: np.ndarray) -> np.ndarray:
    cum = np.cumsum(values)
    base = np.concatenate([[0.0], cum])[starts]
    return cum - base[seg]


def _fill_indexed(
    devices: list[DeviceState], budgets: np.ndarray, limits: np.ndarray, config: CoordinatorConfig
) -> list[np.ndarray]:
    """Positions chosen in each device's pending index (devices all have a non-empty index)."""
    lengths = np.array([len(d.pending) for d in devices])  # type: ignore[arg-type]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    seg = np.repeat(np.arange(len(devices)), lengths)
    sizes = np.concatenate([d.pending.sizes for d in devices])  # type: ignore[union-attr]
    idx = np.arange(len(sizes))
    fits = sizes <= limits[seg]
    eff = np.where(fits, sizes, 0.0)
    cum = _segment_cumsum(eff, starts, seg)
    rank = _segment_cumsum(fits.astype(np.float64), starts, seg) - 1.0
    chosen = fits & (cum <= budgets[seg]) & (rank < config.b_max)  # budgets are within memory
    # Oldest-first floor: at least max(b_min, 1) samples while memory allows, even past the target.
    floor = max(config.b_min, 1)
    chosen |= fits & (rank < min(floor, config.b_max)) & (cum <= limits[seg])
    big = len(sizes)
    count = np.add.reduceat(chosen.astype(np.int64), starts)
    used = np.add.reduceat(np.where(chosen, sizes, 0.0), starts)
    for _ in range(config.best_fit_rounds):
        gap = budgets - used
        cand = fits & ~chosen & (sizes <= gap[seg]) & (count[seg] < config.b_max)
        if not cand.any():
            break
        val = np.where(cand, sizes, -1.0)
        best = np.maximum.reduceat(val, starts)
        first = np.minimum.reduceat(np.where(cand & (val == best[seg]), idx, big), starts)
        hit = first < big
        pick = first[hit]
        chosen[pick] = True
        count[hit] += 1
        used[hit] += sizes[pick]
    local = idx - starts[seg]
    sel = np.flatnonzero(chosen)
    return np.split(local[sel], np.cumsum(count)[:-1])


def plan_ett_stream(state: PlanningState, config: CoordinatorConfig) -> Plan:
    """Plan equal-ETT batches at the chosen step time from each device's own pending samples."""
    devices = state.devices
    if not devices:
        return Plan("ett-stream", state.step, 0.0, 0.0, ())
    target, bounds = choose_step_time(devices, config)
    limits = np.array([size_limit(d, config) for d in devices])
    budgets = np.minimum([d.model.capacity(target) for d in devices], limits)
    batches: list[DeviceBatch | None] = [None] * len(devices)
    indexed = [i for i, d in enumerate(devices) if d.pending is not None and len(d.pending)]
    if indexed:
        picks = _fill_indexed([devices[i] for i in indexed], budgets[indexed], limits[indexed], config)
        for i, pos in zip(indexed, picks, strict=True):
            d = devices[i]
            assert d.pending is not None
            total = float(d.pending.sizes[pos].sum())
            predicted = float(d.model.predict(total)) if len(pos) else 0.0
            batches[i] = DeviceBatch(d.device_id, d.pending.offsets[pos], len(pos), total, predicted)
    floor = max(config.b_min, 1)
    for i, d in enumerate(devices):
        if batches[i] is not None:
            continue
        if d.pending is not None:  # indexed but empty
            batches[i] = DeviceBatch(d.device_id, d.pending.offsets[:0], 0, 0.0, 0.0)
            continue
        room = budgets[i]
        fits = limits[i] // d.mean_size if np.isfinite(limits[i]) else d.lag
        count = max(int(min(d.lag, config.b_max, max(room // d.mean_size, floor), fits)), 0)
        budget = max(room, count * d.mean_size) if count else 0.0
        predicted = float(d.model.predict(budget)) if count else 0.0
        batches[i] = DeviceBatch(d.device_id, None, count, budget, predicted)
    done = [b for b in batches if b is not None]
    amounts = [b.count if config.weight_by == "samples" else b.total_size for b in done]
    weighted = with_weights(done, normalized(np.array(amounts, dtype=np.float64)))
    total = sum(b.count for b in weighted)
    return Plan("ett-stream", state.step, target, total / config.global_batch, weighted, notes=bounds)
