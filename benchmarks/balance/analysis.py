"""The balance benchmark's figures: each run's window from its feedback records (both workloads), then the
synthetic workload's figures that compare cells: a loss target per DIF, repeats combined, ett-stream against the
oracle, static and chronica (the dataset workload's are in `accuracy`).

All pure functions of their inputs, so the figures of a stored result can be recomputed as they are.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from coordinator.balance import straggler_effect
from stack.report import by_step, median, weighted_loss
from streamtrain.periods import WALL_PARTS, split_wall_period
from streamtrain.wire import StepFeedback

from ..common import median_reached
from .results import (
    BalanceTargets,
    CellComparison,
    CellFigures,
    CellResult,
)
from .setup import BalanceSetup, fleet_label, oracle_factor

__all__ = ["MatrixFigures", "analyse_cell", "combine_repeats", "control_cell", "evaluate_targets", "finish_figures",
           "loss_targets", "medians", "oracle_ratios", "rank_medians", "seconds_to", "split_medians", "step_ends",
           "summarise"]

#: Per-run figures a combined cell reports as the median over its repeats.
_MEDIAN_FIELDS = ("step_seconds_median", "wall_step_seconds_median", "straggler_effect_median", "samples_per_s",
                  "size_per_s", "global_batch_median", "step_size_median", "trained_size_mean", "final_loss",
                  "plan_latency_ms_median", "plan_wait_seconds_median", "straggler_effect_of_medians",
                  "target_loss")
#: Above the oracle's wall period ett-stream may be: at DIF 0 (every sample costs the same) and with varying sizes.
_ORACLE_TOLERANCE = {True: 0.05, False: 0.10}
#: Median plan wait on the critical path a plan made ahead may leave.
_PLAN_WAIT_LIMIT_S = 0.002
#: How many times static's wall period ett-stream's must be at the target cell.
_SPEEDUP_TARGET = 2.5


@dataclass(frozen=True)
class MatrixFigures:
    """The cells with their comparative figures filled in, each DIF's target loss, and the targets."""

    cells: list[CellResult]
    target_loss: dict[str, float]
    target_loss_rule: str
    targets: BalanceTargets
    runs: list[CellResult] | None = None
    """With repeats: every run, its figures against its own repeat's target (`cells` are their medians)."""


def step_ends(feedback: Sequence[StepFeedback]) -> dict[int, float]:
    """Seconds from the start of step 0 to the end of each step (its last rank's report).

    Raises:
        ValueError: no feedback for step 0.
    """
    steps = by_step(feedback)
    if 0 not in steps:
        raise ValueError("no feedback for step 0")
    start_ms = min(fb.started_at for fb in steps[0])
    return {s: (max(fb.sent_at for fb in recs) - start_ms) / 1e3 for s, recs in steps.items()}


def _per_rank(window: Sequence[Sequence[StepFeedback]]) -> dict[str, Any]:
    """Each rank's median compute and samples, the local-plan rank-steps, and the backlog check over the window:
    a device whose buffer is empty after a measured step ran out of work (its stream drained)."""
    compute: dict[str, list[float]] = defaultdict(list)
    samples: dict[str, list[int]] = defaultdict(list)
    depth: dict[str, int] = {}
    drained = []
    for records in window:
        for fb in records:
            compute[fb.device_id].append(fb.compute_seconds)
            samples[fb.device_id].append(fb.samples)
            depth[fb.device_id] = min(depth.get(fb.device_id, fb.buffer_depth), fb.buffer_depth)
        if any(fb.buffer_depth <= 0 for fb in records):
            drained.append(records[0].step)
    return {"rank_compute_seconds_median": {d: median(v) for d, v in sorted(compute.items())},
            "rank_samples_median": {d: median(v) for d, v in sorted(samples.items())},
            "local_plan_rank_steps": sum(1 for records in window for fb in records if fb.plan_step < 0),
            "backlog_held": not drained if window else None, "backlog_drained_steps": drained,
            "buffer_depth_min": dict(sorted(depth.items()))}


