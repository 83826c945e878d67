"""The balance benchmark's dataset workload (`bench realdata`): each run's held-out curve over training time, the
runs timed to the target (static's at mid-window), and ett-stream against the best other policy, static and the
oracle — all computed from Evaluation and StepFeedback records, or from the stored runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stack.report import median
from streamtrain.wire import Evaluation, StepFeedback

from .figures import AccuracyPoint, CellRuns, RealdataResult, Run, combine, step_ends
from .setup import RealdataSetup, oracle_factor

__all__ = ["RealdataFigures", "accuracy_curve", "judge_realdata", "realdata_figures", "wall_period_median"]


def accuracy_curve(evaluations: Sequence[Evaluation], feedback: Sequence[StepFeedback],
                   smooth: int, metric: str = "accuracy") -> list[AccuracyPoint]:
    """Each held-out evaluation at the training time its model was reached, and its trailing mean over `smooth`:
    of its accuracy, or of another of its metrics (`metric`: e.g. rmse, for a regression problem).

    An evaluation's `step` counts the steps done (its model is the one after feedback step `step - 1`), and it
    pauses every rank before the next step, so the time of an evaluation leaves out the evaluations before it:
    a policy is timed by its training, not by how often it was stopped to be measured. An evaluation repeated for
    one step (the one after the last step) counts once.

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
        value = e.accuracy if metric == "accuracy" else e.metrics.get(metric)
        if step - 1 not in ends or value is None:
            continue
        recent = [*recent[-(smooth - 1):], value] if smooth > 1 else [value]
        points.append(AccuracyPoint(step=step, seconds=round(ends[step - 1] - paused, 4), accuracy=value,
                                    smoothed=float(np.mean(recent))))
        paused += e.seconds
    return points


def wall_period_median(feedback: Sequence[StepFeedback], evaluated: Sequence[int], first: int,
                       until: int) -> float | None:
    """Median time between the ends of consecutive steps s - 1 and s for s in [first, until), leaving out the
    periods that held an evaluation (s in `evaluated`: the evaluation after s steps runs before step s)."""
    ends, skip = step_ends(feedback), set(evaluated)
    return median([ends[s] - ends[s - 1] for s in range(max(first, 1), until)
                   if s in ends and s - 1 in ends and s not in skip])


def judge_realdata(runs: Sequence[Run], setup: RealdataSetup) -> tuple[list[Run], float | None, str]:
    """Each run timed to the target, the target and its rule: `setup.target_accuracy` when given; else static's
    smoothed value at the last evaluation at or before mid-window (`setup.target_step`), the median over its runs.

    Mid-window rather than the end: the accuracy there is still rising (a target on the plateau would be reached
    at a random moment of the noise), and a policy that learns as much per step still reaches it well inside the
    window. A falling metric (an error) is reached from above.
    """
    target, rule = setup.target_accuracy, f"fixed at {setup.target_accuracy:g}" if setup.target_accuracy else ""
    if target is None:
        values = [before[-1].smoothed for r in runs if r.policy == "static" and len(set(r.slowdowns)) > 1
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
class RealdataFigures:
    """ett-stream's time to the target against the best other policy and static, its step time against the oracle
    (the control's wall period x n / sum(1 / s_i)), and the oracle's own time to the target."""

    best_other: Run | None
    """The other policy that reached the target soonest (None: none did)."""
    others: bool
    """Whether any other policy ran on the heterogeneous fleet."""
    ett_stream: Run | None
    static: Run | None
    control: CellRuns | None
    oracle_step_seconds: float | None
    oracle_seconds_to_target: float | None
    """The control's seconds per step to its target x n / sum(1 / s_i), in static's steps to it: what a perfect
    split would take, so static's time over it bounds any policy's speed-up over static."""
    pace_over_oracle: float | None
    """ett-stream's seconds per step to the target over the oracle's (its steady steps: `over_oracle`)."""

    @property
    def no_later_than_best(self) -> bool | None:
        """ett-stream's median time to the target <= the best other policy's (None without both to compare)."""
        if self.ett_stream is None or not self.others:
            return None
        mine, best = self.ett_stream.seconds_to_target, self.best_other
        return mine is not None and (best is None or mine <= (best.seconds_to_target or 0.0))

    @property
    def speedup_vs_static(self) -> float | None:
        ett, static = self.ett_stream, self.static
        if not ett or not ett.seconds_to_target or static is None or static.seconds_to_target is None:
            return None
        return static.seconds_to_target / ett.seconds_to_target

    @property
    def oracle_speedup_vs_static(self) -> float | None:
        static = self.static.seconds_to_target if self.static else None
        return static / self.oracle_seconds_to_target if static and self.oracle_seconds_to_target else None

    @property
    def over_oracle(self) -> float | None:
        ett = self.ett_stream.wall_step_seconds_median if self.ett_stream else None
        return ett / self.oracle_step_seconds if ett and self.oracle_step_seconds else None

    @property
    def oracle_is_bound(self) -> bool | None:
        """Whether the control was no slower than ett-stream on the heterogeneous fleet: four full-speed ranks cannot
        need longer than three and a slow one for the same batch, so a slower control was slowed by something
        else, and its oracle bounds nothing."""
        ctrl = self.control.fig.wall_step_seconds_median if self.control else None
        ett = self.ett_stream.wall_step_seconds_median if self.ett_stream else None
        return None if not ctrl or ett is None else ctrl <= ett


def _pace(cell: CellRuns) -> float | None:
    """Median over the runs that reached the target of their seconds per step to it (step 0 included)."""
    return median([r.seconds_to_target / r.steps_to_target for r in cell.ok
                   if r.seconds_to_target is not None and r.steps_to_target])


def realdata_figures(result: RealdataResult) -> RealdataFigures:
    """ett-stream against the best other policy, static and the oracle (medians over each cell's runs)."""
    cells = combine(result.runs)
    hetero = {c.fig.policy: c for c in cells if not c.control}
    control = next((c for c in cells if c.control), None)
    others = [c.fig for name, c in hetero.items() if name != "ett-stream" and c.fig.seconds_to_target is not None]
    ett, static = hetero.get("ett-stream"), hetero.get("static")
    factor = oracle_factor(result.setup.slowdowns)
    per_step = (pace * factor if control and (pace := _pace(control)) else None)
    ctrl_wall = control.fig.wall_step_seconds_median if control else None
    ett_pace = _pace(ett) if ett else None
    return RealdataFigures(
        best_other=min(others, key=lambda r: r.seconds_to_target or 0.0) if others else None,
        others=bool(hetero.keys() - {"ett-stream"}),
        ett_stream=ett.fig if ett else None, static=static.fig if static else None, control=control,
        oracle_step_seconds=ctrl_wall * factor if ctrl_wall else None,
        oracle_seconds_to_target=per_step * static.fig.steps_to_target
        if per_step and static and static.fig.steps_to_target else None,
        pace_over_oracle=ett_pace / per_step if per_step and ett_pace else None)
