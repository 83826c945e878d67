"""`chronica`: CHRONICA's data scheduler (§V-B, Alg. 2) — a fixed global batch packed so every device
gets the same estimated training time (ETT).

Each pending sample's ETT on its own device is a_i·size (the step's fixed cost b_i starts every
device's load). The first pivot is the oldest pending sample in the fleet (the paper draws it at
random; in a stream the oldest is the natural start and keeps plans reproducible). Then, X - 1
times: the device with the least ETT so far takes, first-fit-decreasing, its largest sample whose
ETT fits the gap to the most loaded device, or its smallest when none fits. Memory limits and
b_max bound what a device can take. Gradients are weighted by the size trained (Eq. 7).

Without a pending index for every device, counts are split by equal predicted time instead.

`plan_chronica` runs the greedy on each device's *distinct* ETT values with their multiplicities
(sizes on the wire are integers, so a few hundred values stand for thousands of samples), kept in
descending order so the small samples the greedy mostly takes pop off the end of short lists; it
notes which value each step took and whether as a fit (the newest of equal samples) or as the
smallest (the oldest), and turns those into positions with a few numpy passes at the end.
`plan_chronica_reference` is the greedy exactly as specified, one sample at a time
(`reference.pack_chronica_reference`); the two give identical plans, which the tests check on many
random fleets.
"""

from __future__ import annotations

import bisect
import heapq
import logging
import math

import numpy as np

from streamtrain.config import CoordinatorConfig

from ..state import DeviceBatch, DeviceState, Plan, PlanningState
from .common import batch_from_count, count_caps, normalized, size_limit, solve_equal_time, with_weights
from .packing import ranges
from .reference import oldest_pending, pack_chronica_reference

__all__ = ["plan_chronica", "plan_chronica_reference"]

logger = logging.getLogger(__name__)


def plan_chronica(state: PlanningState, config: CoordinatorConfig) -> Plan:
    """Pack `global_batch` pending samples onto the devices by first-fit decreasing on ETT."""
    return _plan(state, config, fast=True)


def plan_chronica_reference(state: PlanningState, config: CoordinatorConfig) -> Plan:
    """`plan_chronica` through the sample-at-a-time greedy (`reference.pack_chronica_reference`): the specification
    the fast path is tested against, and what `streamtrain bench scheduler --reference` times next to it."""
    return _plan(state, config, fast=False)


def _plan(state: PlanningState, config: CoordinatorConfig, fast: bool) -> Plan:
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
        packed = _pack_fast(state, config) if fast else None
        if packed is not None:
            return packed
        batches = pack_chronica_reference(state, config)
    weights = normalized(np.array([b.total_size for b in batches]))
    weighted = with_weights(batches, weights)
    target = max((b.predicted_seconds for b in weighted), default=0.0)
    total = sum(b.count for b in weighted)
    return Plan("chronica", state.step, target, total / config.global_batch, weighted)


def _blocks(lengths: np.ndarray) -> list[np.ndarray]:
    """Device indices grouped by pending length so that padding each group to a rectangle at most
    about doubles it (one group when the lengths are equal, as they mostly are)."""
    order = np.argsort(lengths, kind="stable")
    out: list[np.ndarray] = []
    lo, total = 0, 0
    for k, i in enumerate(order.tolist()):
        total += int(lengths[i])
        if (k + 1 - lo) * int(lengths[i]) > 2 * total + 256:
            out.append(order[lo:k])
            lo, total = k, int(lengths[i])
    out.append(order[lo:])
    return [blk for blk in out if len(blk)]


