"""The balance benchmark's figures: each run's window (and held-out curve) from its Kafka records, timed to its
target; a cell's runs combined; ett-stream against the others and the oracle (computed when rendered)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

import numpy as np

from streamtrain.coordinator.balance import straggler_effect
from streamtrain.periods import WALL_PARTS, split_wall_period
from streamtrain.report.figures import by_step, median, weighted_loss
from streamtrain.wire import Evaluation, StepFeedback

from ..common import Result, median_reached, trailing_mean
from ..live import CellRun
from .setup import AccuracyPoint, BalanceSetup, RealdataSetup, Run, fleet_label, oracle_factor

__all__ = ["BalanceResult", "CellRuns", "Comparison", "Curve", "RealdataResult", "accuracy_curve", "analyse_window",
           "combine", "comparisons", "control_cell", "judge_balance", "judge_realdata", "oracle_wall", "ratio",
           "read_run"]

#: A run's loss over training: (seconds since step 0 began, trailing-mean loss) per step.
Curve = list[tuple[float, float]]
_MEDIANS = ("step_seconds_median", "wall_step_seconds_median", "straggler_effect_median", "samples_per_s",
            "size_per_s", "step_size_median", "trained_size_mean", "plan_wait_seconds_median", "size_dif_measured")


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None without both (or with either 0)."""
    return a / b if a and b else None


class BalanceResult(Result):
    """What `balance.json` holds: every run of the synthetic matrix, each timed to its own round's target loss."""

    setup: BalanceSetup
    target_loss: dict[str, float]
    """Per DIF (as `f"{dif:g}"`): the loss to reach, the median over rounds."""
    target_loss_rule: str
    seconds: float
    runs: list[Run]


class RealdataResult(Result):
    """What `realdata.json` holds: every run of the dataset workload, in running order, timed to the target."""

    setup: RealdataSetup
    target: float | None
    target_rule: str
    seconds: float
    runs: list[Run]


def step_ends(feedback: Sequence[StepFeedback]) -> dict[int, float]:
    """Seconds from the start of step 0 to the end of each step (its last rank's report); ValueError without step 0."""
    steps = by_step(feedback)
    if 0 not in steps:
        raise ValueError("no feedback for step 0")
    start_ms = min(fb.started_at for fb in steps[0])
    return {s: (max(fb.sent_at for fb in recs) - start_ms) / 1e3 for s, recs in steps.items()}


def _per_rank(window: Sequence[Sequence[StepFeedback]]) -> dict[str, Any]:
    """Each rank's median compute and samples, and whether any device's buffer was empty after a measured step."""
    records = [fb for step in window for fb in step]
    devices = sorted({fb.device_id for fb in records})
    drained = [step[0].step for step in window if any(fb.buffer_depth <= 0 for fb in step)]
    return {"rank_compute_seconds_median": {d: median([fb.compute_seconds for fb in records if fb.device_id == d])
                                            for d in devices},
            "rank_samples_median": {d: median([fb.samples for fb in records if fb.device_id == d]) for d in devices},
            "backlog_held": not drained if window else None, "backlog_drained_steps": drained}


def _split_medians(splits: Sequence[Mapping[str, float]]) -> dict[str, float] | None:
    return {p: float(np.median([x.get(p, 0.0) for x in splits])) for p in WALL_PARTS} if splits else None


