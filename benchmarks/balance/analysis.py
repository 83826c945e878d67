"""`bench balance`'s figures: one run's from its feedback records, then those that compare cells.

All pure functions of their inputs, so the figures of a stored `balance.json` can be recomputed as is.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from coordinator.balance import straggler_effect
from stack.report import by_step, median, weighted_loss
from streamtrain.wire import StepFeedback

from ..common import median_reached
from .results import BalanceTargets, CellComparison, CellFigures, CellResult
from .setup import BalanceSetup, fleet_label

__all__ = ["MatrixFigures", "analyse_cell", "combine_repeats", "evaluate_targets", "finish_figures", "loss_targets",
           "seconds_to", "summarise"]

#: Per-run figures a combined cell reports as the median over its repeats.
_MEDIAN_FIELDS = ("step_seconds_median", "wall_step_seconds_median", "straggler_effect_median", "samples_per_s",
                  "size_per_s", "global_batch_median", "step_size_median", "trained_size_mean", "final_loss",
                  "plan_latency_ms_median", "plan_wait_seconds_median", "straggler_effect_of_medians",
                  "target_loss")


@dataclass(frozen=True)
class MatrixFigures:
    """The cells with their comparative figures filled in, each DIF's target loss, and the targets."""

    cells: list[CellResult]
    target_loss: dict[str, float]
    target_loss_rule: str
    targets: BalanceTargets
    runs: list[CellResult] | None = None
    """With repeats: every run, its figures against its own repeat's target (`cells` are their medians)."""


def analyse_cell(feedback: Sequence[StepFeedback], devices: int, warmup: int, steps: int,
                 smooth: int) -> CellFigures:
    """The figures of one run from its feedback records, over steps [warmup, warmup + steps).

    Returns:
        Its figures, with `loss_curve` ([seconds since step 0 began, trailing-mean loss] per step, up to the
        end of the window), from which the time to a target loss is read.

    Raises:
        ValueError: no feedback for step 0.
    """
    steps_of = by_step(feedback)
    full = {s: r for s, r in steps_of.items() if len({fb.device_id for fb in r}) == devices}
    if 0 not in steps_of:
        raise ValueError("no feedback for step 0")
    start_ms = min(fb.started_at for fb in steps_of[0])
    end_s = {s: (max(fb.sent_at for fb in r) - start_ms) / 1e3 for s, r in steps_of.items()}
    window = [s for s in range(warmup, warmup + steps) if s in full]
    step_s = [max(fb.step_seconds for fb in full[s]) for s in window]
    wall = [end_s[s] - end_s[s - 1] for s in window if s - 1 in end_s]
    se = [straggler_effect([fb.compute_seconds for fb in full[s]]) for s in window]
    samples = [sum(fb.samples for fb in full[s]) for s in window]
    sizes = [sum(fb.total_size for fb in full[s]) for s in window]
    span = end_s[window[-1]] - end_s[window[0] - 1] if window and window[0] - 1 in end_s else None
    first = 1 if window and window[0] - 1 not in end_s else 0  # the span starts where the first step ended
    trained_in_span, size_in_span = sum(samples[first:]), sum(sizes[first:])
    per_rank: dict[str, list[float]] = defaultdict(list)
    per_rank_samples: dict[str, list[int]] = defaultdict(list)
    for s in window:
        for fb in full[s]:
            per_rank[fb.device_id].append(fb.compute_seconds)
            per_rank_samples[fb.device_id].append(fb.samples)
    losses = [(s, weighted_loss(steps_of[s])) for s in sorted(steps_of) if s < warmup + steps]
    curve: list[tuple[float, float]] = []
    recent: list[float] = []
    for s, loss in losses:
        if loss is None or not math.isfinite(loss):
            continue
        recent = [*recent[-(smooth - 1):], loss] if smooth > 1 else [loss]
        if len(recent) == smooth:
            curve.append((round(end_s[s], 4), float(np.mean(recent))))
    return CellFigures(
        steps_measured=len(window),
        step_seconds_median=median(step_s),
        wall_step_seconds_median=median(wall),
        straggler_effect_median=median(se),
        samples_per_s=trained_in_span / span if span else None,
        size_per_s=size_in_span / span if span else None,
        global_batch_median=median(samples),
        step_size_median=median(sizes),
        trained_size_mean=sum(sizes) / sum(samples) if sum(samples) else None,
        rank_compute_seconds_median={d: median(v) for d, v in sorted(per_rank.items())},
        rank_samples_median={d: median(v) for d, v in sorted(per_rank_samples.items())},
        local_plan_rank_steps=sum(1 for s in window for fb in full[s] if fb.plan_step < 0),
        final_loss=curve[-1][1] if curve else None,
        loss_curve=curve,
    )


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


