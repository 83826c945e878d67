"""What balance means in a streaming run, and what the model learned: figures for the report and the live view.

At line rate a device with a light stream finishes its step early by design, so the straggler
effect SE over compute seconds says nothing about balance there. What does:

- **keeping up**: a device's lag (appended minus processed records) stays level; its trend
  `lag_trend` in records per second is about zero (bursts come and go), not a steady climb;
- **headroom**: the share of the wall time a device did *not* spend computing (1 - busy);
- **SE where every device has work waiting**: steps that left, on every device, samples that had
  arrived before the step began. Only there could a balanced plan have filled every device's step.

`static_step_estimate` answers "what would conventional DDP have cost here": each device's time model
`T = a·size + b` fitted on the run's own feedback (the coordinator's robust fit), evaluated at the
batch static per-device splitting gives it — the step's global batch in equal counts, at the device's
own mean sample size — against the step time measured. The benchmarks reuse every function here.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamtrain.coordinator.balance import straggler_effect
from streamtrain.coordinator.perfmodel import fit_linear_robust
from streamtrain.report.ledger import RunRecords
from streamtrain.report.objective import closing_objective_lines, learned_nothing_lines
from streamtrain.report.schema import (
    BalanceFigures,
    DeviceBalanceFigures,
    HeldoutFigures,
    HeldoutPoint,
    StackReport,
    StaticVsMeasured,
    TimeModel,
)
from streamtrain.wire import Evaluation, StepFeedback

__all__ = [
    "KEEPS_UP_FRACTION",
    "LOOKBACK_STEPS",
    "MIN_WAITING_STEPS",
    "DeviceBalance",
    "balance_figures",
    "closing_lines",
    "device_balance",
    "fit_time_models",
    "heldout_figures",
    "keeps_up",
    "lag_trend",
    "static_step_estimate",
    "waiting_work",
]

#: A plan for step s knows at least the samples reported with the feedback of step s - LOOKBACK_STEPS.
LOOKBACK_STEPS = 2

#: Steps with work waiting everywhere needed before static vs measured is compared over those steps alone.
MIN_WAITING_STEPS = 5

#: A device keeps up while its lag grows by at most this share of its arrival rate (a trend, not bursts).
KEEPS_UP_FRACTION = 0.05


def lag_trend(times: Sequence[float], lags: Sequence[float]) -> float | None:
    """Least-squares slope of lag (records) over time (seconds): records/s the backlog grows by (None: < 2 points)."""
    t = np.asarray(times, dtype=np.float64)
    y = np.asarray(lags, dtype=np.float64)
    if len(t) < 2 or np.ptp(t) <= 0:
        return None
    return float(np.polyfit(t, y, 1)[0])


def keeps_up(trend: float | None, arrival_rate: float | None, lag_now: float | None = None) -> bool | None:
    """Whether a device keeps up with its stream: its lag grows by at most KEEPS_UP_FRACTION of its arrivals
    (or it has next to no lag at all). None when there is not enough to tell."""
    if lag_now is not None and arrival_rate is not None and lag_now <= max(1.0, arrival_rate):
        return True  # under a second of arrivals waiting: keeping up, whatever the trend's noise
    if trend is None or arrival_rate is None:
        return None
    return trend <= KEEPS_UP_FRACTION * max(arrival_rate, 1e-9)


def waiting_work(run: RunRecords) -> dict[int, dict[str, int]]:
    """Per step and device: samples the coordinator knew of when it planned the step and the step left behind.

    A rank reports the offsets it newly buffered with each step's feedback; a plan for step s is made
    from the reports of step s - 2 at the latest (plans are made a step ahead). Samples reported by then
    and still unprocessed after step s were work the device had waiting beyond its batch. At line rate
    (every plan takes everything known) there are none; under a backlog, there are.
    """
    out: dict[int, dict[str, int]] = {}
    for device in run.devices:
        reports = sorted((fb for fb in run.feedback if fb.device_id == device), key=lambda fb: fb.step)
        known_end: dict[int, int] = {}  # step -> one past the highest offset reported up to that step
        end = 0
        for fb in reports:
            end = max([end, *(p.offset + 1 for p in fb.new_samples)])
            known_end[fb.step] = end
        steps = sorted(known_end)
        for fb in reports:
            # The newest report at or before step s - 2 (feedback of a step may be missing after a restart).
            i = bisect.bisect_right(steps, fb.step - LOOKBACK_STEPS)
            known = known_end[steps[i - 1]] if i else 0
            out.setdefault(fb.step, {})[device] = max(0, known - fb.lowest_unprocessed_offset)
    return out


def fit_time_models(feedback: Sequence[StepFeedback], devices: Sequence[str]) -> dict[str, tuple[float, float]]:
    """Each device's `(a, b)` of compute seconds = a·total size + b over its steps with samples (robust fit)."""
    models: dict[str, tuple[float, float]] = {}
    for device in devices:
        rows = [(fb.total_size, fb.compute_seconds) for fb in feedback if fb.device_id == device and fb.samples > 0]
        if len(rows) < 2 or len({x for x, _ in rows}) < 2:
            continue
        x = np.asarray([[r[0] for r in rows]], dtype=np.float64)
        y = np.asarray([[r[1] for r in rows]], dtype=np.float64)
        prior = np.asarray([float(np.median(y / x))])
        a, b = fit_linear_robust(x, y, np.ones_like(x), prior)
        models[device] = (float(a[0]), float(b[0]))
    return models