def analyse_window(feedback: Sequence[StepFeedback], devices: int, warmup: int, steps: int, smooth: int = 1,
                   skip: Collection[int] = ()) -> tuple[dict[str, Any], Curve]:
    """A run's figures (`Run`'s) over steps [warmup, warmup + steps) and its loss curve (trailing mean of `smooth`)
    to the window's end; the wall period split on the rank with the largest compute, and left out for the steps in
    `skip` (the evaluation after s steps runs in step s's period). ValueError without step 0."""
    end_s, steps_of = step_ends(feedback), by_step(feedback)
    full = {s: r for s, r in steps_of.items() if len({fb.device_id for fb in r}) == devices}
    window = [s for s in range(warmup, warmup + steps) if s in full]
    samples = [sum(fb.samples for fb in full[s]) for s in window]
    sizes = [sum(fb.total_size for fb in full[s]) for s in window]
    span = end_s[window[-1]] - end_s[window[0] - 1] if window and window[0] - 1 in end_s else None
    splits = [split_wall_period(full[s], end_s[s] - end_s[s - 1]) for s in window if s - 1 in end_s]
    losses = [(end_s[s], loss) for s in sorted(steps_of) if s < warmup + steps
              and (loss := weighted_loss(steps_of[s])) is not None and math.isfinite(loss)]
    means = trailing_mean([loss for _, loss in losses], smooth)
    return {
        "steps_measured": len(window),
        "step_seconds_median": median([max(fb.step_seconds for fb in full[s]) for s in window]),
        "wall_step_seconds_median": median([end_s[s] - end_s[s - 1] for s in window
                                            if s - 1 in end_s and s not in skip]),
        "straggler_effect_median": median([straggler_effect([fb.compute_seconds for fb in full[s]]) for s in window]),
        "samples_per_s": sum(samples) / span if span else None,
        "size_per_s": sum(sizes) / span if span else None,
        "step_size_median": median(sizes),
        "trained_size_mean": sum(sizes) / sum(samples) if sum(samples) else None,
        "plan_wait_seconds_median": median([x["plan_wait"] for x in splits]),
        "step_period_split_median": _split_medians(splits),
        **_per_rank([full[s] for s in window]),
    }, [(round(t, 4), m) for (t, _), m in zip(losses, means, strict=True)][smooth - 1:]


def accuracy_curve(evaluations: Sequence[Evaluation], feedback: Sequence[StepFeedback],
                   smooth: int, metric: str = "accuracy") -> list[AccuracyPoint]:
    """Each held-out evaluation of `metric` (accuracy, or one of its `metrics`) and its trailing mean over `smooth`,
    at the end of step `step - 1` less the earlier evaluations' pauses. ValueError without step 0."""
    ends = step_ends(feedback)
    seen = {e.step: e for e in sorted(evaluations, key=lambda e: (e.step, e.sent_at), reverse=True)}  # first kept
    kept: list[tuple[int, float, float]] = []
    paused = 0.0
    for step, e in sorted(seen.items()):
        value = e.accuracy if metric == "accuracy" else e.metrics.get(metric)
        if step - 1 in ends and value is not None:
            kept.append((step, round(ends[step - 1] - paused, 4), value))
            paused += e.seconds
    means = trailing_mean([value for *_, value in kept], smooth)
    return [AccuracyPoint(step=step, seconds=seconds, accuracy=value, smoothed=mean)
            for (step, seconds, value), mean in zip(kept, means, strict=True)]


def read_run(ran: CellRun, cell: Run, setup: BalanceSetup | RealdataSetup) -> tuple[Run, Curve]:
    """The planned `cell` with the figures its run left in Kafka (a dataset's held-out curve too); its loss curve."""
    done = {**cell.model_dump(), "seconds": ran.seconds, "run_dir": str(ran.run_dir), "error": ran.error}
    if ran.records is None or ran.report is None:
        return Run.model_validate(done), []
    records = ran.records
    try:
        accuracy = (accuracy_curve(records.evaluations, records.feedback, setup.smooth_evals, setup.held_out_metric)
                    if isinstance(setup, RealdataSetup) else [])
        smooth = setup.smooth_steps if isinstance(setup, BalanceSetup) else 1
        figures, curve = analyse_window(records.feedback, len(cell.slowdowns), setup.warmup_steps, setup.steps, smooth,
                                        [p.step for p in accuracy])
    except ValueError as exc:
        return Run.model_validate({**done, "error": f"{ran.error or ''} analysis: {exc}".strip()}), []
    sizes = np.concatenate([r.sizes[r.decoded] for r in records.records.values()] or [np.zeros(0)])
    missing = isinstance(setup, RealdataSetup) and not accuracy
    return Run.model_validate({
        **done, **figures, "accuracy": accuracy, "samples_unaccounted": ran.report.samples_unaccounted,
        "size_dif_measured": float(np.std(sizes)) if len(sizes) else None,
        "error": ran.error or ("no held-out evaluation read back" if missing else None)}), curve


