"""The run in its objective's terms: test-then-train figures from the feedback topic, held-out ones from evaluations.

Every rank's feedback carries the metric sums of the samples its step trained, each scored by the model as
it was before that step (test-then-train, or prequential, evaluation). Summed over the steps and ranks they
give the fleet's figures exactly, over the whole run (`running`) or the last `trainer.prequential_window`
steps that trained (`recent`), and each device's own; the ratios are the objective's (`Objective.summarise`),
so nothing here depends on which objective it is. The held-out evaluations carry their metrics already.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from streamtrain.config.trainer import TrainerConfig
from streamtrain.objectives import Objective, SumWindow, build_objective
from streamtrain.plugins import SetupError
from streamtrain.report.schema import MetricFigures, ObjectiveFigures
from streamtrain.wire import Evaluation, StepFeedback

__all__ = ["closing_objective_lines", "heldout_metric_figures", "heldout_rows", "learned_nothing_lines",
           "objective_figures", "objective_for_report", "per_value", "prequential_series"]

logger = logging.getLogger(__name__)


def objective_for_report(config: TrainerConfig) -> Objective:
    """The objective the ranks trained with, to turn sums into metrics (an objective of the user's that does not
    import here is read by its loss alone: the base `Objective`'s ratios)."""
    try:
        return build_objective(config)
    except SetupError as exc:
        logger.warning("report: %s; its test-then-train figures are its loss alone", exc)
        return Objective(config)


def _steps(feedback: Sequence[StepFeedback], device: str | None = None) -> list[tuple[int, dict[str, float]]]:
    """(step, the summed sums of the step's ranks, or of one device's), in step order, for steps with sums."""
    by_step: dict[int, dict[str, float]] = defaultdict(dict)
    for fb in feedback:
        if fb.prequential and (device is None or fb.device_id == device):
            sums = by_step[fb.step]
            for key, value in fb.prequential.items():
                sums[key] = sums.get(key, 0.0) + value
    return sorted(by_step.items())


def _windowed(steps: Sequence[tuple[int, dict[str, float]]], window: int, objective: Objective) -> MetricFigures:
    sums = SumWindow(window)
    for _, step_sums in steps:
        sums.add(step_sums)
    return MetricFigures(running=objective.summarise(sums.running), recent=objective.summarise(sums.recent),
                         samples=int(sums.running.get("count", 0)))


def objective_figures(feedback: Sequence[StepFeedback], evaluations: Sequence[Evaluation], devices: Sequence[str],
                      objective: Objective, window: int) -> ObjectiveFigures:
    """The report's `objective` section: test-then-train figures of the fleet and of each device (running and over
    the last `window` steps that trained), and the held-out metrics of the first and the last evaluation."""
    held = heldout_metric_figures(evaluations)
    return ObjectiveFigures(
        name=objective.name, headline=objective.headline, baseline=objective.baseline,
        baseline_note=objective.baseline_note, higher_is_better=objective.higher_is_better, window_steps=window,
        prequential=_windowed(_steps(feedback), window, objective),
        prequential_per_device={d: _windowed(_steps(feedback, d), window, objective) for d in devices},
        heldout_first=held.get("first", {}), heldout_final=held.get("final", {}),
    )


def prequential_series(feedback: Sequence[StepFeedback], t0_ms: int, objective: Objective,
                       window: int) -> dict[str, Any]:
    """Per step with sums: its time, and the fleet's headline metric, its baseline's and the loss, running
    (`<metric>_running`) and over the window (`<metric>_recent`); with the names of the headline and baseline."""
    sent = {fb.step: fb.sent_at for fb in feedback}
    keys = [k for k in (objective.headline, objective.baseline, "loss") if k]
    out: dict[str, Any] = {"headline": objective.headline, "baseline": objective.baseline, "window_steps": window,
                           "step": [], "t": [], **{f"{k}_{w}": [] for k in keys for w in ("running", "recent")}}
    sums = SumWindow(window)
    for step, step_sums in _steps(feedback):
        sums.add(step_sums)
        out["step"].append(step)
        out["t"].append((sent[step] - t0_ms) / 1e3)
        for which, totals in (("running", sums.running), ("recent", sums.recent)):
            metrics = objective.summarise(totals)
            for key in keys:
                out[f"{key}_{which}"].append(metrics.get(key))
    return out


def heldout_metric_figures(evaluations: Sequence[Evaluation], t0_ms: int = 0) -> dict[str, Any]:
    """The held-out metrics of the first and the last evaluation, and every evaluation's (its step, and its time
    in seconds since `t0_ms`), in step order."""
    evals = sorted(evaluations, key=lambda e: (e.step, e.sent_at))
    if not evals:
        return {}
    return {"first": dict(evals[0].metrics), "final": dict(evals[-1].metrics),
            "points": [{"step": e.step, "t": (e.sent_at - t0_ms) / 1e3, **e.metrics} for e in evals]}


#: How the closing lines write the built-in objectives' headline metrics.
_DISPLAY = {"rmse": "RMSE", "mae": "MAE", "f1_mean": "mean F1"}


def _shown(value: float | None) -> str:
    """A figure to 3 decimals; one below 0.1 (a small target's error) or of 1000 and above to 3 or 4 digits."""
    if value is None:
        return "-"
    return f"{value:.3g}" if 0 < abs(value) < 0.1 else f"{value:.3f}" if abs(value) < 1000 else f"{value:.4g}"


def per_value(metrics: Mapping[str, float], headline: str, baseline: str | None) -> list[tuple[str, float,
                                                                                            float | None]]:
    """(value's name, its headline metric, its baseline's) for each value of a vector target that has figures of its
    own (`rmse_<name>` beside `rmse`, with `baseline_rmse_<name>`), in the objective's order."""
    prefix = f"{headline}_"
    out: list[tuple[str, float, float | None]] = []
    for key, value in metrics.items():
        name = key[len(prefix):]
        if key.startswith(prefix) and baseline and f"{baseline}_{name}" in metrics:
            out.append((name, value, metrics[f"{baseline}_{name}"]))
    return out


def _per_value_line(what: str, metrics: Mapping[str, float], headline: str, baseline: str | None) -> list[str]:
    values = per_value(metrics, headline, baseline)
    if not values:
        return []
    shown = ", ".join(f"{name} {_shown(v)} against {_shown(b)}" for name, v, b in values)
    return [f"  {what} per target value (the baseline's after 'against'): {shown}"]


def closing_objective_lines(figures: ObjectiveFigures | None, heldout: str | None = None,
                            accuracy_shown: bool = False, replayed: int | None = None) -> list[str]:
    """What `up` says about learning, in the objective's terms: test-then-train, and held-out beside it, each
    against its baseline (the most common class, the training mean, the last value); a vector target's figures per
    value too.

    Args:
        figures: The report's `objective` section.
        heldout: The held-out set's name and size, as the report reads them (e.g. "Tecator_TEST.ts, 43 samples").
        accuracy_shown: Held-out accuracy has a line of its own already (classification): no second one.
        replayed: The samples of a dataset replayed in a loop (each scored once per pass); None: a live stream.
    """
    if figures is None or figures.headline not in figures.prequential.running:
        return []
    headline, baseline, fleet = figures.headline, figures.baseline, figures.prequential
    name = _DISPLAY.get(headline, headline.replace("_", " "))
    note = f" ({figures.baseline_note})" if figures.baseline_note else ""
    scored = (f"{fleet.samples:,} scorings of {replayed:,} samples replayed in a loop, each before the step that "
              "trained it" if replayed and fleet.samples > replayed else
              f"each of {fleet.samples:,} samples scored before it was trained")
    line = (f"test-then-train {name} ({scored}): {_shown(fleet.recent.get(headline))} over the last "
            f"{figures.window_steps} steps, {_shown(fleet.running.get(headline))} over the run")
    if baseline and baseline in fleet.recent:
        line += f"; baseline{note} {_shown(fleet.recent.get(baseline))}"
    lines = [line, *_per_value_line(f"{name} over the last {figures.window_steps} steps", fleet.recent, headline,
                                    baseline)]
    final, first = figures.heldout_final, figures.heldout_first
    if headline in final and not (accuracy_shown and headline == "accuracy"):
        against = f" against {_shown(final[baseline])} for the baseline" if baseline and baseline in final else ""
        where = f" ({heldout})" if heldout else ""
        lines.append(f"held-out {name}{where}: {_shown(first.get(headline))} at the first evaluation, "
                     f"{_shown(final[headline])} at the last{against}")
        lines.extend(_per_value_line(f"held-out {name} at the last evaluation", final, headline, baseline))
    return lines


#: What `learned_nothing_lines` suggests, in order.
TRY_INSTEAD = ("a longer run (--duration, --steps), so that the model sees the data more often",
               "another model: --set trainer.model=mlp (one-frame samples), seq (series) or conv",
               "a smaller learning rate (--set trainer.lr=0.01) or --set trainer.optimizer=adamw",
               "whether the features carry the target at all (the inputs are standardised: trainer.input_shift)")


def learned_nothing_lines(figures: ObjectiveFigures | None) -> list[str]:
    """A warning when the model is no better than the trivial baseline (held-out at the last evaluation, or
    test-then-train over the last window: past the warm-up), with what to try; none when it is better or no figure
    can say."""
    if figures is None or not figures.baseline:
        return []
    headline, baseline = figures.headline, figures.baseline
    name = _DISPLAY.get(headline, headline.replace("_", " "))
    for what, metrics in (("held-out", figures.heldout_final), ("test-then-train", figures.prequential.recent)):
        model, trivial = metrics.get(headline), metrics.get(baseline)
        if model is None or trivial is None:
            continue
        if (model > trivial) if figures.higher_is_better else (model < trivial):
            return []
        note = f" ({figures.baseline_note})" if figures.baseline_note else ""
        return [f"the model learned nothing worth serving: {what} {name} {_shown(model)} is no better than the "
                f"trivial baseline's {_shown(trivial)}{note}; serve's promotion gate refuses such a version "
                "(serve.beat_baseline). Try: " + "; ".join(TRY_INSTEAD)]
    return []


def heldout_rows(figures: ObjectiveFigures | None) -> list[tuple[str, float]]:
    """The summary table's held-out rows in the objective's terms: its headline metric and its baseline's at the
    last evaluation (`heldout_rmse_final`, `heldout_baseline_rmse_final`, ...); none without an evaluation."""
    if figures is None:
        return []
    keys = [k for k in (figures.headline, figures.baseline) if k and k in figures.heldout_final]
    return [(f"heldout_{k}_final", figures.heldout_final[k]) for k in keys]
