"""The balance benchmark's figures: each run's window from its Kafka records (`Run`), the synthetic workload's runs
timed to their target loss, the runs of a cell combined (`CellRuns`), and ett-stream against the others and the
oracle in every (fleet, DIF) cell (the dataset workload's own figures are in `dataset`).

The JSON holds the runs (`BalanceResult`, `RealdataResult`); everything that compares them is computed from them
when a result is rendered — so the figures of a stored result are recomputed as they were.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field

from coordinator.balance import straggler_effect
from stack.report import by_step, median, weighted_loss
from streamtrain.periods import WALL_PARTS, split_wall_period
from streamtrain.wire import StepFeedback

from ..common import Record, Result, median_reached
from .setup import BalanceSetup, RealdataSetup, fleet_label, oracle_factor

__all__ = ["AccuracyPoint", "BalanceResult", "CellRuns", "Comparison", "RealdataResult", "Run", "analyse_window",
           "combine", "comparisons", "control_cell", "judge_balance", "step_ends"]

#: Per-run figures a cell reports as the median over its runs.
_MEDIANS = ("step_seconds_median", "wall_step_seconds_median", "straggler_effect_median", "samples_per_s",
            "size_per_s", "step_size_median", "trained_size_mean", "plan_wait_seconds_median", "size_dif_measured")
#: Above the oracle's wall period ett-stream may be: at DIF 0 (every sample costs the same) and with varying sizes.
ORACLE_TOLERANCE = {True: 0.05, False: 0.10}


class AccuracyPoint(Record):
    """One held-out evaluation of a run: after `step` steps, at `seconds` of training (from the start of step 0,
    earlier evaluations' pauses left out), its value and the trailing mean that meets the target."""

    step: int
    seconds: float
    accuracy: float
    smoothed: float


class Run(Record):
    """One run of a cell, read back from Kafka: its measured window and its time to the target."""

    policy: str
    slowdowns: tuple[float, ...]
    dif: float | None = None
    """The synthetic workload's std of sample sizes (None: a dataset replayed)."""
    repeat: int = 0
    seconds: float | None = None
    """Wall time of the whole run, start-up and read-back included."""
    run_dir: str | None = None
    error: str | None = None
    steps_measured: int = 0
    """Steps of the window every rank reported."""
    step_seconds_median: float | None = None
    """The slowest rank's step (collate, compute, all-reduce, emulated sleep): LBB Table 2's iteration time."""
    wall_step_seconds_median: float | None = None
    """Time between consecutive step completions (plan round trip and data waits included; on a dataset, the
    periods that held a held-out evaluation left out)."""
    straggler_effect_median: float | None = None
    """LBB Eq. 4 on the ranks' compute seconds, per step."""
    samples_per_s: float | None = None
    size_per_s: float | None = None
    """Work: sample size trained per second."""
    step_size_median: float | None = None
    trained_size_mean: float | None = None
    """Mean size of the samples trained (a policy that picks small samples first trains less per sample)."""
    rank_compute_seconds_median: dict[str, float | None] = Field(default_factory=dict)
    rank_samples_median: dict[str, float | None] = Field(default_factory=dict)
    plan_wait_seconds_median: float | None = None
    """The critical-path rank's wait for its plan (0 when plans are made ahead in time)."""
    step_period_split_median: dict[str, float] | None = None
    """Seconds of each part of the wall period (compute, communication, plan_wait, data_wait, hold, other), read
    from the critical-path rank."""
    backlog_held: bool | None = None
    """Whether every device still had samples waiting after every measured step (False: its steps say nothing)."""
    backlog_drained_steps: list[int] = Field(default_factory=list)
    samples_unaccounted: int | None = None
    """Produced samples neither trained, truncated, dead-lettered nor pending (0 expected)."""
    size_dif_measured: float | None = None
    accuracy: list[AccuracyPoint] = Field(default_factory=list)
    """A dataset run's held-out evaluations."""
    seconds_to_target: float | None = None
    """From the start of step 0 to the target loss (synthetic) or held-out value (dataset); None: never."""
    steps_to_target: int | float | None = None
    """Its step (over runs: the median)."""

    @property
    def final_accuracy(self) -> float | None:
        return self.accuracy[-1].accuracy if self.accuracy else None


class BalanceResult(Result):
    """What `balance.json` holds: every run of the synthetic matrix, each timed to its own round's target loss."""

    setup: BalanceSetup
    target_loss: dict[str, float]
    """Per DIF (as `f"{dif:g}"`): the loss to reach (the median over rounds; see `target_loss_rule`)."""
    target_loss_rule: str
    seconds: float
    runs: list[Run]


class RealdataResult(Result):
    """What `realdata.json` holds: every run of the dataset workload, in the order they ran, timed to the target."""

    setup: RealdataSetup
    target: float | None
    target_rule: str
    seconds: float
    runs: list[Run]


# ---------------------------------------------------------------------------------------------
# One run, from its records


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
    """Each rank's median compute and samples and the backlog check: a device whose buffer is empty after a measured
    step ran out of work (its stream drained)."""
    compute: dict[str, list[float]] = defaultdict(list)
    samples: dict[str, list[int]] = defaultdict(list)
    for fb in (fb for records in window for fb in records):
        compute[fb.device_id].append(fb.compute_seconds)
        samples[fb.device_id].append(fb.samples)
    drained = [records[0].step for records in window if any(fb.buffer_depth <= 0 for fb in records)]
    return {"rank_compute_seconds_median": {d: median(v) for d, v in sorted(compute.items())},
            "rank_samples_median": {d: median(v) for d, v in sorted(samples.items())},
            "backlog_held": not drained if window else None, "backlog_drained_steps": drained}


def _split_medians(splits: Sequence[Mapping[str, float]]) -> dict[str, float] | None:
    return {p: float(np.median([x.get(p, 0.0) for x in splits])) for p in WALL_PARTS} if splits else None


def analyse_window(feedback: Sequence[StepFeedback], devices: int, warmup: int, steps: int,
                   smooth: int = 1) -> tuple[dict[str, Any], list[tuple[float, float]]]:
    """A run's figures (`Run`'s) over steps [warmup, warmup + steps), and its loss curve: [seconds since step 0
    began, trailing mean of `smooth` steps' loss] per step up to the window's end.

    A step's wall period is split (compute, communication, plan wait, data wait, hold) on the rank with the largest
    compute, whose waits are on the critical path.

    Raises:
        ValueError: no feedback for step 0.
    """
    end_s, steps_of = step_ends(feedback), by_step(feedback)
    full = {s: r for s, r in steps_of.items() if len({fb.device_id for fb in r}) == devices}
    window = [s for s in range(warmup, warmup + steps) if s in full]
    samples = [sum(fb.samples for fb in full[s]) for s in window]
    sizes = [sum(fb.total_size for fb in full[s]) for s in window]
    span = end_s[window[-1]] - end_s[window[0] - 1] if window and window[0] - 1 in end_s else None
    splits = [split_wall_period(full[s], end_s[s] - end_s[s - 1]) for s in window if s - 1 in end_s]
    curve: list[tuple[float, float]] = []
    recent: list[float] = []
    for s in sorted(steps_of):
        loss = weighted_loss(steps_of[s])
        if s < warmup + steps and loss is not None and math.isfinite(loss):
            recent = [*recent[-(smooth - 1):], loss] if smooth > 1 else [loss]
            if len(recent) == smooth:
                curve.append((round(end_s[s], 4), float(np.mean(recent))))
    return {
        "steps_measured": len(window),
        "step_seconds_median": median([max(fb.step_seconds for fb in full[s]) for s in window]),
        "wall_step_seconds_median": median([end_s[s] - end_s[s - 1] for s in window if s - 1 in end_s]),
        "straggler_effect_median": median([straggler_effect([fb.compute_seconds for fb in full[s]]) for s in window]),
        "samples_per_s": sum(samples) / span if span else None,
        "size_per_s": sum(sizes) / span if span else None,
        "step_size_median": median(sizes),
        "trained_size_mean": sum(sizes) / sum(samples) if sum(samples) else None,
        "plan_wait_seconds_median": median([x["plan_wait"] for x in splits]),
        "step_period_split_median": _split_medians(splits),
        **_per_rank([full[s] for s in window]),
    }, curve


# ---------------------------------------------------------------------------------------------
# Runs against their targets


def judge_balance(runs: Sequence[tuple[Run, list[tuple[float, float]]]], setup: BalanceSetup
                  ) -> tuple[list[Run], dict[str, float], str]:
    """Each run timed to its round's target loss, the target losses (per DIF, the median over rounds) and the rule.

    A DIF's target is the trailing-mean loss static reaches by the middle of its measured window on that DIF's data
    (first fleet): each DIF is its own data set, so each has its own. Halfway rather than at the end, so that a
    policy with the same loss per step but noise of its own still reaches it within the window.
    """
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


# ---------------------------------------------------------------------------------------------
# Cells over their runs, and ett-stream against the others


@dataclass(frozen=True)
class CellRuns:
    """A cell over its runs: every run (failed ones included), and the median of each figure over those that did
    not fail (`fig`; its `error` set when every run failed)."""

    runs: list[Run]
    fig: Run

    @property
    def ok(self) -> list[Run]:
        return [r for r in self.runs if not r.error]

    @property
    def control(self) -> bool:
        return len(set(self.fig.slowdowns)) == 1


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
    """The synthetic workload's homogeneous control: static on equal ranks at its smallest DIF (None when not run)."""
    controls = [c.fig for c in cells if c.control and c.fig.policy == "static" and c.fig.wall_step_seconds_median]
    return min(controls, key=lambda c: c.dif or 0.0, default=None)


@dataclass(frozen=True)
class Comparison:
    """ett-stream in one (fleet, DIF) cell against the best policy by work rate, the oracle, static and chronica."""

    slowdowns: tuple[float, ...]
    dif: float
    best_policy: str
    best_over_ett_stream: float
    """The best work rate (sample size trained per second) over ett-stream's."""
    ett_stream_wall_seconds: float | None
    oracle_wall_seconds: float | None
    """The control's wall period x n / sum(1 / s_i): a perfect split of the same batch on this fleet."""
    over_oracle_runs: list[float]
    """Each round's ett-stream wall period over its own round's oracle (the spread behind the median)."""
    wall_speedup_vs_static: float | None
    ett_stream_seconds_to_target: float | None
    chronica_seconds_to_target: float | None
    target_no_later_than_chronica: bool | None
    """None without both figures; a run that never reached the target is later than one that did."""
    backlog_held: bool | None

    @property
    def over_oracle(self) -> float | None:
        wall, oracle = self.ett_stream_wall_seconds, self.oracle_wall_seconds
        return wall / oracle if wall and oracle else None

    @property
    def tolerance(self) -> float:
        return ORACLE_TOLERANCE[self.dif == 0]

    @property
    def within_oracle(self) -> bool | None:
        return None if self.over_oracle is None else self.over_oracle <= 1.0 + self.tolerance


def _oracle_ratios(runs: Sequence[Run]) -> dict[tuple[tuple[float, ...], float | None], list[float]]:
    """ett-stream's wall period over the oracle of its own round of the matrix, per (fleet, DIF), in round order:
    a round's control ran minutes from its ett-stream cells, so the machine's drift falls on both sides."""
    out: dict[tuple[tuple[float, ...], float | None], list[float]] = defaultdict(list)
    for rep in sorted({r.repeat for r in runs}):
        mine = [r for r in runs if r.repeat == rep and not r.error]
        control = control_cell(combine(mine))
        base = control.wall_step_seconds_median if control else None
        for r in mine:
            if base and r.policy == "ett-stream" and r.wall_step_seconds_median:
                out[(r.slowdowns, r.dif)].append(r.wall_step_seconds_median / (base * oracle_factor(r.slowdowns)))
    return out


def comparisons(runs: Sequence[Run], setup: BalanceSetup) -> list[Comparison]:
    """ett-stream per heterogeneous (fleet, DIF) cell against the best work rate, the oracle, static and chronica.

    "Best" is the highest work rate (sample size trained per second): policies that pick which samples to train
    (chronica takes small ones first) do different work per step, so step time alone would reward training less.
    """
    cells = combine(runs)
    control, ratios = control_cell(cells), _oracle_ratios(runs) if setup.repeats > 1 else {}
    out = []
    for slow in setup.slowdowns:
        for dif in setup.difs:
            group = {c.fig.policy: c.fig for c in cells if (c.fig.slowdowns, c.fig.dif) == (slow, dif)
                     and not c.fig.error}
            mine, rated = group.get("ett-stream"), [c for c in group.values() if c.size_per_s]
            if mine is None or not mine.size_per_s or not rated:
                continue
            best = max(rated, key=lambda c: c.size_per_s or 0.0)
            static, chronica = group.get("static"), group.get("chronica")
            wall, ett_t = mine.wall_step_seconds_median, mine.seconds_to_target
            chronica_t = chronica.seconds_to_target if chronica else None
            held = [c.backlog_held for c in group.values()]
            out.append(Comparison(
                slowdowns=slow, dif=dif, best_policy=best.policy,
                best_over_ett_stream=(best.size_per_s or 0.0) / mine.size_per_s, ett_stream_wall_seconds=wall,
                oracle_wall_seconds=control.wall_step_seconds_median * oracle_factor(slow)
                if control and control.wall_step_seconds_median else None,
                over_oracle_runs=ratios.get((slow, dif), []),
                wall_speedup_vs_static=static.wall_step_seconds_median / wall
                if static and static.wall_step_seconds_median and wall else None,
                ett_stream_seconds_to_target=ett_t, chronica_seconds_to_target=chronica_t,
                target_no_later_than_chronica=None if chronica is None or (ett_t is None and chronica_t is None)
                else ett_t is not None and (chronica_t is None or ett_t <= chronica_t),
                backlog_held=None if any(h is None for h in held) else all(held)))
    return out