def judge_balance(runs: Sequence[tuple[Run, Curve]], setup: BalanceSetup) -> tuple[list[Run], dict[str, float], str]:
    """Each run timed to its round's target loss (per DIF, static's trailing-mean loss mid-window on the first
    fleet), the target losses (median over rounds) and the rule."""
    index = setup.warmup_steps + setup.steps // 2 - setup.smooth_steps + 1
    judged, targets = [], defaultdict(list)
    for rep in sorted({run.repeat for run, _ in runs}):
        mine = [(run, curve) for run, curve in runs if run.repeat == rep]
        own = {run.dif: float(curve[max(0, min(len(curve) - 1, index))][1]) for run, curve in mine
               if run.policy == "static" and run.slowdowns == setup.slowdowns[0] and curve}
        for run, curve in mine:
            target = own.get(run.dif)
            reached = next((t for t, loss in curve if loss <= target), None) if target is not None else None
            judged.append(run.model_copy(update={"seconds_to_target": reached}))
        for dif, value in own.items():
            targets[f"{dif:g}"].append(value)
    rule = (f"per DIF: the trailing mean of {setup.smooth_steps} steps' loss that static reaches at step "
            f"{setup.warmup_steps + setup.steps // 2} (mid-window) at slow-downs {fleet_label(setup.slowdowns[0])} "
            "on that DIF's data" + ("; in each run its own, the median over runs shown" if setup.repeats > 1 else ""))
    return judged, {d: float(np.median(v)) for d, v in sorted(targets.items(), key=lambda i: float(i[0]))}, rule


def judge_realdata(runs: Sequence[Run], setup: RealdataSetup) -> tuple[list[Run], float | None, str]:
    """Each run timed to the target (`setup.target_accuracy`, else static's smoothed value at its last evaluation by
    mid-window, median over its runs; a falling metric reached from above), the target and its rule."""
    target, rule = setup.target_accuracy, f"fixed at {setup.target_accuracy:g}" if setup.target_accuracy else ""
    if target is None:
        values = [before[-1].smoothed for r in runs if r.policy == "static" and not r.control
                  and not r.error and (before := [p for p in r.accuracy if p.step <= setup.target_step])]
        target = median(values)
        rule = (f"static's held-out {setup.held_out_metric} (trailing mean of {setup.smooth_evals} evaluations) after "
                f"step {setup.target_step} (mid-window), the median over its {len(values)} runs")
    judged = []
    for r in runs:
        hit = None if target is None else next((p for p in r.accuracy if (
            p.smoothed <= target if setup.lower_is_better else p.smoothed >= target)), None)
        judged.append(r.model_copy(update={"seconds_to_target": hit.seconds if hit else None,
                                           "steps_to_target": hit.step if hit else None}))
    return judged, target, rule


@dataclass(frozen=True)
class CellRuns:
    """A cell's runs (failed ones too) and `fig`, each figure's median over those that did not fail."""

    runs: list[Run]
    fig: Run

    @property
    def ok(self) -> list[Run]:
        return [r for r in self.runs if not r.error]


def _combined(rs: Sequence[Run]) -> Run:
    ok = [r for r in rs if not r.error]
    identity = {"policy": rs[0].policy, "slowdowns": rs[0].slowdowns, "dif": rs[0].dif}
    if not ok:
        return Run.model_validate({**identity, "error": "; ".join(r.error or "" for r in rs)})

    def ranks(name: str) -> dict[str, float | None]:
        keys = sorted({d for r in ok for d in getattr(r, name)})
        return {d: median([v for r in ok if (v := getattr(r, name).get(d)) is not None]) for d in keys}

    return Run.model_validate({
        **identity, **{n: median([v for r in ok if (v := getattr(r, n)) is not None]) for n in _MEDIANS},
        "rank_compute_seconds_median": ranks("rank_compute_seconds_median"),
        "rank_samples_median": ranks("rank_samples_median"),
        "step_period_split_median": _split_medians([s for r in ok if (s := r.step_period_split_median)]),
        "backlog_held": None if any(r.backlog_held is None for r in ok) else all(r.backlog_held for r in ok),
        "backlog_drained_steps": sorted({s for r in ok for s in r.backlog_drained_steps}),
        "samples_unaccounted": sum(r.samples_unaccounted or 0 for r in ok),
        "steps_measured": min(r.steps_measured for r in ok),
        "seconds_to_target": median_reached(r.seconds_to_target for r in ok),
        "steps_to_target": median([r.steps_to_target for r in ok if r.steps_to_target is not None]),
    })