def _loss_curve(steps_of: Mapping[int, Sequence[StepFeedback]], end_s: Mapping[int, float], until: int,
                smooth: int) -> list[tuple[float, float]]:
    """[seconds since step 0 began, trailing mean of `smooth` steps' loss] per step before `until`."""
    curve: list[tuple[float, float]] = []
    recent: list[float] = []
    for s in sorted(steps_of):
        loss = weighted_loss(steps_of[s])
        if s >= until or loss is None or not math.isfinite(loss):
            continue
        recent = [*recent[-(smooth - 1):], loss] if smooth > 1 else [loss]
        if len(recent) == smooth:
            curve.append((round(end_s[s], 4), float(np.mean(recent))))
    return curve


def analyse_cell(feedback: Sequence[StepFeedback], devices: int, warmup: int, steps: int,
                 smooth: int) -> CellFigures:
    """The figures of one run from its feedback records, over steps [warmup, warmup + steps).

    The wall period of a step is split (compute, communication, plan wait, data wait, hold) on the rank with the
    largest compute, whose waits are on the critical path. The backlog is checked, not assumed (`backlog_held`).

    Returns:
        Its figures, with `loss_curve` ([seconds since step 0 began, trailing-mean loss] per step, up to the
        end of the window), from which the time to a target loss is read.

    Raises:
        ValueError: no feedback for step 0.
    """
    end_s = step_ends(feedback)
    steps_of = by_step(feedback)
    full = {s: r for s, r in steps_of.items() if len({fb.device_id for fb in r}) == devices}
    window = [s for s in range(warmup, warmup + steps) if s in full]
    samples = [sum(fb.samples for fb in full[s]) for s in window]
    sizes = [sum(fb.total_size for fb in full[s]) for s in window]
    span = end_s[window[-1]] - end_s[window[0] - 1] if window and window[0] - 1 in end_s else None
    first = 1 if window and window[0] - 1 not in end_s else 0  # the span starts where the first step ended
    splits = [split_wall_period(full[s], end_s[s] - end_s[s - 1]) for s in window if s - 1 in end_s]
    curve = _loss_curve(steps_of, end_s, warmup + steps, smooth)
    return CellFigures(
        steps_measured=len(window),
        step_seconds_median=median([max(fb.step_seconds for fb in full[s]) for s in window]),
        wall_step_seconds_median=median([end_s[s] - end_s[s - 1] for s in window if s - 1 in end_s]),
        straggler_effect_median=median([straggler_effect([fb.compute_seconds for fb in full[s]]) for s in window]),
        samples_per_s=sum(samples[first:]) / span if span else None,
        size_per_s=sum(sizes[first:]) / span if span else None,
        global_batch_median=median(samples),
        step_size_median=median(sizes),
        trained_size_mean=sum(sizes) / sum(samples) if sum(samples) else None,
        plan_wait_seconds_median=median([x["plan_wait"] for x in splits]),
        step_period_split_median=split_medians(splits),
        final_loss=curve[-1][1] if curve else None,
        loss_curve=curve,
        **_per_rank([full[s] for s in window]),
    )


def medians(runs: Sequence[Any], names: Sequence[str]) -> dict[str, float | None]:
    """The median over `runs` of each figure in `names` (runs without it left out)."""
    return {name: median([v for r in runs if (v := getattr(r, name)) is not None]) for name in names}


def rank_medians(runs: Sequence[Any], name: str) -> dict[str, float | None]:
    """Per rank, the median over `runs` of their per-rank figure `name`."""
    ranks = sorted({d for r in runs for d in getattr(r, name)})
    return {d: median([v for r in runs if (v := getattr(r, name).get(d)) is not None]) for d in ranks}


def split_medians(splits: Sequence[Mapping[str, float]]) -> dict[str, float] | None:
    """The median of each part of `WALL_PARTS` over `splits` (None without any)."""
    if not splits:
        return None
    return {part: float(np.median([x.get(part, 0.0) for x in splits])) for part in WALL_PARTS}