def static_step_estimate(feedback: Sequence[StepFeedback], devices: Sequence[str],
                         models: Mapping[str, tuple[float, float]] | None = None,
                         steps: set[int] | None = None, over: str = "") -> StaticVsMeasured | None:
    """Median compute time of the slowest device per step: estimated under static per-device batches vs measured.

    Over the steps (of `steps`, when given) where every device reported and the step trained something:
    static gives each device global batch / n samples of its own mean size; `models` (default: fitted on
    `feedback`) price that; `over` says which steps those are.

    Returns:
        The two medians and their ratio, or None when a device has no fitted model or no step qualifies.
    """
    models = dict(models) if models is not None else fit_time_models(feedback, devices)
    if any(d not in models for d in devices) or not devices:
        return None
    trained = {d: [fb for fb in feedback if fb.device_id == d and fb.samples > 0] for d in devices}
    mean_size = {d: sum(fb.total_size for fb in fbs) / max(1, sum(fb.samples for fb in fbs))
                 for d, fbs in trained.items()}
    by_step: dict[int, list[StepFeedback]] = {}
    for fb in feedback:
        by_step.setdefault(fb.step, []).append(fb)
    static: list[float] = []
    measured: list[float] = []
    for step, records in by_step.items():
        batch = sum(fb.samples for fb in records)
        if len(records) != len(devices) or batch == 0 or (steps is not None and step not in steps):
            continue
        share = batch / len(devices)
        static.append(max(models[d][0] * share * mean_size[d] + models[d][1] for d in devices))
        measured.append(max(fb.compute_seconds for fb in records))
    if not static:
        return None
    s, m = float(np.median(static)), float(np.median(measured))
    return StaticVsMeasured(steps=len(static), static_seconds_median=s, measured_seconds_median=m,
                            speedup=s / m if m > 0 else None, over=over,
                            models={d: TimeModel(a=a, b=b, mean_size=mean_size[d]) for d, (a, b) in models.items()})


@dataclass(frozen=True)
class DeviceBalance:
    """One device over a run: does it keep up, and how much room does it have?"""

    device: str
    arrival_rate: float | None
    """Records per second appended while the streams ran."""
    lag_trend: float | None
    """Records per second the lag grew by (least squares over the run's reports)."""
    lag_max: int
    busy_ratio: float | None
    """Compute seconds over the wall time between its first and last report."""
    keeps_up: bool | None

    @property
    def headroom(self) -> float | None:
        return None if self.busy_ratio is None else max(0.0, 1.0 - self.busy_ratio)


def device_balance(run: RunRecords, lag_series: Mapping[str, Mapping[str, Sequence[Any]]],
                   t0_ms: int) -> list[DeviceBalance]:
    """Keeping up and headroom of every device, from its records, reports and lag series (`build_series`, whose
    times count from `t0_ms`)."""
    out = []
    for device in run.devices:
        held = run.records.get(device)
        stamps = sorted(int(t) for t in held.timestamps_ms) if held is not None else []
        produced_span = (stamps[-1] - stamps[0]) / 1e3 if len(stamps) > 1 else 0.0
        rate = (len(stamps) - 1) / produced_span if produced_span > 0 else None
        series = lag_series.get(device, {})
        begin = (stamps[0] - t0_ms) / 1e3 if stamps else 0.0
        end = (stamps[-1] - t0_ms) / 1e3 if stamps else 0.0
        # The trend while the stream ran: after the producers stop, the drain only shrinks the lag.
        points = [(t, lag) for t, lag in zip(series.get("t", []), series.get("lag", []), strict=True)
                  if begin <= t <= end]
        trend = lag_trend([p[0] for p in points], [p[1] for p in points])
        mine = sorted((fb for fb in run.feedback if fb.device_id == device), key=lambda fb: fb.step)
        wall = (mine[-1].sent_at - mine[0].sent_at) / 1e3 if len(mine) > 1 else 0.0
        busy = sum(fb.compute_seconds for fb in mine[1:]) / wall if wall > 0 else None
        lags = [int(v) for v in series.get("lag", [])]
        out.append(DeviceBalance(device, rate, trend, max(lags, default=0), busy,
                                 keeps_up(trend, rate, lags[-1] if lags and trend is None else None)))
    return out


