"""The run report: `report.json` (the figures) and `series.json` (what the plots draw), from Kafka records.

Time series come from the feedback topic (one record per rank per step) and the assignments topic
(one plan per step), with lag rebuilt from the device topics' append times, so a report needs
neither Prometheus nor the services to be alive any more.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from streamtrain.coordinator.balance import straggler_effect
from streamtrain.periods import WALL_PARTS, split_wall_period
from streamtrain.report.ledger import DeviceTally, RunRecords
from streamtrain.report.schema import RunFigures
from streamtrain.wire import StepFeedback

__all__ = ["build_report", "build_series", "by_step", "median", "sample_delays", "step_periods", "weighted_loss",
           "write_json"]

#: Steps averaged into `final_loss` (one step's loss is one small batch: noisy).
FINAL_LOSS_STEPS = 10


def median(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if len(values) else None


def by_step(feedback: Sequence[StepFeedback]) -> dict[int, list[StepFeedback]]:
    steps: dict[int, list[StepFeedback]] = defaultdict(list)
    for fb in feedback:
        steps[fb.step].append(fb)
    return dict(sorted(steps.items()))


def weighted_loss(records: Sequence[StepFeedback]) -> float | None:
    pairs = [(fb.loss, fb.samples) for fb in records if fb.loss is not None and fb.samples > 0]
    total = sum(n for _, n in pairs)
    return sum(loss * n for loss, n in pairs) / total if total else None


def _t0_ms(run: RunRecords) -> int:
    starts = [int(r.timestamps_ms.min()) for r in run.records.values() if len(r)]
    starts += [int(fb.started_at) for fb in run.feedback]
    return min(starts) if starts else 0


def _device_series(run: RunRecords, device: str, t0: int) -> dict[str, list[Any]]:
    """One device's feedback over time: batch, timings, buffer, lag rebuilt from the append times, truncation."""
    recs = run.records[device]
    times = np.sort(recs.timestamps_ms)
    first = int(recs.offsets.min()) if len(recs) else 0
    fields = ("step_seconds", "compute_seconds", "plan_wait_seconds", "data_wait_seconds", "hold_seconds",
              "buffer_depth", "loss")
    series: dict[str, list[Any]] = {k: [] for k in ("t", "step", "batch", "batch_size_total", *fields, "lag",
                                                     "truncated_cumulative")}
    dropped = 0
    for fb in sorted((f for f in run.feedback if f.device_id == device), key=lambda f: f.step):
        dropped += fb.dropped
        appended = int(np.searchsorted(times, fb.sent_at, side="right"))
        for key, value in (("t", (fb.sent_at - t0) / 1e3), ("step", fb.step), ("batch", fb.samples),
                           ("batch_size_total", fb.total_size), *((f, getattr(fb, f)) for f in fields),
                           ("lag", max(0, first + appended - fb.lowest_unprocessed_offset)),
                           ("truncated_cumulative", dropped)):
            series[key].append(value)
    return series


def _rates(run: RunRecords, devices: dict[str, dict[str, list[Any]]], t0: int, bin_s: float) -> dict[str, Any]:
    """Samples produced and trained per second per device, in bins of `bin_s` to the last record or report."""
    ends = [s["t"][-1] for s in devices.values() if s["t"]]
    ends += [(int(r.timestamps_ms.max()) - t0) / 1e3 for r in run.records.values() if len(r)]
    edges = np.arange(0.0, max(ends, default=0.0) + bin_s, bin_s)
    rates: dict[str, dict[str, list[float]]] = {}
    for device in run.devices:
        produced_t = (run.records[device].timestamps_ms - t0) / 1e3
        s = devices[device]
        produced, _ = np.histogram(produced_t, bins=edges) if len(edges) > 1 else (np.zeros(0), None)
        trained, _ = np.histogram(s["t"], bins=edges, weights=s["batch"]) if len(edges) > 1 else (np.zeros(0), None)
        rates[device] = {"produced_per_s": (produced / bin_s).tolist(), "trained_per_s": (trained / bin_s).tolist()}
    return {"bin_s": bin_s, "t": edges[:-1].tolist(), "devices": rates}


def build_series(run: RunRecords, bin_s: float = 1.0) -> dict[str, Any]:
    """Per-device and per-step series over time (seconds since the first record or step)."""
    t0 = _t0_ms(run)
    steps = by_step(run.feedback)
    per_step: dict[str, list[Any]] = {"step": [], "t": [], "straggler_effect": [], "loss": [], "global_batch": []}
    for step, records in steps.items():
        per_step["step"].append(step)
        per_step["t"].append((max(fb.sent_at for fb in records) - t0) / 1e3)
        per_step["straggler_effect"].append(straggler_effect([fb.compute_seconds for fb in records])
                                            if len(records) > 1 else None)
        per_step["loss"].append(weighted_loss(records))
        per_step["global_batch"].append(sum(fb.samples for fb in records))
    devices = {device: _device_series(run, device, t0) for device in run.devices}
    plans: dict[str, list[Any]] = {"step": [], "step_time_target": [], "predicted_seconds": []}
    for plan in sorted(run.assignments, key=lambda a: a.step):
        plans["step"].append(plan.step)
        plans["step_time_target"].append(plan.step_time_target)
        plans["predicted_seconds"].append({d.device_id: d.predicted_seconds for d in plan.devices})
    return {"t0_ms": t0, "per_step": per_step, "devices": devices, "rates": _rates(run, devices, t0, bin_s),
            "plans": plans}