def combine(runs: Sequence[Run]) -> list[CellRuns]:
    """One `CellRuns` per cell (policy, fleet, DIF), in the order of their first runs."""
    groups: dict[tuple[str, tuple[float, ...], float | None], list[Run]] = defaultdict(list)
    for r in runs:
        groups[(r.policy, r.slowdowns, r.dif)].append(r)
    return [CellRuns(rs, _combined(rs)) for rs in groups.values()]


def control_cell(cells: Sequence[CellRuns]) -> Run | None:
    """The synthetic workload's control: static on equal ranks at its smallest DIF (None when not run)."""
    controls = [c.fig for c in cells if c.fig.control and c.fig.policy == "static" and c.fig.wall_step_seconds_median]
    return min(controls, key=lambda c: c.dif or 0.0, default=None)


def oracle_wall(control: Run | None, slowdowns: Sequence[float]) -> float | None:
    """The oracle's wall period on `slowdowns`: the equal-rank control's x n / sum(1 / s_i) (None without one)."""
    base = control.wall_step_seconds_median if control else None
    return base * oracle_factor(slowdowns) if base else None


@dataclass(frozen=True)
class Comparison:
    """ett-stream in one (fleet, DIF) cell against the best work rate, chronica's time to the target loss and the oracle
    (the control's wall period x n / sum(1 / s_i); within it: at most 5% above at DIF 0, 10% with varying sizes)."""

    slowdowns: tuple[float, ...]
    dif: float
    best_policy: str
    best_over_ett_stream: float
    oracle_wall_seconds: float | None
    over_oracle: float | None
    within_oracle: bool | None
    ett_stream_seconds_to_target: float | None
    chronica_seconds_to_target: float | None
    target_no_later_than_chronica: bool | None


def comparisons(runs: Sequence[Run], setup: BalanceSetup) -> list[Comparison]:
    """ett-stream per heterogeneous (fleet, DIF) cell against the best work rate, the oracle and chronica."""
    cells = combine(runs)
    control = control_cell(cells)
    out = []
    for slow, dif in product(setup.slowdowns, setup.difs):
        group = {c.fig.policy: c.fig for c in cells if (c.fig.slowdowns, c.fig.dif) == (slow, dif) and not c.fig.error}
        mine, rated = group.get("ett-stream"), [c for c in group.values() if c.size_per_s]
        if mine is None or not mine.size_per_s or not rated:
            continue
        best = max(rated, key=lambda c: c.size_per_s or 0.0)
        chronica = group.get("chronica")
        ett_t, chronica_t = mine.seconds_to_target, chronica.seconds_to_target if chronica else None
        oracle = oracle_wall(control, slow)
        over = ratio(mine.wall_step_seconds_median, oracle)
        out.append(Comparison(
            slowdowns=slow, dif=dif, best_policy=best.policy,
            best_over_ett_stream=(best.size_per_s or 0.0) / mine.size_per_s, oracle_wall_seconds=oracle,
            over_oracle=over, within_oracle=None if over is None else over <= (1.05 if dif == 0 else 1.10),
            ett_stream_seconds_to_target=ett_t, chronica_seconds_to_target=chronica_t,
            target_no_later_than_chronica=None if chronica is None or (ett_t is None and chronica_t is None)
            else ett_t is not None and (chronica_t is None or ett_t <= chronica_t)))
    return out

