"""`ett-stream` (default): equal estimated training time per step, consuming at each device's line rate.

1. Step-time target T. A device with arrival rate r, mean sample size m and model T(s) = a·s + b
   keeps up with its stream iff its utilisation rho = a·r·m < 1. A step's wall period is T plus the
   measured overhead o outside compute (communication, the plan's and the data's round trip:
   `PlanningState.step_overhead_seconds`), and samples arrive through all of it, so the device
   needs T >= (b + rho'·o) / (1 - rho') with rho' = rho·(1 + headroom) to train, within T, what
   arrives during the period plus some spare to drain backlog. T is the longest such need over the
   devices that can keep up (so every one of them trains at line rate), and at least long enough
   that the fixed costs b + o are at most `max_overhead_fraction` of a step. When no device has a
   stream it can keep up with (backlog only, e.g. an epoch over stored data), T is the equal time in
   which the fleet trains `global_batch` samples. Either way every device must be able to train b_min
   samples; T is clamped to [min_step_seconds, max_step_seconds]; `target_step_seconds` fixes it.
   With plans made a step ahead, the next plan reaches the ranks a round trip r after they report
   (`PlanningState.plan_round_trip_seconds`): a step period shorter than r waits for it anyway, so
   while streams keep up T is at least r - o, and the ranks wait by batching (the report hold)
   rather than idle at the step boundary.
   Only devices with a fitted model count once there is one: a warm-start guess does not set T. Before
   any is fitted, T is the guessed time of each device's equal share of `global_batch` (the batch the
   fixed policies start from): the first steps measure the fleet at a batch that also trains the model
   sensibly, where steps of b_min samples would each be a noisy update at the full learning rate.
   Devices that cannot keep up at any T simply fill T; their backlog is the truncation policy's.
2. Fill. Each device's size budget is (T - b) / a, within its memory and within `max_batch_growth`
   times the largest batch its model was fitted on (a line is not trusted far past the sizes it saw).
   It takes its oldest pending samples while they fit (so nothing starves), then up to
   `best_fit_rounds` more, each the largest
   remaining sample that still fits the gap (size-aware best fit). A device with pending samples
   always trains at least max(b_min, 1) of them when memory allows, even past T. A device with neither
   an index nor a fitted model (no sample size or speed known: a size budget would rest on guesses in
   units nobody has reported) is given a count, its equal share of `global_batch`. Samples larger
   than memory allows are never planned (the trainer dead-letters them). Best fit chooses among the
   `best_fit_lookahead` samples just past the prefix, so planning costs the same however long the backlog.

All devices are packed at once on flattened arrays, so planning a thousand devices costs a few
numpy passes rather than a Python loop per sample. What step 2 must pick is written plainly, one device
and one sample at a time, in `reference.fill_device`; `plan_ett_stream_reference` plans with it, and
the tests check the two give the same plans.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

import numpy as np

from streamtrain.config import CoordinatorConfig

from ..state import DeviceBatch, DeviceState, Plan, PlanningState
from .common import normalized, size_limit
from .packing import ranges, run_heads
from .reference import fill_reference

__all__ = ["choose_step_time", "plan_ett_stream", "plan_ett_stream_reference", "sitting_out", "warm_share"]


def warm_share(config: CoordinatorConfig, devices: int) -> int:
    """Samples a device is given before anything about it is measured: its equal share of `global_batch`,
    at least max(b_min, 1) and at most b_max."""
    return min(max(-(-config.global_batch // max(devices, 1)), config.b_min, 1), config.b_max)


def choose_step_time(devices: tuple[DeviceState, ...], config: CoordinatorConfig,
                     overhead_s: float = 0.0, round_trip_s: float = 0.0,
                     step: int | None = None) -> tuple[float, dict[str, float]]:
    """The step-time target T and the bounds it came from (line rate, overhead, round trip, backlog batch, b_min).

    `overhead_s` is the measured per-step time outside compute (`PlanningState.step_overhead_seconds`),
    `round_trip_s` the plans' round trip when they are made a step ahead (`PlanningState.plan_round_trip_seconds`),
    `step` the step planned (with it, devices too slow for even b_min samples sit out: `sitting_out`).
    """
    target, bounds, _ = _step_time(devices, config, overhead_s, round_trip_s, step)
    return target, bounds


def _step_time(devices: tuple[DeviceState, ...], config: CoordinatorConfig, overhead_s: float,
               round_trip_s: float, step: int | None) -> tuple[float, dict[str, float], np.ndarray]:
    """`choose_step_time`, and which devices sit out the step (trained nothing: their b_min step is too long)."""
    n = len(devices)
    if config.target_step_seconds is not None:
        return config.target_step_seconds, {"fixed": config.target_step_seconds}, np.zeros(n, dtype=bool)
    a = np.fromiter((d.model.a for d in devices), np.float64, n)
    b = np.fromiter((d.model.b for d in devices), np.float64, n)
    m = np.fromiter((d.mean_size for d in devices), np.float64, n)
    rate = np.fromiter((d.arrival_rate for d in devices), np.float64, n)
    # T rests on measured speeds. The warm-start guesses are slow by design (an unknown device gets a small
    # batch), so they would call every stream a backlog and T seconds long: once some device is measured the
    # guessed ones are filled to its T, and before any is, T is the guessed time of each device's equal share
    # of global_batch (steps that measure the fleet at a batch that trains).
    measured = np.fromiter((d.model.fitted for d in devices), bool, n)
    counted = measured if measured.any() else np.ones(n, dtype=bool)
    active = (np.fromiter((d.pending_count > 0 for d in devices), bool, n) | (rate > 0)) & measured
    need = a * rate * m * (1.0 + config.line_rate_headroom)
    keeps_up = active & (rate > 0) & (need < 1.0)
    bounds: dict[str, float] = {}
    if keeps_up.any():
        o = max(overhead_s, 0.0)
        bounds["line_rate"] = float(((b[keeps_up] + need[keeps_up] * o) / (1.0 - need[keeps_up])).max())
        bounds["overhead"] = float((b[active].max() + o) / config.max_overhead_fraction)
        if round_trip_s > 0:
            bounds["round_trip"] = max(round_trip_s - o, 0.0)
    elif active.any():
        bounds["global_batch"] = _batch_time(a, b, m, active, config.global_batch)
    want = max(config.b_min, 1) if measured.any() else warm_share(config, n)
    first = np.full(n, np.nan)
    for i, d in enumerate(devices):
        if d.pending is not None and len(d.pending):
            first[i] = float(d.pending.sizes[0]) if want == 1 else float(d.pending.sizes[:want].sum())
        elif d.pending is None and d.lag > 0:
            first[i] = min(want, d.lag) * d.mean_size
    some = ~np.isnan(first) & counted
    def rest_time(staying: np.ndarray) -> float:  # the target without the devices sitting out
        rest = {**bounds, **({"global_batch": _batch_time(a, b, m, active & staying, config.global_batch)}
                             if "global_batch" in bounds and (active & staying).any() else {})}
        return float(np.clip(max(rest.values(), default=0.0), config.min_step_seconds, config.max_step_seconds))

    out = sitting_out(a * first + b, some & measured, rest_time, config, step) if bounds else np.zeros(n, dtype=bool)
    if out.any() and "global_batch" in bounds and (active & ~out).any():
        bounds["global_batch"] = _batch_time(a, b, m, active & ~out, config.global_batch)  # the rest share it
    keep = some & ~out
    bmin = max(float((a[keep] * first[keep] + b[keep]).max()), 0.0) if keep.any() else 0.0
    bounds["b_min" if measured.any() else "warm_share"] = bmin
    target = float(np.clip(max(bounds.values()), config.min_step_seconds, config.max_step_seconds))
    return target, bounds, out


def _batch_time(a: np.ndarray, b: np.ndarray, m: np.ndarray, which: np.ndarray, batch: int) -> float:
    """Backlog only: the equal time at which devices `which` train `batch` samples (LB-BSP, CHRONICA)."""
    inv = 1.0 / np.maximum(a[which] * m[which], 1e-12)
    return float((batch + (b[which] * inv).sum()) / inv.sum())


def sitting_out(one_seconds: np.ndarray, eligible: np.ndarray, rest_time: Callable[[np.ndarray], float],
                config: CoordinatorConfig, step: int | None) -> np.ndarray:
    """Which devices train nothing in `step` (`CoordinatorConfig.sit_out_every`).

    The slowest eligible device sits out while its b_min step (`one_seconds`) would run past (1 + `sit_out_slack`)
    times the target the others set without it (`rest_time` of the devices still in: they carry the global batch
    then), and so on for the next slowest; never every eligible device. Each trains anyway in one step of
    `sit_out_every`, staggered by device index, so none starves.
    """
    n = len(one_seconds)
    out = np.zeros(n, dtype=bool)
    if step is None or config.sit_out_every <= 1 or not eligible.any():
        return out
    for i in np.argsort(-np.where(eligible, one_seconds, -np.inf)):
        trial = out.copy()
        trial[i] = True
        if not eligible[i] or trial[eligible].all() or one_seconds[i] <= rest_time(~trial) * (1 + config.sit_out_slack):
            break
        out = trial
    return out & ((step + np.arange(n)) % config.sit_out_every != 0)


def _prefix_count(cum: np.ndarray, starts: np.ndarray, lengths: np.ndarray, base: np.ndarray,
                  bound: np.ndarray) -> np.ndarray:
    """Per segment, how many leading elements have `cum - base <= bound` (cum non-decreasing).

    A binary search on the global running sum finds it; a fix-up then applies the very comparison
    the reference makes (`cum - base <= bound` in floating point), so rounding cannot move the edge.
    """
    k = np.searchsorted(cum, base + bound, side="right") - starts
    k = np.clip(k, 0, lengths)
    for _ in range(64):
        up = k < lengths
        up[up] = cum[(starts + k)[up]] - base[up] <= bound[up]
        down = k > 0
        down[down] = cum[(starts + k - 1)[down]] - base[down] > bound[down]
        if not (up.any() or down.any()):
            break
        k = k + up - down
    return k


def _fill_indexed(  # noqa: C901, PLR0915  the fill and its fast paths in one pass over the index; the scheduler benchmark times it
    devices: list[DeviceState], budgets: np.ndarray, limits: np.ndarray, config: CoordinatorConfig
) -> list[np.ndarray]:
    """Positions chosen in each device's pending index (devices all have a non-empty index).

    The same answer as `fill_reference` (exactly, for the integer sizes the wire carries), from the
    structure of the fill rather than a dozen full passes over every pending sample per round:

    - the oldest-first part is a prefix of the samples that fit in memory, so it is found by binary
      search on a running sum over a window of each device's oldest samples (about twice its budget
      in mean-size samples, doubled while the prefix reaches the window's end);
    - best fit's first round is one masked maximum per device over the rest; later rounds only see
      samples no larger than the gap left after it, a pool that is small and shrinks every round.
    """
    n = len(devices)
    lengths = np.fromiter((len(d.pending) for d in devices), np.int64, n)  # type: ignore[arg-type]
    sizes = np.concatenate([d.pending.sizes for d in devices])  # type: ignore[union-attr]
    ends = np.cumsum(lengths)
    starts = ends - lengths
    orig_starts, keep = starts, None
    finite_limits = bool(np.isfinite(limits).any())
    if finite_limits and bool((np.maximum.reduceat(sizes, starts) > limits).any()):
        # Samples larger than memory allows are never planned: work on those that fit only.
        fits = sizes <= np.repeat(limits, lengths)
        keep = np.flatnonzero(fits)
        sizes = sizes[keep]
        lengths = np.add.reduceat(fits, starts).astype(np.int64)
        ends = np.cumsum(lengths)
        starts = ends - lengths
    b_max = config.b_max
    if keep is None and bool((lengths <= b_max).all()) and bool((np.add.reduceat(sizes, starts) <= budgets).all()):
        # Everything pending fits every budget (the line-rate case, every step of a light stream): take it all.
        return [np.arange(k) for k in lengths.tolist()]
    floor = min(max(config.b_min, 1), b_max)
    # Oldest-first prefix, on windows of each device's oldest samples.
    mean = np.fromiter((d.mean_size for d in devices), np.float64, n)
    with np.errstate(all="ignore"):
        guess = np.where(np.isfinite(budgets), 2.0 * np.maximum(budgets, 0.0) / mean + 16.0, np.inf)
    width = np.minimum(lengths, np.maximum(np.minimum(guess, 1 << 40), floor).astype(np.int64))
    width = np.minimum(width, lengths)
    while True:
        window = sizes if bool((width == lengths).all()) else sizes[ranges(starts, width)]
        wends = np.cumsum(width)
        wstarts = wends - width
        cum = np.cumsum(window)
        cum0 = np.concatenate([[0.0], cum])
        base = cum0[wstarts]
        count = np.minimum(_prefix_count(cum, wstarts, width, base, budgets), b_max)
        short = (count == width) & (width < lengths) & (count < b_max)
        if not short.any():
            break
        width = np.where(short, np.minimum(2 * width, lengths), width)
    # Floor: at least max(b_min, 1) samples while memory allows, even past the target (width >= floor).
    if floor > 0:
        room = _prefix_count(cum, wstarts, width, base, limits) if finite_limits else width
        count = np.maximum(count, np.minimum(floor, room))
    prefix = count.copy()
    used = cum0[wstarts + count] - base
    picks: list[np.ndarray] = []
    tl = lengths - prefix
    if config.best_fit_lookahead is not None:
        tl = np.minimum(tl, config.best_fit_lookahead)
    if config.best_fit_rounds and tl.any():
        # Best fit looks only past the prefix: the tail, as its own flattened arrays.
        tail = ranges(starts + prefix, tl)
        ts = sizes[tail]
        tends = np.cumsum(tl)
        gap = budgets - used
        val = np.where(ts <= np.repeat(np.where(count < b_max, gap, -np.inf), tl), ts, -np.inf)
        nonempty = tl > 0
        best = np.full(n, -np.inf)
        best[nonempty] = np.maximum.reduceat(val, (tends - tl)[nonempty])
        hit = best > -np.inf
        pool = np.flatnonzero(val == np.repeat(np.where(hit, best, np.nan), tl))
        seg = np.searchsorted(tends, pool, side="right")
        for r in range(config.best_fit_rounds):
            if not len(pool):
                break
            ps = ts[pool]
            heads = run_heads(seg)
            if r:  # round one's pool holds only each device's largest fitting samples
                best = np.maximum.reduceat(ps, heads)
                top = np.flatnonzero(ps == np.repeat(best, np.diff(np.append(heads, len(pool)))))
                heads = top[run_heads(seg[top])]  # oldest of equals
            owners = seg[heads]
            picks.append(tail[pool[heads]])
            count[owners] += 1
            used[owners] += ps[heads]
            gap = budgets - used
            if r == 0:
                if config.best_fit_rounds == 1:
                    break
                cand = val > -np.inf
                cand[pool[heads]] = False
                pool = np.flatnonzero(cand & (ts <= np.repeat(np.where(count < b_max, gap, -np.inf), tl)))
                seg = np.searchsorted(tends, pool, side="right")
                continue
            left = (ps <= gap[seg]) & (count[seg] < b_max)
            left[heads] = False
            pool, seg = pool[left], seg[left]
    # Each device's answer is its prefix, then its best-fit picks in offset order (all past the prefix).
    extra: dict[int, np.ndarray] = {}
    if picks:
        more = np.sort(np.concatenate(picks))
        owner = np.searchsorted(ends, more, side="right")
        cuts = np.flatnonzero(np.diff(owner)) + 1
        bounds = [0, *cuts.tolist(), len(more)]
        for lo, hi in pairwise(bounds):
            extra[int(owner[lo])] = more[lo:hi]
    out: list[np.ndarray] = []
    counting = np.arange(int(prefix.max()) if n else 0, dtype=np.int64)
    for d, (p, s0) in enumerate(zip(prefix.tolist(), starts.tolist(), strict=True)):
        local = counting[:p] if d not in extra else np.concatenate((counting[:p], extra[d] - s0))
        if keep is not None:
            local = keep[s0 + local] - orig_starts[d]
        out.append(local)
    return out


def plan_ett_stream(state: PlanningState, config: CoordinatorConfig) -> Plan:
    """Plan equal-ETT batches at the chosen step time from each device's own pending samples."""
    return _plan(state, config, _fill_indexed)