class _Runs:
    """Every device's pending samples sorted by ETT and cut into runs of equal ETT.

    `order[start[r]:start[r] + count[r]]` are the positions (in their device's index, ascending) of run
    r, whose ETT is `value[r]`, size `size[r]` and device `owner[r]`; device i's runs are `first_run[i]`
    to `first_run[i] + run_count[i]`, ascending. Sorting sizes rather than ETTs is the same order
    because ETT = a·size with a >= 0; `uniform` says whether equal ETT always means equal
    size (it does unless two sizes round to the same ETT), `valid` whether every ETT is finite.
    """

    def __init__(self, devices: tuple[DeviceState, ...], a: np.ndarray, check_uniform: bool) -> None:  # noqa: PLR0915  one vectorised pass over every device's index (two sort paths); the scheduler benchmark times it
        n = len(devices)
        sizes = [d.pending.sizes for d in devices]  # type: ignore[union-attr]
        lengths = np.fromiter((len(s) for s in sizes), np.int64, n)
        self.lengths = lengths
        self.first_run = np.zeros(n, np.int64)
        self.run_count = np.zeros(n, np.int64)
        orders, values, counts, starts, owners, run_sizes = [], [], [], [], [], []
        self.uniform = True
        self.valid = bool(np.isfinite(a).all() and (a >= 0).all())
        items = runs = 0
        for blk in _blocks(lengths) if self.valid else []:
            width = int(lengths[blk].max())
            if width == 0:
                continue
            m = len(blk)
            per_row = lengths[blk]
            pads = m * width - int(per_row.sum())
            if not pads:
                grid = np.stack([sizes[i] for i in blk.tolist()])
            else:
                grid = np.full((m, width), 65535.0)  # pads sort last
                for r, i in enumerate(blk.tolist()):
                    grid[r, : lengths[i]] = sizes[i]
            valid = np.arange(width) < per_row[:, None] if pads else None
            ab = a[blk]
            # Integer sizes below 65535 (what the wire carries) and ordinary slopes: a radix sort of
            # the sizes is the stable order, and equal ETT is equal size.
            narrow = grid.astype(np.uint16)
            small = bool((narrow == grid).all()) and int(np.count_nonzero(narrow == 65535)) == pads \
                and bool(((ab > 1e-290) & (ab < 1e290)).all())
            if small:
                pos: np.ndarray = np.argsort(narrow, axis=1, kind="stable")
                srtn = np.sort(narrow, axis=1)
                new: np.ndarray = np.ones(srtn.shape, bool)
                new[:, 1:] = srtn[:, 1:] != srtn[:, :-1]
                srtn = srtn[valid] if valid is not None else srtn.ravel()
                pos, new = (pos[valid], new[valid]) if valid is not None else (pos.ravel(), new.ravel())
                heads = np.flatnonzero(new)
                row_of_head = heads // width if valid is None else \
                    np.searchsorted(np.cumsum(per_row), heads, side="right")
                run_size = srtn[heads].astype(np.float64)
                run_value = ab[row_of_head] * run_size
                count = np.diff(np.append(heads, len(srtn)))
            else:
                if valid is not None:
                    grid[~valid] = np.inf
                pos = np.argsort(grid, axis=1)
                srt: np.ndarray = np.take_along_axis(grid, pos, axis=1)
                rows = np.flatnonzero(per_row)
                last = ab[rows] * srt[rows, per_row[rows] - 1]  # NaN sorts last, so the largest size shows it
                if not (bool(np.isfinite(last).all()) and bool(np.isfinite(srt[rows, 0]).all())):
                    self.valid = False
                    return
                with np.errstate(invalid="ignore"):  # a zero slope times an infinite pad
                    ett: np.ndarray = ab[:, None] * srt
                new = np.ones(ett.shape, bool)
                new[:, 1:] = ett[:, 1:] != ett[:, :-1]
                # Equal ETTs in position order: sort (run, position) keys.
                pos = np.sort((np.cumsum(new, axis=1) - 1) * width + pos, axis=1) % width
                if valid is not None:
                    pos, srt, ett, new = pos[valid], srt[valid], ett[valid], new[valid]
                else:
                    pos, srt, ett, new = pos.ravel(), srt.ravel(), ett.ravel(), new.ravel()
                if check_uniform and self.uniform:
                    # Two sizes that round to the same ETT would make a run of mixed sizes.
                    self.uniform = not bool(((srt[1:] != srt[:-1]) & ~new[1:]).any())
                heads = np.flatnonzero(new)
                row_of_head = np.searchsorted(np.cumsum(per_row), heads, side="right")
                run_size, run_value = srt[heads], ett[heads]
                count = np.diff(np.append(heads, len(ett)))
            row_runs = np.bincount(row_of_head, minlength=m)
            self.first_run[blk] = runs + np.cumsum(row_runs) - row_runs
            self.run_count[blk] = row_runs
            orders.append(pos)
            values.append(run_value)
            counts.append(count)
            starts.append(items + heads)
            owners.append(blk[row_of_head])
            run_sizes.append(run_size)
            items += len(pos)
            runs += len(heads)
        cat = np.concatenate
        self.order = cat(orders) if orders else np.zeros(0, np.int64)
        self.value = cat(values) if values else np.zeros(0)
        self.count = cat(counts) if counts else np.zeros(0, np.int64)
        self.start = cat(starts) if starts else np.zeros(0, np.int64)
        self.owner = cat(owners) if owners else np.zeros(0, np.int64)
        self.size = cat(run_sizes) if run_sizes else np.zeros(0)