def heldout_figures(evaluations: Sequence[Evaluation], t0_ms: int) -> HeldoutFigures:
    """Held-out accuracy over the run: first, last and best, the evaluation pauses, and the series to plot."""
    evals = sorted(evaluations, key=lambda e: (e.step, e.sent_at))
    if not evals:
        return HeldoutFigures()
    seconds = [e.seconds for e in evals]
    return HeldoutFigures(
        heldout_dataset=evals[-1].dataset,
        heldout_samples=evals[-1].samples,
        heldout_evaluations=len(evals),
        heldout_accuracy_first=evals[0].accuracy,
        heldout_accuracy_final=evals[-1].accuracy,
        heldout_accuracy_best=max((e.accuracy for e in evals if e.accuracy is not None), default=None),
        heldout_loss_final=evals[-1].loss,
        heldout_seconds_median=float(np.median(seconds)),
        heldout_seconds_max=float(max(seconds)),
        heldout=[HeldoutPoint(step=e.step, t=(e.sent_at - t0_ms) / 1e3, accuracy=e.accuracy, loss=e.loss,
                              seconds=e.seconds) for e in evals],
    )


def balance_figures(run: RunRecords, series: Mapping[str, Any]) -> BalanceFigures:
    """The report's balance figures (see the module docstring)."""
    waiting = waiting_work(run)
    by_step: dict[int, list[StepFeedback]] = {}
    for fb in run.feedback:
        by_step.setdefault(fb.step, []).append(fb)
    backlogged = [s for s, records in by_step.items()
                  if len(records) == len(run.devices) > 1 and sum(fb.samples for fb in records) > 0
                  and all(waiting.get(s, {}).get(d, 0) > 0 for d in run.devices)]
    se = [straggler_effect([fb.compute_seconds for fb in by_step[s]]) for s in backlogged]
    balance = device_balance(run, series.get("devices", {}), int(series.get("t0_ms", 0)))
    # Static vs measured where the comparison means something: steps with work waiting everywhere (at line rate
    # a step's batches are whatever arrived, under any policy); every step when there were too few of those.
    estimate = static_step_estimate(run.feedback, run.devices, steps=set(backlogged),
                                    over="steps with work waiting on every device") \
        if len(backlogged) >= MIN_WAITING_STEPS else None
    if estimate is None:
        estimate = static_step_estimate(run.feedback, run.devices,
                                        over="steps, all of them (too few had work waiting on every device)")
    return BalanceFigures(
        steps_every_device_waiting=len(backlogged),
        straggler_effect_waiting_median=float(np.median(se)) if se else None,
        devices_keeping_up=sum(1 for b in balance if b.keeps_up),
        balance_per_device={b.device: DeviceBalanceFigures(
            arrival_rate=b.arrival_rate, lag_trend_per_s=b.lag_trend, lag_max=b.lag_max, busy_ratio=b.busy_ratio,
            headroom=b.headroom, keeps_up=b.keeps_up) for b in balance},
        static_vs_measured=estimate,
    )


def closing_lines(report: StackReport) -> list[str]:
    """The lines `streamtrain up` ends with: what the model learned (test-then-train, held-out), who kept up, and
    static vs measured step time."""
    accuracy = bool(report.heldout_evaluations) and report.heldout_accuracy_final is not None
    heldout = f"{report.heldout_dataset}, {report.heldout_samples} samples" if report.heldout_evaluations else None
    lines = closing_objective_lines(report.objective, heldout, accuracy_shown=accuracy, replayed=report.dataset_samples)
    if accuracy:
        classes, majority = report.num_classes, report.heldout_chance
        chance = (f"; chance {majority:.2f} (always its most common class)" if majority is not None
                  else f"; chance {1 / classes:.2f} with {classes} classes" if classes else "")
        lines.append(f"held-out accuracy ({report.heldout_dataset}, {report.heldout_samples} samples): "
                     f"{report.heldout_accuracy_first:.3f} at the first evaluation, "
                     f"{report.heldout_accuracy_final:.3f} at the last{chance}")
    per_device = report.balance_per_device
    if per_device:
        rooms = ", ".join(f"{d} {v.headroom:.0%}" if v.headroom is not None else f"{d} -"
                          for d, v in per_device.items())
        lines.append(f"keeping up (lag level, not climbing): {report.devices_keeping_up} of "
                     f"{len(per_device)} devices; headroom (share of time not computing): {rooms}")
    waiting = report.straggler_effect_waiting_median
    lines.append(f"SE over the {report.steps_every_device_waiting} steps where every device had work "
                 "waiting: " + (f"{waiting:.3f}" if waiting is not None else "- (no such step: every stream was "
                                "kept up with; SE at line rate says nothing about balance)"))
    estimate = report.static_vs_measured
    if estimate is not None and estimate.speedup is not None:
        lines.append(f"step time (slowest device's compute, median over {estimate.steps} {estimate.over}): "
                     "static per-device "
                     f"batches {estimate.static_seconds_median * 1e3:.0f} ms (each device's fitted T = a*size + b "
                     f"at global batch / n) vs measured {estimate.measured_seconds_median * 1e3:.0f} ms "
                     f"with {report.policy}: {estimate.speedup:.2f}x")
    return [*lines, *learned_nothing_lines(report.objective)]