def plan_ett_stream_reference(state: PlanningState, config: CoordinatorConfig) -> Plan:
    """`plan_ett_stream` with the plain fill of `reference.fill_device`: the specification the fast path is tested
    against, and what `streamtrain bench scheduler --reference` times next to it."""
    return _plan(state, config, fill_reference)


def _trusted_capacity(device: DeviceState, seconds: float, config: CoordinatorConfig) -> float:
    """The total size `device`'s time model says it trains in `seconds`, at most `max_batch_growth` times the
    largest batch the model was fitted on: a line fitted over the sizes seen is not trusted far beyond them."""
    capacity = device.model.capacity(seconds)
    growth, largest = config.max_batch_growth, device.model.largest
    if growth is None or not device.model.fitted or not largest:
        return capacity
    return min(capacity, growth * largest)


_Fill = Callable[[list[DeviceState], np.ndarray, np.ndarray, CoordinatorConfig], list[np.ndarray]]


def _plan(state: PlanningState, config: CoordinatorConfig, fill: _Fill) -> Plan:
    devices = state.devices
    if not devices:
        return Plan("ett-stream", state.step, 0.0, 0.0, ())
    target, bounds, out = _step_time(devices, config, state.step_overhead_seconds, state.plan_round_trip_seconds,
                                     state.step)
    limits = np.array([size_limit(d, config) for d in devices])
    budgets = np.minimum([_trusted_capacity(d, target, config) for d in devices], limits)
    n = len(devices)
    floor = max(config.b_min, 1)
    share = warm_share(config, n)
    offsets: list[np.ndarray | None] = [None] * n
    counts = np.zeros(n, dtype=np.int64)
    totals = np.zeros(n)
    indexed = [i for i, d in enumerate(devices) if d.pending is not None and len(d.pending) and not out[i]]
    if indexed:
        picks = fill([devices[i] for i in indexed], budgets[indexed], limits[indexed], config)
        chunks = []
        for i, pos in zip(indexed, picks, strict=True):
            pending = devices[i].pending
            assert pending is not None
            offsets[i] = pending.offsets[pos]
            chunks.append(pending.sizes[pos])
        where = np.array(indexed)
        counts[where] = [len(pos) for pos in picks]
        totals[where] = np.bincount(np.repeat(np.arange(len(where)), counts[where]), np.concatenate(chunks),
                                    minlength=len(where))
    for i, d in enumerate(devices):
        if offsets[i] is not None:
            continue
        if d.pending is not None or out[i]:  # indexed but empty, or sitting the step out: nothing to train
            offsets[i] = d.pending.offsets[:0] if d.pending is not None else None
            continue
        room = budgets[i]
        fits = limits[i] // d.mean_size if np.isfinite(limits[i]) else d.lag
        fitted = d.model.fitted  # else its budget would rest on guessed speed and size: the share, by count
        count = max(int(min(d.lag, config.b_max, max(room // d.mean_size, floor) if fitted else share, fits)), 0)
        counts[i] = count
        totals[i] = max(room if fitted else 0.0, count * d.mean_size) if count else 0.0
    a = np.fromiter((d.model.a for d in devices), np.float64, n)
    b = np.fromiter((d.model.b for d in devices), np.float64, n)
    predicted = np.where(counts > 0, a * totals + b, 0.0)
    amounts = counts.astype(np.float64) if config.weight_by == "samples" else totals
    weights = normalized(amounts)
    batches = tuple(
        DeviceBatch(d.device_id, o, c, t, p, w)
        for d, o, c, t, p, w in zip(devices, offsets, counts.tolist(), totals.tolist(), predicted.tolist(),
                                    weights.tolist(), strict=True)
    )
    total = int(counts.sum())
    return Plan("ett-stream", state.step, target, total / config.global_batch, batches, notes=bounds)