def _pack_fast(state: PlanningState, config: CoordinatorConfig) -> Plan | None:  # noqa: C901, PLR0915  the reference algorithm's loop on runs of equal ETT, kept whole so it reads against reference.py
    """`pack_chronica_reference`'s plan, on runs of equal ETT; None when an input needs the reference (a
    non-finite ETT or fixed cost, or equal ETTs of different sizes on a device with a memory limit)."""
    devices = state.devices
    n = len(devices)
    a = np.fromiter((d.model.a for d in devices), np.float64, n)
    b = np.fromiter((d.model.b for d in devices), np.float64, n)
    if not bool(np.isfinite(b).all()):
        return None
    room = [size_limit(d, config) for d in devices]
    limited = [math.isfinite(r) for r in room]
    runs = _Runs(devices, a, check_uniform=any(limited))
    if not runs.valid or not runs.uniform:
        return None
    # Each device's runs in descending ETT (negated, so ascending for bisect): the greedy mostly takes
    # small samples, which then sit at the cheap end of the lists.
    nr = len(runs.value)
    neg = (-runs.value[::-1]).tolist()
    left = runs.count[::-1].tolist()
    rid = list(range(nr - 1, -1, -1))
    values: list[list[float]] = []
    counts: list[list[int]] = []
    ids: list[list[int]] = []
    for f, c in zip(runs.first_run.tolist(), runs.run_count.tolist(), strict=True):
        lo, hi = nr - f - c, nr - f
        values.append(neg[lo:hi])
        counts.append(left[lo:hi])
        ids.append(rid[lo:hi])
    run_size = runs.size.tolist() if any(limited) else []
    slopes = a.tolist()
    loads = b.tolist()
    picked = [0] * n  # the pivot
    budget = config.global_batch
    b_max = config.b_max
    pivot = _oldest_fast(state, runs.lengths)
    pivot_run = pivot_pos = -1
    if pivot is not None and budget > 0:
        i, pos = pivot
        size = float(devices[i].pending.sizes[pos])  # type: ignore[union-attr]
        if size <= room[i]:
            f = int(runs.first_run[i])
            pivot_run = f + int(np.searchsorted(runs.value[f:f + int(runs.run_count[i])], a[i] * size))
            pivot_pos = pos
            k = ids[i].index(pivot_run)
            if counts[i][k] > 1:
                counts[i][k] -= 1
            else:
                del values[i][k], counts[i][k], ids[i][k]
            loads[i] += float(runs.value[pivot_run])
            room[i] -= size
            picked[i] = 1
            budget -= 1
    # How many more each device may take (b_max, what it has), and its memory room in ETT (inf without
    # a limit): the reference's checks, folded so the loop below does as little as it can per sample.
    alive = np.bincount(runs.owner, weights=runs.count, minlength=n).astype(np.int64).tolist()
    quota = [min(b_max, c) - p for p, c in zip(picked, alive, strict=True)]  # p: the pivot, if taken
    heap = [(loads[i], i) for i in range(n) if quota[i] > 0]
    heapq.heapify(heap)
    max_load = max(loads)
    fits: list[int] = []  # run of each pick that fitted the gap: the newest alive sample of its run
    smallest: list[int] = []  # run of each pick that overshot: the oldest alive sample of its run
    bisect_left, heappop, heapreplace = bisect.bisect_left, heapq.heappop, heapq.heapreplace
    fit, small = fits.append, smallest.append
    while budget and heap:
        load, i = heap[0]
        vals = values[i]
        x = max_load - load
        if limited[i]:
            room_ett = slopes[i] * room[i]
            if room_ett < x:
                x = room_ett
            k = bisect_left(vals, -x)
            if k == len(vals):
                k -= 1
                if -vals[k] > room_ett:
                    heappop(heap)  # memory full: this device takes no more
                    continue
                r = ids[i][k]
                small(r)
            else:
                r = ids[i][k]
                fit(r)
            room[i] -= run_size[r]
        else:
            k = bisect_left(vals, -x)
            if k == len(vals):
                k -= 1
                r = ids[i][k]
                small(r)
            else:
                r = ids[i][k]
                fit(r)
        load -= vals[k]
        left_i = counts[i]
        if left_i[k] > 1:
            left_i[k] -= 1
        else:
            del vals[k], left_i[k], ids[i][k]
        if load > max_load:
            max_load = load
        budget -= 1
        q = quota[i] = quota[i] - 1
        if q:
            heapreplace(heap, (load, i))
        else:
            heappop(heap)
    return _assemble(state, config, runs, a, b, fits, smallest, pivot_run, pivot_pos)