def seconds_to(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """Seconds at which the trailing-mean loss first reaches `target` (None when it never does)."""
    for t, loss in curve:
        if loss <= target:
            return float(t)
    return None


def loss_targets(cells: Sequence[CellResult], setup: BalanceSetup) -> tuple[dict[float, float], str]:
    """The target loss of each DIF: what static reaches by the middle of its measured window on that DIF's data
    (first slow-downs set). Each DIF is its own data set (sizes, hence losses, differ), so each has its own target.

    Halfway rather than at the end, so that a policy with the same loss per step but noise of its own
    still reaches it within the window; the rule is written into the JSON next to the values.
    """
    rule = (f"per DIF: the trailing mean of {setup.smooth_steps} steps' loss that static reaches at step "
            f"{setup.warmup_steps + setup.steps // 2} (mid-window) at slow-downs "
            f"{fleet_label(setup.slowdowns[0])} on that DIF's data")
    index = setup.warmup_steps + setup.steps // 2 - setup.smooth_steps + 1
    targets: dict[float, float] = {}
    for c in cells:
        if c.policy == "static" and c.slowdowns == setup.slowdowns[0] and c.loss_curve:
            curve = c.loss_curve
            targets[c.dif] = float(curve[max(0, min(len(curve) - 1, index))][1])
    return targets, rule


def finish_figures(cells: Sequence[CellResult], setup: BalanceSetup,
                   runs: Sequence[CellResult] | None = None) -> MatrixFigures:
    """The figures that compare cells: each cell's balance of per-rank medians, its time to its DIF's target
    loss, and the targets (with `runs`, the repeated runs behind combined cells, also each run's own ratio to
    the oracle). A pure function of the cells (re-applied to a stored balance.json as is)."""
    targets, rule = loss_targets(cells, setup)
    out = []
    for c in cells:
        medians = [v for v in c.rank_compute_seconds_median.values() if v]
        update: dict[str, object] = {"straggler_effect_of_medians": straggler_effect(medians)
                                     if len(medians) > 1 else None}
        if c.runs is None:  # a combined cell keeps what each run measured against its own repeat's target
            target = targets.get(c.dif)
            update["target_loss"] = target
            update["seconds_to_target_loss"] = seconds_to(c.loss_curve or [], target) if target is not None else None
        out.append(c.model_copy(update=update))
    return MatrixFigures(out, {f"{d:g}": t for d, t in sorted(targets.items())}, rule,
                         evaluate_targets(out, setup, runs))


def summarise(results: Sequence[CellResult], setup: BalanceSetup) -> MatrixFigures:
    """`finish_figures` for one run of the matrix; for repeats, each run against its own targets (static's loss
    in that run), then the cells combined with the median of the runs' target losses."""
    if setup.repeats <= 1:
        return finish_figures(results, setup)
    losses: dict[str, list[float]] = defaultdict(list)
    rule = ""
    runs: list[CellResult] = []
    for rep in sorted({r.repeat for r in results if r.repeat is not None}):
        figures = finish_figures([r for r in results if r.repeat == rep], setup)
        rule = figures.target_loss_rule
        runs += figures.cells
        for dif, value in figures.target_loss.items():
            losses[dif].append(value)
    combined = finish_figures(combine_repeats(runs), setup, runs)
    target_loss = {d: m for d, v in losses.items() if (m := median(v)) is not None}
    return MatrixFigures(combined.cells, target_loss, f"{rule}; in each run its own, the median over runs shown",
                         combined.targets, runs)


def combine_repeats(runs: Sequence[CellResult]) -> list[CellResult]:
    """One figure set per cell from its repeated runs: the median of each per-run figure, the per-run values of
    the main ones under `runs`, samples lost summed. Time to the target loss is the median with a run that never
    reached it counted as the slowest (None when most runs did not)."""
    groups: dict[tuple[str, tuple[float, ...], float], list[CellResult]] = defaultdict(list)
    for r in runs:
        groups[(r.policy, r.slowdowns, r.dif)].append(r)
    out = []
    for (policy, slowdowns, dif), rs in groups.items():
        ok = [r for r in rs if not r.error]
        identity = {"policy": policy, "slowdowns": slowdowns, "dif": dif, "size_kind": rs[0].size_kind,
                    "repeats": len(rs)}
        if not ok:
            out.append(CellResult.model_validate({**identity, "error": "; ".join(r.error for r in rs if r.error)}))
            continue
        ranks = sorted({d for r in ok for d in r.rank_compute_seconds_median})
        out.append(CellResult.model_validate({
            **identity, **medians(ok, _MEDIAN_FIELDS),
            "rank_compute_seconds_median": rank_medians(ok, "rank_compute_seconds_median"),
            "rank_samples_median": rank_medians(ok, "rank_samples_median"),
            "seconds_to_target_loss": median_reached(r.seconds_to_target_loss for r in ok),
            "step_period_split_median": split_medians([r.step_period_split_median for r in ok
                                                       if r.step_period_split_median]),
            "backlog_held": None if any(r.backlog_held is None for r in ok) else all(r.backlog_held for r in ok),
            "backlog_drained_steps": sorted({s for r in ok for s in r.backlog_drained_steps or []}),
            "buffer_depth_min": {d: min(v) for d in ranks if (v := [m[d] for r in ok if (m := r.buffer_depth_min)
                                                                    and d in m])},
            "samples_lost": sum(r.samples_lost or 0 for r in ok),
            "steps_measured": min(r.steps_measured for r in ok),
            "local_plan_rank_steps": sum(r.local_plan_rank_steps for r in ok),
            "runs": [r.summary() for r in rs],
            "failed_runs": len(rs) - len(ok) if len(ok) < len(rs) else None,
        }))
    return out


def control_cell(cells: Sequence[CellResult]) -> CellResult | None:
    """The homogeneous control: static on a fleet of equal factors at its smallest DIF (None when not run)."""
    controls = [c for c in cells if c.policy == "static" and len(set(c.slowdowns)) == 1 and c.wall_step_seconds_median]
    return min(controls, key=lambda c: c.dif, default=None)


def oracle_ratios(runs: Sequence[CellResult]) -> dict[tuple[tuple[float, ...], float], list[float]]:
    """ett-stream's wall period over the oracle of its own run of the matrix, per (fleet, DIF), in repeat order.

    Repeats alternate through the matrix, so a run's control ran minutes from its ett-stream cells: the machine's
    drift between repeats (the load of whatever else runs on it) falls on both sides of each ratio.
    """
    out: dict[tuple[tuple[float, ...], float], list[float]] = defaultdict(list)
    for rep in sorted({r.repeat for r in runs if r.repeat is not None}):
        mine = [r for r in runs if r.repeat == rep and not r.error]
        control = control_cell(mine)
        if control is None or not control.wall_step_seconds_median:
            continue
        for r in mine:
            if r.policy == "ett-stream" and r.wall_step_seconds_median:
                oracle = control.wall_step_seconds_median * oracle_factor(r.slowdowns)
                out[(r.slowdowns, r.dif)].append(r.wall_step_seconds_median / oracle)
    return dict(out)


def _compare(cells: Sequence[CellResult], slow: tuple[float, ...], dif: float,
             control: CellResult | None, per_run: Sequence[float] = ()) -> CellComparison | None:
    """ett-stream in the (fleet, DIF) cell against the best work rate, the oracle, static and chronica."""
    group = {c.policy: c for c in cells if c.slowdowns == slow and c.dif == dif and not c.error}
    mine = group.get("ett-stream")
    rated = [c for c in group.values() if c.size_per_s]
    if mine is None or not mine.size_per_s or not rated:
        return None
    best = max(rated, key=lambda c: c.size_per_s or 0.0)
    best_rate = best.size_per_s or 0.0
    wall = mine.wall_step_seconds_median
    oracle = (control.wall_step_seconds_median * oracle_factor(slow)
              if control and control.wall_step_seconds_median else None)
    over = wall / oracle if wall and oracle else None
    tolerance = _ORACLE_TOLERANCE[dif == 0]
    static, chronica = group.get("static"), group.get("chronica")
    static_wall = static.wall_step_seconds_median if static else None
    mine_t = mine.seconds_to_target_loss
    chronica_t = chronica.seconds_to_target_loss if chronica else None
    no_later = None
    if chronica is not None and (mine_t is not None or chronica_t is not None):
        # A run that never reached the target is later than one that did.
        no_later = mine_t is not None and (chronica_t is None or mine_t <= chronica_t)
    held = [c.backlog_held for c in group.values()]
    return CellComparison(
        slowdowns=slow, dif=dif, best_policy=best.policy, best_size_per_s=best_rate,
        ett_stream_size_per_s=mine.size_per_s, best_over_ett_stream=best_rate / mine.size_per_s,
        within_5_percent=best_rate / mine.size_per_s <= 1.05,
        ett_stream_wall_seconds=wall, oracle_wall_seconds=oracle, over_oracle=over, oracle_tolerance=tolerance,
        over_oracle_runs=list(per_run) or None,
        within_oracle=None if over is None else over <= 1.0 + tolerance,
        wall_speedup_vs_static=static_wall / wall if static_wall and wall else None,
        ett_stream_seconds_to_target=mine_t, chronica_seconds_to_target=chronica_t,
        target_no_later_than_chronica=no_later,
        backlog_held=None if any(h is None for h in held) else all(held))


def _all(flags: Sequence[bool | None]) -> bool | None:
    """True when every known flag is, None when none is known."""
    known = [f for f in flags if f is not None]
    return all(known) if known else None


def evaluate_targets(cells: Sequence[CellResult], setup: BalanceSetup,
                     runs: Sequence[CellResult] | None = None) -> BalanceTargets:
    """The targets: ett-stream's speed-up over static at the first heterogeneous fleet and the largest DIF, and per
    (fleet, DIF) cell ett-stream against the best work rate, the oracle, static and chronica; the plan wait of every
    cell, and whether every window ended before a backlog drained.

    "Faster" compares median wall periods (what a user waits per step, plan and data waits included); the
    median step times (the slowest rank's step, LBB's iteration time) and the per-step work are reported next
    to it (`speedup_vs_static`, `work_ratio`). "Best" in a cell is the highest work rate (sample size trained per
    second): policies that pick which samples to train (chronica takes small ones first) do different work per
    step, so step time alone would reward training less. The oracle of a fleet is the homogeneous control's wall
    period x n / sum(1 / s_i): the same global batch split in proportion to speed, every device done together.
    The verdict takes the cells' medians; with `runs`, each run's ratio to its own repeat's oracle is listed too.
    """
    def find(policy: str, slowdowns: tuple[float, ...], dif: float) -> CellResult | None:
        return next((c for c in cells if (c.policy, c.slowdowns, c.dif) == (policy, slowdowns, dif)
                     and c.step_seconds_median), None)

    hetero = next((s for s in setup.slowdowns if len(set(s)) > 1), setup.slowdowns[0])
    top = max(setup.difs)
    ett, static = find("ett-stream", hetero, top), find("static", hetero, top)
    speedup = wall_speedup = None
    if ett and static and ett.step_seconds_median and static.step_seconds_median:
        speedup = static.step_seconds_median / ett.step_seconds_median
    if ett and static and ett.wall_step_seconds_median and static.wall_step_seconds_median:
        wall_speedup = static.wall_step_seconds_median / ett.wall_step_seconds_median
    judged = wall_speedup if wall_speedup is not None else speedup
    work = (ett.step_size_median / static.step_size_median
            if ett and static and ett.step_size_median and static.step_size_median else None)
    se = ett.straggler_effect_median if ett else None
    control = control_cell(cells)
    ratios = oracle_ratios(runs) if runs else {}
    per_cell = [p for slow in setup.slowdowns for dif in setup.difs
                if (p := _compare(cells, slow, dif, control, ratios.get((slow, dif), ()))) is not None]
    waits = [c.plan_wait_seconds_median for c in cells if c.plan_wait_seconds_median is not None]
    return BalanceTargets(
        slowdowns=hetero, dif=top,
        speedup_vs_static=speedup, speedup_met=None if judged is None else judged >= _SPEEDUP_TARGET,
        work_ratio=work,
        straggler_effect_median=se, straggler_effect_met=None if se is None else se <= 0.10,
        straggler_effect_of_medians=ett.straggler_effect_of_medians if ett else None,
        per_cell=per_cell,
        best_or_within_5_percent_met=all(c.within_5_percent for c in per_cell) if per_cell else None,
        wall_speedup_vs_static=wall_speedup,
        control_wall_seconds=control.wall_step_seconds_median if control else None,
        oracle_met=_all([c.within_oracle for c in per_cell]),
        plan_wait_max_seconds=max(waits) if waits else None,
        plan_wait_met=None if not waits else max(waits) <= _PLAN_WAIT_LIMIT_S,
        target_loss_met=_all([c.target_no_later_than_chronica for c in per_cell]),
        backlog_held=_all([c.backlog_held for c in cells if not c.error]),
    )