def finish_figures(cells: Sequence[CellResult], setup: BalanceSetup) -> MatrixFigures:
    """The figures that compare cells: each cell's balance of per-rank medians, its time to its DIF's target
    loss, and the targets. A pure function of the cells (re-applied to a stored balance.json as is)."""
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
    return MatrixFigures(out, {f"{d:g}": t for d, t in sorted(targets.items())}, rule, evaluate_targets(out, setup))


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
    combined = finish_figures(combine_repeats(runs), setup)
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
        medians = {name: median([v for r in ok if (v := getattr(r, name)) is not None]) for name in _MEDIAN_FIELDS}
        ranks = sorted({d for r in ok for d in r.rank_compute_seconds_median})
        out.append(CellResult.model_validate({
            **identity, **medians,
            "rank_compute_seconds_median": {d: median([v for r in ok if (v := r.rank_compute_seconds_median.get(d))
                                                       is not None]) for d in ranks},
            "rank_samples_median": {d: median([v for r in ok if (v := r.rank_samples_median.get(d)) is not None])
                                    for d in ranks},
            "seconds_to_target_loss": median_reached(r.seconds_to_target_loss for r in ok),
            "samples_lost": sum(r.samples_lost or 0 for r in ok),
            "steps_measured": min(r.steps_measured for r in ok),
            "local_plan_rank_steps": sum(r.local_plan_rank_steps for r in ok),
            "runs": [r.summary() for r in rs],
            "failed_runs": len(rs) - len(ok) if len(ok) < len(rs) else None,
        }))
    return out


def evaluate_targets(cells: Sequence[CellResult], setup: BalanceSetup) -> BalanceTargets:
    """The targets at the first heterogeneous fleet and the largest DIF, and ett-stream vs the best per cell.

    "Faster per step" compares median step times (static and ett-stream both train their oldest samples, so a
    step holds about the same work); the per-step work is reported next to it (`work_ratio`). "Best" in a
    cell is the highest work rate (sample size trained per second): policies that pick which samples to
    train (chronica takes small ones first) do different work per step, so step time alone would reward
    training less.
    """
    def find(policy: str, slowdowns: tuple[float, ...], dif: float) -> CellResult | None:
        return next((c for c in cells if (c.policy, c.slowdowns, c.dif) == (policy, slowdowns, dif)
                     and c.step_seconds_median), None)

    hetero = next((s for s in setup.slowdowns if len(set(s)) > 1), setup.slowdowns[0])
    top = max(setup.difs)
    ett, static = find("ett-stream", hetero, top), find("static", hetero, top)
    speedup = None
    if ett and static and ett.step_seconds_median and static.step_seconds_median:
        speedup = static.step_seconds_median / ett.step_seconds_median
    work = (ett.step_size_median / static.step_size_median
            if ett and static and ett.step_size_median and static.step_size_median else None)
    se = ett.straggler_effect_median if ett else None
    per_cell = []
    for slow in setup.slowdowns:
        for dif in setup.difs:
            group = [c for c in cells if c.slowdowns == slow and c.dif == dif and c.size_per_s]
            mine = next((c for c in group if c.policy == "ett-stream"), None)
            if not group or mine is None or mine.size_per_s is None:
                continue
            best = max(group, key=lambda c: c.size_per_s or 0.0)
            best_rate = best.size_per_s or 0.0
            ratio = best_rate / mine.size_per_s
            per_cell.append(CellComparison(slowdowns=slow, dif=dif, best_policy=best.policy, best_size_per_s=best_rate,
                                           ett_stream_size_per_s=mine.size_per_s, best_over_ett_stream=ratio,
                                           within_5_percent=ratio <= 1.05))
    return BalanceTargets(
        slowdowns=hetero, dif=top,
        speedup_vs_static=speedup, speedup_met=None if speedup is None else speedup >= 2.5,
        work_ratio=work,
        straggler_effect_median=se, straggler_effect_met=None if se is None else se <= 0.10,
        straggler_effect_of_medians=ett.straggler_effect_of_medians if ett else None,
        per_cell=per_cell,
        best_or_within_5_percent_met=all(c.within_5_percent for c in per_cell) if per_cell else None,
    )