def _assemble(state: PlanningState, config: CoordinatorConfig, runs: _Runs, a: np.ndarray, b: np.ndarray,  # noqa: PLR0915  the picks turned into each device's batch in one vectorised pass, as _pack_fast's second half
              fits: list[int], smallest: list[int], pivot_run: int, pivot_pos: int) -> Plan:
    """The plan from the runs each pick took. The reference keeps equal ETTs in position order, so a
    fit takes the newest sample left in its run and an overshoot the oldest; the pivot (position
    `pivot_pos` of run `pivot_run`, if taken) is not among those left."""
    devices = state.devices
    n = len(devices)
    nr = len(runs.value)
    n_fit = np.bincount(np.asarray(fits, np.int64), minlength=nr)
    n_small = np.bincount(np.asarray(smallest, np.int64), minlength=nr)
    if pivot_run >= 0:
        n_small[pivot_run] += 1  # a placeholder pick, swapped for the pivot below
    hit = np.flatnonzero(n_fit + n_small)
    size = runs.count[hit]
    # Every sample of every run that was picked from, in position order per run.
    gi = ranges(runs.start[hit], size)
    which = np.repeat(np.arange(len(hit)), size)
    pos = runs.order[gi]
    rank = gi - runs.start[hit][which]
    if pivot_run >= 0:
        # Drop the pivot from its run (the rank of the ones after it moves down one), then take it.
        j = int(np.searchsorted(hit, pivot_run))
        own = which == j
        at = np.flatnonzero(own & (pos == pivot_pos))
        rank[own & (pos > pivot_pos)] -= 1
        rank[at] = -1
        size = size.copy()
        size[j] -= 1
    take = ((rank >= 0) & (rank < (n_small[hit] - (hit == pivot_run))[which])) | (
        rank >= (size - n_fit[hit])[which])
    if pivot_run >= 0:
        take[at] = True
    owner = runs.owner[hit][which[take]]
    base = np.cumsum(runs.lengths) - runs.lengths
    flat = np.sort(base[owner] + pos[take])  # original (device, position) order
    owner = np.searchsorted(base + runs.lengths, flat, side="right")
    count = np.bincount(owner, minlength=n)
    all_offsets = np.concatenate([d.pending.offsets for d in devices])  # type: ignore[union-attr]
    all_sizes = np.concatenate([d.pending.sizes for d in devices])  # type: ignore[union-attr]
    chosen_sizes = all_sizes[flat]
    cuts = np.cumsum(count)[:-1]
    if bool((chosen_sizes == np.rint(chosen_sizes)).all()) and float(np.abs(chosen_sizes).sum()) < 2.0 ** 52:
        totals = np.bincount(owner, weights=chosen_sizes, minlength=n)  # integers: exact in any order
    else:  # the reference's own summation order
        totals = np.array([float(s.copy().sum()) for s in np.split(chosen_sizes, cuts)])
    predicted = np.where(count > 0, a * totals + b, 0.0)
    weights = normalized(totals)
    batches = tuple(
        DeviceBatch(d.device_id, o, c, t, p, w)
        for d, o, c, t, p, w in zip(devices, np.split(all_offsets[flat], cuts), count.tolist(), totals.tolist(),
                                    predicted.tolist(), weights.tolist(), strict=True)
    )
    target = max((x.predicted_seconds for x in batches), default=0.0)
    return Plan("chronica", state.step, target, int(count.sum()) / config.global_batch, batches)


def _oldest_fast(state: PlanningState, lengths: np.ndarray) -> tuple[int, int] | None:
    """`oldest_pending` with one pass over every arrival time rather than one call per device."""
    nonempty = np.flatnonzero(lengths)
    if not len(nonempty):
        return None
    arrivals = np.concatenate([d.pending.arrivals for d in state.devices])  # type: ignore[union-attr]
    firsts = np.minimum.reduceat(arrivals, (np.cumsum(lengths) - lengths)[nonempty])
    if np.isnan(firsts).any():
        return oldest_pending(state)
    i = int(nonempty[int(np.argmin(firsts))])  # the first device holding the oldest sample
    return i, int(np.argmin(state.devices[i].pending.arrivals))  # type: ignore[union-attr]

