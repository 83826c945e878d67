"""The dataset workload's figures (`bench realdata`): a run's held-out accuracy over training time, the target
accuracy, each cell's runs combined, and ett-stream against the other policies and the oracle.

All pure functions of Evaluation and StepFeedback records (or of stored runs), so the figures of a stored
`realdata.json` can be recomputed as they are.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from stack.report import median
from streamtrain.wire import Evaluation, StepFeedback

from ..common import median_reached
from .analysis import medians, rank_medians, step_ends
from .results import AccuracyPoint, PolicyResult, RealdataResult, RealdataTargets, RunResult
from .setup import RealdataRunSetup, RealdataSetup, oracle_factor

__all__ = [
    "accuracy_curve",
    "combine_runs",
    "evaluate_realdata",
    "reach",
    "summarise_realdata",
    "target_accuracy",
    "wall_period_median",
    "with_target",
]

#: Per-run figures a combined cell reports as the median over its runs.
_RUN_MEDIANS = ("wall_period_seconds_median", "step_seconds_median", "straggler_effect_median", "samples_per_s",
                  "final_accuracy")


def accuracy_curve(evaluations: Sequence[Evaluation], feedback: Sequence[StepFeedback],
                   smooth: int) -> list[AccuracyPoint]:
    """Each held-out evaluation at the training time its model was reached, and its trailing mean over `smooth`.

    An evaluation's `step` counts the steps done (its model is the one after feedback step `step - 1`), and it
    pauses every rank before the next step, so the time of an evaluation leaves out the evaluations before it:
    a policy is timed by its training, not by how often it was stopped to be measured (the same number of
    evaluations by a given step for every policy). An evaluation repeated for one step (the one after the last
    step) counts once.

    Raises:
        ValueError: no feedback for step 0.
    """
    ends = step_ends(feedback)
    seen: dict[int, Evaluation] = {}
    for e in sorted(evaluations, key=lambda e: (e.step, e.sent_at)):
        seen.setdefault(e.step, e)
    points: list[AccuracyPoint] = []
    paused = 0.0
    recent: list[float] = []
    for step, e in sorted(seen.items()):
        if step - 1 not in ends:
            continue
        recent = [*recent[-(smooth - 1):], e.accuracy] if smooth > 1 else [e.accuracy]
        points.append(AccuracyPoint(step=step, seconds=round(ends[step - 1] - paused, 4), accuracy=e.accuracy,
                                    smoothed=float(np.mean(recent))))
        paused += e.seconds
    return points


def wall_period_median(feedback: Sequence[StepFeedback], evaluated: Sequence[int], first: int,
                       until: int) -> float | None:
    """Median time between the ends of consecutive steps s - 1 and s for s in [first, until), leaving out the
    periods that held an evaluation (s in `evaluated`: the evaluation after s steps runs before step s): the
    period a trainer sees while training."""
    ends = step_ends(feedback)
    skip = set(evaluated)
    return median([ends[s] - ends[s - 1] for s in range(max(first, 1), until)
                   if s in ends and s - 1 in ends and s not in skip])


def reach(curve: Sequence[AccuracyPoint], target: float) -> tuple[float | None, int | None]:
    """(training seconds, step) of the first evaluation whose smoothed accuracy reaches `target` ((None, None):
    never)."""
    for p in curve:
        if p.smoothed >= target:
            return p.seconds, p.step
    return None, None


def target_accuracy(runs: Sequence[RunResult], setup: RealdataSetup) -> tuple[float | None, str]:
    """The target accuracy and its rule: `setup.target_accuracy` when given; else static's smoothed accuracy at
    the last evaluation at or before mid-window (`setup.target_step`), the median over static's runs.

    Mid-window rather than the end: the accuracy there is still rising (a target on the plateau would be reached
    at a random moment of the noise), and a policy that learns as much per step still reaches it well inside the
    window.
    """
    if setup.target_accuracy is not None:
        return setup.target_accuracy, f"fixed at {setup.target_accuracy:g}"
    values = []
    for r in runs:
        if r.policy == "static" and not r.control and not r.error:
            before = [p for p in r.accuracy if p.step <= setup.target_step]
            if before:
                values.append(before[-1].smoothed)
    rule = (f"static's held-out accuracy (trailing mean of {setup.smooth_evals} evaluations) after step "
            f"{setup.target_step} (mid-window), the median over its {len(values)} runs")
    return median(values), rule


def with_target(run: RunResult, target: float | None) -> RunResult:
    """The run with its time and steps to `target` filled in."""
    seconds, step = reach(run.accuracy, target) if target is not None else (None, None)
    return run.model_copy(update={"seconds_to_target": seconds, "steps_to_target": step})


def combine_runs(runs: Sequence[RunResult]) -> list[PolicyResult]:
    """One result per cell (policy on the fleet, or the control) from its runs, in order of first appearance."""
    groups: dict[tuple[str, bool], list[RunResult]] = defaultdict(list)
    for r in runs:
        groups[(r.policy, r.control)].append(r)
    out = []
    for (policy, control), rs in groups.items():
        ok = [r for r in rs if not r.error]
        identity = {"policy": policy, "slowdowns": rs[0].slowdowns, "control": control, "runs": len(rs),
                    "failed_runs": len(rs) - len(ok)}
        if not ok:
            out.append(PolicyResult.model_validate({**identity, "error": "; ".join(r.error or "" for r in rs)}))
            continue
        out.append(PolicyResult.model_validate({
            **identity, **medians(ok, _RUN_MEDIANS),
            "seconds_to_target": median_reached(r.seconds_to_target for r in ok),
            "seconds_to_target_runs": [r.seconds_to_target for r in ok],
            "steps_to_target": median([r.steps_to_target for r in ok if r.steps_to_target is not None]),
            "seconds_per_step_to_target": median([r.seconds_to_target / r.steps_to_target for r in ok
                                                  if r.seconds_to_target is not None and r.steps_to_target]),
            "rank_samples_median": rank_medians(ok, "rank_samples_median"),
            "samples_unaccounted": sum(r.samples_unaccounted or 0 for r in ok),
        }))
    return out


def evaluate_realdata(policies: Sequence[PolicyResult], target: float | None, rule: str,
                     slowdowns: tuple[float, ...]) -> RealdataTargets:
    """ett-stream's time to the target against the best other policy and static, its step time against the oracle.

    The step times compared are wall periods (what a trainer sees between steps), the control's and ett-stream's
    measured the same way, so the oracle carries the same per-step overheads as the run it judges. A control
    slower than ett-stream on the heterogeneous fleet is no bound (four full-speed ranks cannot need longer than
    three and a slow one for the same batch): its ranks were slowed by something else, and the oracle is not
    judged.
    """
    hetero = {p.policy: p for p in policies if not p.control}
    control = next((p for p in policies if p.control), None)
    ett, static = hetero.get("ett-stream"), hetero.get("static")
    others = [p for name, p in hetero.items() if name != "ett-stream" and p.seconds_to_target is not None]
    best = min(others, key=lambda p: p.seconds_to_target or 0.0) if others else None
    ett_s = ett.seconds_to_target if ett else None
    no_later: bool | None = None
    if ett is not None and hetero.keys() - {"ett-stream"}:
        no_later = ett_s is not None and (best is None or ett_s <= (best.seconds_to_target or 0.0))
    speedup = None
    if ett_s and static is not None:
        speedup = static.seconds_to_target / ett_s if static.seconds_to_target is not None else None
    oracle = (control.wall_period_seconds_median * oracle_factor(slowdowns)
              if control is not None and control.wall_period_seconds_median else None)
    ett_period = ett.wall_period_seconds_median if ett else None
    over = ett_period / oracle if ett_period and oracle else None
    # The same rule over the whole run to the target: what a perfect split would take in static's steps, so
    # static's time over it is the most any policy could gain over static (step 0 included, planned before
    # anything is measured).
    per_step = control.seconds_per_step_to_target * oracle_factor(slowdowns) if (
        control is not None and control.seconds_per_step_to_target) else None
    oracle_time = per_step * static.steps_to_target if per_step and static and static.steps_to_target else None
    bound = None if control is None or ett_period is None or not control.wall_period_seconds_median else (
        control.wall_period_seconds_median <= ett_period)
    return RealdataTargets(
        target_accuracy=target, target_rule=rule,
        best_other_policy=best.policy if best else None,
        best_other_seconds_to_target=best.seconds_to_target if best else None,
        ett_stream_seconds_to_target=ett_s, no_later_than_best_met=no_later,
        speedup_vs_static=speedup, speedup_met=None if speedup is None else speedup >= 2.0,
        control_wall_period_seconds=control.wall_period_seconds_median if control else None,
        oracle_step_seconds=oracle, ett_stream_wall_period_seconds=ett_period, over_oracle=over,
        oracle_seconds_to_target=oracle_time,
        oracle_speedup_vs_static=(static.seconds_to_target / oracle_time
                                  if oracle_time and static and static.seconds_to_target else None),
        ett_stream_over_oracle_to_target=(ett.seconds_per_step_to_target / per_step
                                          if per_step and ett and ett.seconds_per_step_to_target else None),
        oracle_is_bound=bound, oracle_met=None if over is None or not bound else over <= 1.15,
    )


def summarise_realdata(runs: Sequence[RunResult], setup: RealdataSetup, settings: dict[str, Any],
              seconds: float) -> RealdataResult:
    """The result of a set of runs: the target, each run against it, the cells' medians, the verdicts."""
    target, rule = target_accuracy(runs, setup)
    judged = [with_target(r, target) for r in runs]
    policies = combine_runs(judged)
    return RealdataResult(setup=RealdataRunSetup.model_validate({**setup.model_dump(), "settings": settings}),
                          seconds=seconds, policies=policies,
                          targets=evaluate_realdata(policies, target, rule, setup.slowdowns), runs=judged)