def step_periods(steps: Mapping[int, Sequence[StepFeedback]]) -> dict[int, float]:
    """Seconds between consecutive steps' last reports, by the later step: a step's wall period, held
    reports and plan waits included."""
    ends = [(step, max(fb.sent_at for fb in records)) for step, records in steps.items()]
    return {s: (t - t_prev) / 1e3 for (s_prev, t_prev), (s, t) in pairwise(ends) if s == s_prev + 1}


def sample_delays(run: RunRecords) -> list[float]:
    """Seconds from each sample's append to the report of the step that processed it (trained or dropped).

    A report's lowest unprocessed offset says that every offset below it is done; the first report that
    passes a sample's offset is the one that processed it. Samples never passed are left out.
    """
    out: list[float] = []
    for device in run.devices:
        reports = sorted((fb for fb in run.feedback if fb.device_id == device), key=lambda fb: fb.step)
        if not reports:
            continue
        passed = np.maximum.accumulate([fb.lowest_unprocessed_offset for fb in reports])
        sent = np.array([fb.sent_at for fb in reports], dtype=np.float64)
        records = run.records[device]
        offsets = records.offsets
        appended = records.timestamps_ms.astype(np.float64)
        first = np.searchsorted(passed, offsets, side="right")  # the first report with lowest > offset
        done = first < len(reports)
        out.extend(((sent[first[done]] - appended[done]) / 1e3).tolist())
    return out


def _loss_ends(steps: Mapping[int, Sequence[StepFeedback]]) -> tuple[float | None, float | None]:
    """The initial and final loss: up to FINAL_LOSS_STEPS steps at each end, never overlapping (a run that trained
    in a few steps, a small backlog then idle steps, would otherwise report the same steps' loss twice)."""
    with_loss = [r for r in steps.values() if weighted_loss(r) is not None]
    ends = min(FINAL_LOSS_STEPS, max(1, len(with_loss) // 2))
    return (weighted_loss([fb for r in with_loss[:ends] for fb in r]),
            weighted_loss([fb for r in with_loss[-ends:] for fb in r]))


def _fates(tallies: Sequence[DeviceTally]) -> dict[str, Any]:
    """The accounting figures: every record of every device topic in one bin, summed over the devices."""
    fates = [t.fates for t in tallies]
    reasons: Counter[str] = Counter()
    for tally in tallies:
        reasons.update(tally.dead_letter_reasons)
    return {
        "samples_produced": sum(f.records for f in fates),
        "samples_trained": sum(f.trained for f in fates),
        "samples_truncated": sum(f.truncated for f in fates),
        "samples_dead_lettered": sum(f.dead_lettered for f in fates),
        "samples_pending": sum(f.pending for f in fates),
        "samples_lost": sum(len(f.lost) for f in fates),
        "samples_duplicated": sum(f.retrained for f in fates),
        "samples_unaccounted": sum(f.unaccounted for f in fates),
        "records_written_twice": sum(f.written_twice for f in fates),
        "dead_letter_reasons": dict(sorted(reasons.items())),
        "per_device": {t.device: t.summary() for t in tallies},
    }


def _step_figures(run: RunRecords, steps: Mapping[int, Sequence[StepFeedback]]) -> dict[str, Any]:
    """Step time, wall period and where it goes, and SE, over the steps that trained something."""
    # The idle steps of a paused or drained stream (each an idle wait on near-zero compute) would swamp them.
    busy = {s: r for s, r in steps.items() if sum(fb.samples for fb in r) > 0}
    full = [r for r in busy.values() if len(r) == len(run.devices) and len(r) > 1]
    timed = {s: p for s, p in step_periods(steps).items() if s in busy}
    periods = list(timed.values())
    # Where the wall period goes, over the busy steps whose period is known (the first step's is not).
    splits = [split_wall_period(busy[s], p) for s, p in timed.items()]
    return {
        "steps_idle": len(steps) - len(busy),
        "straggler_effect_median": median([straggler_effect([fb.compute_seconds for fb in r]) for r in full]),
        "step_seconds_median": median([max(fb.step_seconds for fb in r) for r in busy.values()]),
        "step_period_seconds_median": median(periods),
        "step_period_split_median": {part: median([x[part] for x in splits]) for part in WALL_PARTS},
        "plan_wait_seconds_median": median([x["plan_wait"] for x in splits]),
        "plan_wait_step_fraction_median": median([x["plan_wait"] / p for x, p in zip(splits, periods, strict=True)
                                                  if p > 0]),
    }


def build_report(run: RunRecords, tallies: Sequence[DeviceTally]) -> RunFigures:
    """What Kafka holds about a run: every record's fate, and the steps' figures (a part of `report.json`)."""
    steps = by_step(run.feedback)
    delays = sample_delays(run)
    span_s = 0.0
    if run.feedback:
        start = min(fb.started_at for fb in run.feedback)
        span_s = (max(fb.sent_at for fb in run.feedback) - start) / 1e3
    fates = _fates(tallies)
    initial, final = _loss_ends(steps)
    return RunFigures(
        devices=len(run.devices),
        steps=len(steps),
        **fates,
        **_step_figures(run, steps),
        sample_delay_seconds_median=median(delays),
        sample_delay_seconds_p99=float(np.percentile(delays, 99)) if delays else None,
        throughput_samples_per_s=fates["samples_trained"] / span_s if span_s > 0 else None,
        training_seconds=span_s,
        initial_loss=initial,
        final_loss=final,
        rank_steps_on_local_plan=sum(1 for fb in run.feedback if fb.plan_step < 0),
        plans_published=len(run.assignments),
        unreadable_records=run.unreadable,
    )


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, default=float) + "\n")
