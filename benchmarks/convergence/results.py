"""What the convergence benchmark measures, typed, and the analysis that turns training curves into it."""

from __future__ import annotations

from typing import Literal

import numpy as np

from ..common import Record
from .setup import AGGREGATIONS, ConvergenceSetup

__all__ = ["ConvergenceCell", "ConvergenceResult", "Curve", "Schedule", "analyse", "schedule_summary", "smoothed"]


class Curve(Record):
    """A cell's held-out accuracy and loss after every step, against the global samples trained so far."""

    step: list[int]
    samples: list[int]
    accuracy: list[float]
    loss: list[float]


class ConvergenceCell(Record):
    """One aggregation's figures."""

    aggregation: str
    samples_to_target: int | None
    """Global samples trained up to the first step whose smoothed accuracy reaches the target."""
    steps_to_target: int | None
    samples_to_stay_at_target: int | None
    """Where the smoothed accuracy reaches the target for good (None: it falls below it again)."""
    final_accuracy: float
    """Mean held-out accuracy over the last tenth of the steps."""
    last_accuracy: float
    best_smoothed_accuracy: float
    final_heldout_loss: float
    samples_trained: int
    ratio_to_sgd: float | None
    stay_ratio_to_sgd: float | None


class Schedule(Record):
    """How uneven the per-rank batches were."""

    global_batch_min: int
    global_batch_median: float
    global_batch_max: int
    per_rank_mean_batch: list[float]
    idle_rank_steps: int
    rank_steps: int
    empty_steps: int


class ConvergenceResult(Record):
    """What `convergence.json` holds."""

    benchmark: Literal["convergence"] = "convergence"
    target_accuracy: float
    cells: list[ConvergenceCell]
    weighted_vs_sgd_max_param_diff: float
    plain_vs_sgd_max_param_diff: float
    schedule: Schedule
    setup: ConvergenceSetup
    cell_seconds: dict[str, float]
    seconds: float
    curves: dict[str, Curve]

    def cell(self, aggregation: str) -> ConvergenceCell | None:
        return next((c for c in self.cells if c.aggregation == aggregation), None)


def smoothed(accuracy: list[float], window: int) -> np.ndarray:
    """Trailing mean of the held-out accuracy over `window` evaluations (one per step)."""
    a = np.asarray(accuracy, dtype=np.float64)
    sums = np.concatenate([[0.0], np.cumsum(a)])
    idx = np.arange(1, len(a) + 1)
    lo = np.maximum(idx - window, 0)
    return (sums[idx] - sums[lo]) / (idx - lo)


def analyse(setup: ConvergenceSetup, curves: dict[str, Curve]) -> list[ConvergenceCell]:
    """One row per cell: samples and steps to the target, final accuracy, ratio to SGD.

    The target is judged on the trailing mean of `setup.smooth_steps` evaluations, so one lucky
    evaluation does not count as reaching it. `samples_to_stay_at_target` is where the smoothed
    accuracy reaches the target for good (it never falls below it again before the end).
    """
    rows = []
    reference: dict[str, int | None] = {}
    for name in AGGREGATIONS:  # sgd first: the others' ratios are to it
        if name not in curves:
            continue
        curve = curves[name]
        smooth = smoothed(curve.accuracy, setup.smooth_steps)
        above = smooth >= setup.target_accuracy
        hit = int(np.argmax(above)) if above.any() else None
        below = np.nonzero(~above)[0]
        stay = (int(below[-1]) + 1 if len(below) else 0) if above[-1] else None
        samples = int(curve.samples[hit]) if hit is not None else None
        stay_samples = int(curve.samples[stay]) if stay is not None else None
        if name == "sgd":
            reference = {"samples": samples, "stay": stay_samples}
        tail = curve.accuracy[-max(1, len(curve.accuracy) // 10):]
        rows.append(ConvergenceCell(
            aggregation=name,
            samples_to_target=samples,
            steps_to_target=int(curve.step[hit]) if hit is not None else None,
            samples_to_stay_at_target=stay_samples,
            final_accuracy=round(float(np.mean(tail)), 4),
            last_accuracy=round(float(curve.accuracy[-1]), 4),
            best_smoothed_accuracy=round(float(smooth.max()), 4),
            final_heldout_loss=round(float(np.mean(curve.loss[-len(tail):])), 4),
            samples_trained=int(curve.samples[-1]),
            ratio_to_sgd=_ratio(samples, reference.get("samples")),
            stay_ratio_to_sgd=_ratio(stay_samples, reference.get("stay")),
        ))
    return rows


def _ratio(got: int | None, ref: int | None) -> float | None:
    return round(float(got) / ref, 4) if ref and got is not None else None


def schedule_summary(setup: ConvergenceSetup) -> Schedule:
    """Global batch range, per-rank mean batch, idle rank-steps and empty steps of the setup's schedule."""
    counts = setup.counts()
    totals = counts.sum(axis=1)
    return Schedule(
        global_batch_min=int(totals.min()), global_batch_median=float(np.median(totals)),
        global_batch_max=int(totals.max()),
        per_rank_mean_batch=[round(float(c), 2) for c in counts.mean(axis=0)],
        idle_rank_steps=int((counts == 0).sum()), rank_steps=int(counts.size),
        empty_steps=int((totals == 0).sum()),
    )
