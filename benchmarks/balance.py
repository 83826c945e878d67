"""`streamtrain bench balance`: every planning policy on the live stack, under emulated heterogeneity and DIF.

Each cell is one `stack.runner.LocalStack` run — coordinator, `streamtrain train --local-ranks 4` (gloo on
the CPU), the real Kafka broker — differing only in the policy, the per-rank slow-down factors and the DIF
(std of sample sizes) of the device streams.

Emulated devices. Rank r's compute takes time_scale x factor_r x the CPU time its training thread used
(`trainer.slowdowns` on the CPU clock: the rank sleeps the difference after its step). CPU time, unlike
elapsed time, hardly changes when four ranks, the coordinator and the broker time-share two cores, and
time_scale (4) leaves each rank needing a fraction of a core, so a rank's step time is its plan's, not the
scheduler's. The ranks run on jemalloc with a memory reserve (`trainer.cpu_allocator`,
`trainer.memory_reserve_mb`): without them a batch larger than any before page-faults its new memory in,
which doubled single steps at random. What is left is the machine's own step-to-step CPU-time noise; the
optional control row (every factor 1, DIF 0, identical batches under static) measures it.

One embedded broker serves the whole benchmark; each cell
gets its own topic prefix and job, and its topics are deleted once its records are read back.

Fairness:

- the same data: before a cell's services start, every device topic is filled with the same fixed
  backlog (each device's stream drawn from its own seeded generator), and no live producer runs, so
  step times reflect the plan rather than arrival rates, and every cell of a DIF trains the same samples;
- the same global batch: `coordinator.global_batch` samples per step for the count-based policies
  (static, lbbsp, lbb, chronica); ett-stream, seeing only backlog, sets its step-time target to the
  equal time in which the fleet trains that many samples. scadles sizes batches by stream rate
  (b_i = S_i); a backlog has no rate, and equal streams would have equal rates, so its cells give
  every device b_min = global_batch / devices — what ScaDLES does with equal stream rates;
- the same model, seed, learning rate (trainer.base_batch = global_batch, so lr is `trainer.lr`) and
  weighted aggregation everywhere;
- a fixed window: the first `warmup_steps` steps (models still fitting) are left out of every figure
  but the time to the target loss, which counts from the start of step 0.

Figures per cell (all read back from the feedback topic): `step_seconds_median` (the slowest rank's
step — collate, compute, gradient all-reduce and the emulated sleep — LBB Table 2's iteration time),
`wall_step_seconds_median` (time between consecutive step completions, plan round trip and data waits
included), `straggler_effect_median` (LBB Eq. 4 on the ranks' compute seconds, sleep included),
`samples_per_s` and `size_per_s` (work: sample size trained per second) over the window, the mean size of
the samples trained (a policy that picks small samples first trains less per sample), and
`seconds_to_target_loss`.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from coordinator.metrics import straggler_effect
from stack.report import by_step, median, weighted_loss
from streamtrain.config import StreamtrainConfig
from streamtrain.config.coordinator import POLICY_NAMES
from streamtrain.config.loader import load_config, parse_assignment
from streamtrain.wire import StepFeedback

from .registry import save_figure

__all__ = [
    "BalanceCell",
    "BalanceSetup",
    "CellProgress",
    "analyse_cell",
    "balance_command",
    "combine_repeats",
    "finish_figures",
    "plot_balance",
    "run_balance",
    "summarise",
]

logger = logging.getLogger(__name__)

#: `(cell index, cells, cell, step, until_step, phase)` — what a progress display receives.
CellProgress = Callable[[int, int, "BalanceCell", int, int, str], None]

#: Largest share of the global batch any policy is expected to give one device (backlog sizing).
_MAX_SHARE = 0.42
#: Steps the ranks may run past `until_step` before they stop (the stack polls twice a second).
_OVERSHOOT_STEPS = 12


@dataclass(frozen=True)
class BalanceCell:
    """One run of the matrix."""

    policy: str
    slowdowns: tuple[float, ...]
    dif: float

    @property
    def label(self) -> str:
        return f"{self.policy} slow-downs {','.join(f'{f:g}' for f in self.slowdowns)} DIF {self.dif:g}"


@dataclass(frozen=True)
class BalanceSetup:
    """The balance experiment: the matrix, the stream, the batch and the measured window."""

    policies: tuple[str, ...] = POLICY_NAMES
    slowdowns: tuple[tuple[float, ...], ...] = ((1.0, 1.0, 1.0, 4.0),)
    difs: tuple[float, ...] = (0.0, 16.0, 64.0)
    size_mean: float = 45.0
    global_batch: int = 512
    """Samples per step over all ranks (coordinator.global_batch)."""
    time_scale: float = 4.0
    """Every rank computes this many times slower than its CPU time on this machine (the slow-down factors
    multiply on top, on the CPU clock: `trainer.slowdown_clock=cpu`). With 4 ranks time-sharing 2 cores, a rank
    timed by the wall clock is as slow as its neighbours are busy; a rank that needs only a third of a core
    for its emulated speed is not, so the cell's balance is the plan's, not the scheduler's."""
    warmup_steps: int = 10
    """Steps left out of every figure but the time to the target loss."""
    steps: int = 30
    """Measured steps after the warm-up."""
    smooth_steps: int = 5
    """Trailing steps the loss is averaged over before it is compared with the target."""
    model_window: int = 8
    """coordinator.model_window: feedback records each device's time model is fitted on (every policy
    that uses the models gets the same)."""
    seed: int = 0
    repeats: int = 1
    """Runs of the whole matrix, one after another (each cell's figures are the median over its runs, so slow
    drift of the machine falls on every policy alike)."""
    start_timeout_s: float = 240.0
    extra_sets: tuple[str, ...] = ()
    """Further `--set key=value` for every cell (after the benchmark's own)."""
    notes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.policies) - set(POLICY_NAMES))
        if unknown:
            raise ValueError(f"unknown policies {unknown}; known: {', '.join(POLICY_NAMES)}")
        if not self.slowdowns or len({len(s) for s in self.slowdowns}) != 1:
            raise ValueError("slowdowns: give one or more factor lists, all of the same length (one per rank)")
        if self.global_batch < self.devices:
            raise ValueError(f"global_batch {self.global_batch} is below the {self.devices} devices")
        if not self.time_scale >= 1.0:
            raise ValueError(f"time_scale must be >= 1 (got {self.time_scale})")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1 (got {self.repeats})")
        if self.steps < 1 or self.warmup_steps < 0:
            raise ValueError("steps >= 1 and warmup_steps >= 0 are required")

    @property
    def devices(self) -> int:
        return len(self.slowdowns[0])

    @property
    def until_step(self) -> int:
        return self.warmup_steps + self.steps

    @property
    def backlog(self) -> int:
        """Samples pre-produced per device: enough for the hungriest device of any policy, with margin."""
        return math.ceil(_MAX_SHARE * self.global_batch * (self.until_step + _OVERSHOOT_STEPS))

    def cells(self) -> list[BalanceCell]:
        """The matrix, slow-downs outermost, then DIF, then policy (so one DIF's policies run back to back)."""
        return [BalanceCell(p, s, d) for s in self.slowdowns for d in self.difs for p in self.policies]


# ---------------------------------------------------------------------------------------------
# Analysis


def analyse_cell(feedback: Sequence[StepFeedback], devices: int, warmup: int, steps: int,
                 smooth: int) -> dict[str, Any]:
    """The figures of one cell from its feedback records (see the module docstring).

    Returns:
        A dict of the cell's figures plus `loss_curve` ([seconds since step 0 began, trailing-mean loss]
        per step, up to the end of the window), from which the time to a target loss is read.
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
    curve: list[list[float]] = []
    recent: list[float] = []
    for s, loss in losses:
        if loss is None or not math.isfinite(loss):
            continue
        recent = [*recent[-(smooth - 1):], loss] if smooth > 1 else [loss]
        if len(recent) == smooth:
            curve.append([round(end_s[s], 4), float(np.mean(recent))])
    return {
        "steps_measured": len(window),
        "step_seconds_median": median(step_s),
        "wall_step_seconds_median": median(wall),
        "straggler_effect_median": median(se),
        "samples_per_s": trained_in_span / span if span else None,
        "size_per_s": size_in_span / span if span else None,
        "global_batch_median": median(samples),
        "step_size_median": median(sizes),
        "trained_size_mean": sum(sizes) / sum(samples) if sum(samples) else None,
        "rank_compute_seconds_median": {d: median(v) for d, v in sorted(per_rank.items())},
        "rank_samples_median": {d: median(v) for d, v in sorted(per_rank_samples.items())},
        "local_plan_rank_steps": sum(1 for s in window for fb in full[s] if fb.plan_step < 0),
        "final_loss": curve[-1][1] if curve else None,
        "loss_curve": curve,
    }


def seconds_to(curve: Sequence[Sequence[float]], target: float) -> float | None:
    """Seconds at which the trailing-mean loss first reaches `target` (None when it never does)."""
    for t, loss in curve:
        if loss <= target:
            return float(t)
    return None


def loss_targets(cells: Sequence[dict[str, Any]], setup: BalanceSetup) -> tuple[dict[float, float], str]:
    """The target loss of each DIF: what static reaches by the middle of its measured window on that DIF's data
    (first slow-downs set). Each DIF is its own data set (sizes, hence losses, differ), so each has its own target.

    Halfway rather than at the end, so that a policy with the same loss per step but noise of its own
    still reaches it within the window; the rule is written into the JSON next to the values.
    """
    rule = (f"per DIF: the trailing mean of {setup.smooth_steps} steps' loss that static reaches at step "
            f"{setup.warmup_steps + setup.steps // 2} (mid-window) at slow-downs "
            f"{','.join(f'{f:g}' for f in setup.slowdowns[0])} on that DIF's data")
    index = setup.warmup_steps + setup.steps // 2 - setup.smooth_steps + 1
    targets: dict[float, float] = {}
    for c in cells:
        if c["policy"] == "static" and tuple(c["slowdowns"]) == setup.slowdowns[0] and c.get("loss_curve"):
            curve = c["loss_curve"]
            targets[float(c["dif"])] = float(curve[max(0, min(len(curve) - 1, index))][1])
    return targets, rule


def finish_figures(cells: list[dict[str, Any]], setup: BalanceSetup) -> dict[str, Any]:
    """The figures that compare cells: each cell's balance of per-rank medians, its time to its DIF's target
    loss, and the issue's targets. A pure function of the cells (re-applied to a stored balance.json as is)."""
    for c in cells:
        medians = [v for v in (c.get("rank_compute_seconds_median") or {}).values() if v]
        c["straggler_effect_of_medians"] = straggler_effect(medians) if len(medians) > 1 else None
    targets, rule = loss_targets(cells, setup)
    for c in cells:
        if "runs" in c:  # combined over repeats: each run was measured against its own repeat's target
            continue
        target = targets.get(float(c["dif"]))
        c["target_loss"] = target
        c["seconds_to_target_loss"] = seconds_to(c.get("loss_curve") or [], target) if target is not None else None
    return {"target_loss": {f"{d:g}": t for d, t in sorted(targets.items())}, "target_loss_rule": rule,
            "targets": evaluate_targets(cells, setup)}


def summarise(results: list[dict[str, Any]], setup: BalanceSetup) -> dict[str, Any]:
    """`finish_figures` for one run of the matrix; for repeats, each run against its own targets (static's loss
    in that run), then the cells combined (`cells` in the answer) with the median of the runs' target losses."""
    if setup.repeats <= 1:
        return finish_figures(results, setup)
    losses: dict[str, list[float]] = defaultdict(list)
    rule = ""
    for rep in sorted({r["repeat"] for r in results}):
        figures = finish_figures([r for r in results if r["repeat"] == rep], setup)
        rule = figures["target_loss_rule"]
        for dif, value in figures["target_loss"].items():
            losses[dif].append(value)
    cells = combine_repeats(results)
    figures = finish_figures(cells, setup)
    return {**figures, "cells": cells, "target_loss": {d: median(v) for d, v in losses.items()},
            "target_loss_rule": f"{rule}; in each run its own, the median over runs shown"}


#: Per-run figures a cell reports as the median over its repeats.
_MEDIAN_KEYS = ("step_seconds_median", "wall_step_seconds_median", "straggler_effect_median", "samples_per_s",
                "size_per_s", "global_batch_median", "step_size_median", "trained_size_mean", "final_loss",
                "plan_latency_ms_median", "plan_wait_seconds_median", "straggler_effect_of_medians", "target_loss")


def combine_repeats(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One figure set per cell from its repeated runs: the median of each per-run figure, the per-run values of
    the main ones under `runs`, samples lost summed. Time to the target loss is the median with a run that never
    reached it counted as the slowest (None when most runs did not)."""
    groups: dict[tuple[str, tuple[float, ...], float], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        groups[(r["policy"], tuple(r["slowdowns"]), float(r["dif"]))].append(r)
    out = []
    for (policy, slowdowns, dif), rs in groups.items():
        ok = [r for r in rs if not r.get("error")]
        cell: dict[str, Any] = {"policy": policy, "slowdowns": list(slowdowns), "dif": dif,
                                "size_kind": rs[0].get("size_kind"), "repeats": len(rs)}
        if not ok:
            cell["error"] = "; ".join(r["error"] for r in rs if r.get("error"))
            out.append(cell)
            continue
        for key in _MEDIAN_KEYS:
            values = [r[key] for r in ok if r.get(key) is not None]
            cell[key] = median(values)
        ranks = sorted({d for r in ok for d in (r.get("rank_compute_seconds_median") or {})})
        for key in ("rank_compute_seconds_median", "rank_samples_median"):
            cell[key] = {d: median([r[key][d] for r in ok if d in (r.get(key) or {})]) for d in ranks}
        # A run that never reached the target counts as the slowest: None when most runs did not.
        mid = median([math.inf if r.get("seconds_to_target_loss") is None else r["seconds_to_target_loss"]
                      for r in ok])
        cell["seconds_to_target_loss"] = mid if mid is not None and math.isfinite(mid) else None
        cell["samples_lost"] = sum(int(r.get("samples_lost") or 0) for r in ok)
        cell["steps_measured"] = min(int(r.get("steps_measured") or 0) for r in ok)
        cell["local_plan_rank_steps"] = sum(int(r.get("local_plan_rank_steps") or 0) for r in ok)
        cell["runs"] = [{k: r.get(k) for k in ("repeat", "step_seconds_median", "straggler_effect_median",
                                               "size_per_s", "seconds_to_target_loss", "run_dir", "error")}
                        for r in rs]
        if len(ok) < len(rs):
            cell["failed_runs"] = len(rs) - len(ok)
        out.append(cell)
    return out


# ---------------------------------------------------------------------------------------------
# Running


def _settings(setup: BalanceSetup, cell: BalanceCell) -> dict[str, object]:
    """The settings a cell runs with, besides its broker, topic prefix and job (and the command's own --set)."""
    sets: dict[str, object] = {
        "coordinator.global_batch": setup.global_batch,
        "coordinator.seed": setup.seed,
        # The fit forgets the warm-up: its first steps (warm-start plans, DDP start-up) are slow, large batches
        # whose leverage would bias the models for most of the window with the default 64 records.
        "coordinator.model_window": setup.model_window,
        "trainer.slowdowns": ",".join(f"{setup.time_scale * f:g}" for f in cell.slowdowns),
        "trainer.slowdown_clock": "cpu",
        "trainer.seed": setup.seed,
        "trainer.base_batch": setup.global_batch,  # lr is trainer.lr at the benchmark's global batch
        "trainer.checkpoint_every": 100_000,  # no checkpoint pauses inside the window (one when it stops)
        "trainer.log_every": 50,
        "trainer.device": "cpu",
        "trainer.backend": "gloo",
        "producer.synthetic.task_seed": setup.seed,
    }
    if cell.policy == "scadles":
        sets["coordinator.b_min"] = setup.global_batch // setup.devices  # equal streams, equal rates
    return sets


def _sets(setup: BalanceSetup, cell: BalanceCell, bootstrap: str, prefix: str, job: str) -> list[str]:
    sets = {"job": job, "kafka.bootstrap_servers": bootstrap, "kafka.topic_prefix": prefix, **_settings(setup, cell)}
    out = []
    for key, value in sets.items():
        out += ["--set", f"{key}={value}"]
    for extra in setup.extra_sets:
        out += ["--set", extra]
    return out


def _config(args: Sequence[str], config_file: str | None) -> StreamtrainConfig:
    sets = [args[i + 1] for i in range(0, len(args), 2) if args[i] == "--set"]
    return load_config(config_file, overrides=dict(parse_assignment(s) for s in sets))


def _delete_topics(cfg: StreamtrainConfig) -> None:
    from streamtrain.kafka import make_admin

    admin = make_admin(cfg.kafka)
    names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(cfg.kafka.topic_prefix + ".")]
    if names:
        for fut in admin.delete_topics(names, operation_timeout=30).values():
            try:
                fut.result(timeout=30)
            except Exception as exc:  # disk space only: never fail a benchmark over it
                logger.warning("could not delete a topic of %s: %s", cfg.kafka.topic_prefix, exc)


def run_cell(setup: BalanceSetup, cell: BalanceCell, index: int, bootstrap: str, runs: Path,
             base_args: Sequence[str], config_file: str | None,
             on_step: Callable[[int, str], None] | None = None) -> dict[str, Any]:
    """Run one cell on the broker at `bootstrap`; returns its figures (`error` set when it failed)."""
    from stack.runner import LocalStack, StackError, StackOptions
    from stack.services import DeviceStream, size_kind_for

    run_id = uuid.uuid4().hex[:6]
    prefix = f"bal{run_id}c{index}"
    args = [*base_args, *_sets(setup, cell, bootstrap, prefix, f"balance-{run_id}-{index}")]
    cfg = _config(args, config_file)
    kind = size_kind_for(setup.size_mean, cell.dif)
    streams = [DeviceStream(str(i), 1.0, setup.size_mean, cell.dif, kind) for i in range(setup.devices)]
    slow = "x".join(f"{f:g}" for f in cell.slowdowns)
    cell_dir = runs / f"{index:02d}-{cell.policy}-dif{cell.dif:g}-{slow}"
    opts = StackOptions(streams=streams, out=cell_dir.resolve(), policy=cell.policy, broker="external",
                        prometheus=False, drain_timeout_s=0.0, start_timeout_s=setup.start_timeout_s,
                        torch_threads=1, seed=setup.seed, global_args=args, backlog=setup.backlog,
                        until_step=setup.until_step)

    def update(snap: Any) -> None:
        if on_step is not None:
            on_step(snap.step or 0, snap.phase)

    stack = LocalStack(cfg, opts, on_update=update, say=lambda line: logger.info("%s", line))
    began = time.monotonic()
    result: dict[str, Any] = {"policy": cell.policy, "slowdowns": list(cell.slowdowns), "dif": cell.dif,
                              "size_kind": kind}
    try:
        report = stack.run()
    except StackError as exc:
        result["error"] = str(exc)
        return result
    finally:
        shutil.rmtree(cell_dir / "checkpoints", ignore_errors=True)  # the model is not what this measures
        try:
            _delete_topics(stack.cfg.model_copy(update={"kafka": stack.kafka}))
        except Exception as exc:  # see _delete_topics
            logger.warning("topic clean-up of %s failed: %s", prefix, exc)
    result["seconds"] = round(time.monotonic() - began, 1)
    if stack.failures or stack.records is None:
        result["error"] = "; ".join(stack.failures) or "no records read back"
        if stack.records is None:
            return result
    try:
        figures = analyse_cell(stack.records.feedback, setup.devices, setup.warmup_steps, setup.steps,
                               setup.smooth_steps)
    except ValueError as exc:
        result["error"] = f"{result.get('error', '')} analysis: {exc}".strip()
        return result
    sizes = [r.size for recs in stack.records.records.values() for r in recs if r.size is not None]
    pending = int(report.get("samples_pending") or 0)
    result.update(figures)
    result.update({
        "steps": report.get("steps"),
        "samples_trained": report.get("samples_trained"),
        "samples_pending": pending,
        "samples_unaccounted": report.get("samples_unaccounted"),
        # Pending backlog is left over by design; anything else unaccounted would be a lost sample.
        "samples_lost": int(report.get("samples_unaccounted") or 0) - pending,
        "size_mean_measured": float(np.mean(sizes)) if sizes else None,
        "size_dif_measured": float(np.std(sizes)) if sizes else None,
        "plan_latency_ms_median": report.get("plan_latency_ms_median"),
        "plan_wait_seconds_median": report.get("plan_wait_seconds_median"),
        "step_period_split_median": report.get("step_period_split_median"),
        "backlog_seconds": stack.backlog_seconds,
        "run_dir": str(cell_dir),
    })
    return result


def run_balance(setup: BalanceSetup, out: Path, base_args: Sequence[str] = (), config_file: str | None = None,
                progress: CellProgress | None = None, bootstrap: str | None = None,
                cells: Sequence[BalanceCell] | None = None,
                on_cell: Callable[[dict[str, Any]], None] | None = None, runs: Path | None = None) -> dict[str, Any]:
    """Run every cell (one embedded broker for all, unless `bootstrap` names one) and write DIR/balance.json.

    Args:
        cells: the cells to run (default `setup.cells()`).
        on_cell: called with each cell's result as soon as it is known.
        runs: where each cell's run directory (report, series, plots, logs) goes; default DIR/balance-runs.
    """
    import tempfile

    from streamtrain.broker import EmbeddedBroker

    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    cells = list(cells) if cells is not None else setup.cells()
    results: list[dict[str, Any]] = []
    broker: EmbeddedBroker | None = None
    scratch = tempfile.TemporaryDirectory(prefix="st-balance-")
    try:
        if bootstrap is None:
            base_cfg = load_config(config_file, overrides=dict(
                parse_assignment(base_args[i + 1]) for i in range(0, len(base_args), 2) if base_args[i] == "--set"))
            broker = EmbeddedBroker(base_cfg.broker.model_copy(update={
                "data_dir": Path(scratch.name) / "kafka", "port": 0, "controller_port": 0}))
            if progress is not None:
                progress(0, len(cells), cells[0], 0, setup.until_step, "starting the Kafka broker")
            bootstrap = broker.start()
        schedule = [(rep, cell) for rep in range(setup.repeats) for cell in cells]
        for i, (rep, cell) in enumerate(schedule):
            def on_step(step: int, phase: str, i: int = i, cell: BalanceCell = cell) -> None:
                if progress is not None:
                    progress(i, len(schedule), cell, step, setup.until_step, phase)

            results.append({**run_cell(setup, cell, i, bootstrap, runs or out / "balance-runs", base_args,
                                       config_file, on_step), "repeat": rep})
            if on_cell is not None:
                on_cell(results[-1])
            if progress is not None:
                progress(i + 1, len(schedule), cell, setup.until_step, setup.until_step, "done")
    finally:
        if broker is not None:
            broker.stop()
        scratch.cleanup()
    figures = summarise(results, setup)
    if setup.repeats > 1:
        per_run, results = results, figures.pop("cells")
    else:
        per_run = []
    doc = {
        "setup": {**{k: v for k, v in asdict(setup).items() if k != "notes"}, "devices": setup.devices,
                  "backlog_per_device": setup.backlog, **setup.notes,
                  "settings": {**_settings(setup, cells[0]), "trainer.slowdowns": "per cell",
                               **dict(parse_assignment(base_args[i + 1]) for i in range(0, len(base_args), 2)
                                      if base_args[i] == "--set")}},
        "target_loss": figures["target_loss"],
        "target_loss_rule": figures["target_loss_rule"],
        "seconds": round(time.monotonic() - began, 1),
        "cells": results,
        "targets": figures["targets"],
        **({"runs": [{k: v for k, v in r.items() if k != "loss_curve"} for r in per_run]} if per_run else {}),
    }
    (out / "balance.json").write_text(json.dumps(doc, indent=1, default=float) + "\n")
    try:
        plot_balance(doc, out / "balance.png")
    except (ValueError, RuntimeError) as exc:
        logger.warning("balance plot failed: %s", exc)
    return doc


def evaluate_targets(cells: Sequence[dict[str, Any]], setup: BalanceSetup) -> dict[str, Any]:
    """The issue's targets at slow-downs (1,1,1,4) and the largest DIF, and ett-stream vs the best per cell.

    "Faster per step" compares median step times (static and ett-stream both train their oldest samples, so a
    step holds about the same work); the per-step work is reported next to it (`work_ratio`). "Best" in a
    cell is the highest work rate (sample size trained per second): policies that pick which samples to
    train (chronica takes small ones first) do different work per step, so step time alone would reward
    training less.
    """
    def find(policy: str, slowdowns: tuple[float, ...], dif: float) -> dict[str, Any] | None:
        return next((c for c in cells if c["policy"] == policy and tuple(c["slowdowns"]) == slowdowns
                     and c["dif"] == dif and c.get("step_seconds_median")), None)

    hetero = next((s for s in setup.slowdowns if len(set(s)) > 1), setup.slowdowns[0])
    top = max(setup.difs)
    ett, static = find("ett-stream", hetero, top), find("static", hetero, top)
    speedup = (static["step_seconds_median"] / ett["step_seconds_median"]) if ett and static else None
    work = (ett["step_size_median"] / static["step_size_median"]
            if ett and static and ett.get("step_size_median") and static.get("step_size_median") else None)
    se = ett["straggler_effect_median"] if ett else None
    se_medians = ett.get("straggler_effect_of_medians") if ett else None
    per_cell = []
    for slow in setup.slowdowns:
        for dif in setup.difs:
            group = [c for c in cells if tuple(c["slowdowns"]) == slow and c["dif"] == dif and c.get("size_per_s")]
            mine = next((c for c in group if c["policy"] == "ett-stream"), None)
            if not group or mine is None:
                continue
            best = max(group, key=lambda c: c["size_per_s"])
            ratio = best["size_per_s"] / mine["size_per_s"]
            per_cell.append({"slowdowns": list(slow), "dif": dif, "best_policy": best["policy"],
                             "best_size_per_s": best["size_per_s"], "ett_stream_size_per_s": mine["size_per_s"],
                             "best_over_ett_stream": ratio, "within_5_percent": ratio <= 1.05})
    return {
        "slowdowns": list(hetero), "dif": top,
        "speedup_vs_static": speedup, "speedup_met": None if speedup is None else speedup >= 2.5,
        "work_ratio": work,
        "straggler_effect_median": se, "straggler_effect_met": None if se is None else se <= 0.10,
        "straggler_effect_of_medians": se_medians,
        "per_cell": per_cell,
        "best_or_within_5_percent_met": all(c["within_5_percent"] for c in per_cell) if per_cell else None,
    }


# ---------------------------------------------------------------------------------------------
# Plot


def plot_balance(doc: dict[str, Any], path: Path) -> Path:
    """Step time and straggler effect (log scale) per policy vs DIF, one column per heterogeneous slow-down set;
    a control row (every factor equal) is drawn as the machine's noise floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [c for c in doc["cells"] if c.get("step_seconds_median") is not None]
    if not cells:
        raise ValueError("no measured cells to plot")
    controls = [c for c in cells if len(set(c["slowdowns"])) == 1]
    slows = sorted({tuple(c["slowdowns"]) for c in cells if c not in controls}, key=lambda s: -max(s)) or \
        sorted({tuple(c["slowdowns"]) for c in cells})
    policies = [p for p in POLICY_NAMES if any(c["policy"] == p for c in cells)]
    fig, axes = plt.subplots(2, len(slows), figsize=(6.0 * len(slows), 6.4), squeeze=False)
    for col, slow in enumerate(slows):
        for policy in policies:
            pts = sorted((c["dif"], c["step_seconds_median"] * 1e3, c["straggler_effect_median"]) for c in cells
                         if c["policy"] == policy and tuple(c["slowdowns"]) == slow)
            style = {"linewidth": 2.5, "color": "black"} if policy == "ett-stream" else {"alpha": 0.8}
            axes[0][col].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=policy, **style)
            axes[1][col].plot([p[0] for p in pts], [p[2] for p in pts], marker="o", **style)
        name = ",".join(f"{f:g}" for f in slow)
        axes[0][col].set(title=f"slow-downs {name}", ylabel="step time, median (ms)", ylim=(0, None))
        axes[1][col].axhline(0.10, color="green", linestyle=":", linewidth=1, label="SE 0.10 target")
        for control in controls if slow not in {tuple(c["slowdowns"]) for c in controls} else ():
            axes[1][col].axhline(control["straggler_effect_median"], color="grey", linestyle="--", linewidth=1,
                                 label=f"noise floor ({control['policy']}, equal ranks, DIF {control['dif']:g})")
        axes[1][col].set(xlabel="DIF (std of sample sizes)", ylabel="straggler effect, median (log)", yscale="log")
        difs = sorted({c["dif"] for c in cells if tuple(c["slowdowns"]) == slow})
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xticks(difs)
            if len(difs) == 1:
                ax.set_xlim(difs[0] - 10, difs[0] + 10)
        axes[1][col].legend(fontsize=7, loc="center right")
    axes[0][0].legend(fontsize=7, loc="center right")
    setup = doc.get("setup", {})
    fig.suptitle(f"{setup.get('devices', 4)} gloo ranks, global batch {setup.get('global_batch')}, "
                 f"{setup.get('steps')} measured steps after {setup.get('warmup_steps')} warm-up", fontsize=9)
    return save_figure(fig, path)


# ---------------------------------------------------------------------------------------------
# Command


def _factor_lists(texts: Sequence[str], flag: str) -> tuple[tuple[float, ...], ...]:
    out = []
    for text in texts:
        try:
            out.append(tuple(float(v) for v in text.replace(" ", "").split(",") if v))
        except ValueError:
            raise ValueError(f"{flag} {text!r}: expected comma-separated factors, e.g. 1,1,1,4") from None
    return tuple(out)


def balance_command(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="Directory for balance.json and balance.png.", metavar="DIR")
                   ] = Path("reports/bench"),
    runs: Annotated[Path, typer.Option("--runs", help="Directory of each cell's run (report.json, series.json, "
                                       "plots, logs); kept out of --out, which may be committed.", metavar="DIR")
                    ] = Path("reports/balance-runs"),
    quick: Annotated[bool, typer.Option(help="static, lbbsp and ett-stream at DIF 0 and 64 with fewer steps "
                                        "(about 4 minutes).")] = False,
    policy: Annotated[list[str] | None, typer.Option("--policy", help="Policy to run (repeatable; default all "
                                                     "six).")] = None,
    slowdowns: Annotated[list[str] | None, typer.Option("--slowdowns", help="Per-rank slow-down factors, one "
                                                        "list per set (repeatable; default 1,1,1,4).")] = None,
    control: Annotated[bool, typer.Option(help="Also run static at slow-downs 1,1,1,1, DIF 0: identical batches on "
                                          "identical ranks, whose straggler effect is the machine's noise floor (a "
                                          "control "
                                          "with no heterogeneity).")] = False,
    dif: Annotated[str | None, typer.Option(help="DIF values (std of sample sizes), comma-separated (default "
                                            "0,16,64).")] = None,
    global_batch: Annotated[int, typer.Option(min=4, help="coordinator.global_batch: samples per step over "
                                              "all ranks.")] = BalanceSetup.global_batch,
    steps: Annotated[int | None, typer.Option(min=2, help="Measured steps per cell (default 24; 12 with "
                                              "--quick).")] = None,
    warmup: Annotated[int | None, typer.Option(min=0, help="Warm-up steps left out of the figures (default 10; "
                                               "8 with --quick).")] = None,
    model_window: Annotated[int, typer.Option(min=4, help="coordinator.model_window: feedback records each "
                                              "device's time model is fitted on.")] = BalanceSetup.model_window,
    time_scale: Annotated[float, typer.Option(min=1.0, help="Every rank computes this many times its CPU time "
                                              "(slow-downs multiply on top), so 4 ranks fit on 2 cores without "
                                              "contending.")] = BalanceSetup.time_scale,
    repeats: Annotated[int, typer.Option(min=1, help="Run the whole matrix this many times; each cell reports the "
                                         "median over its runs (and the runs themselves).")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the data (every cell of a DIF trains the same samples) and "
                                      "the model.")] = 0,
    external: Annotated[bool, typer.Option(help="Use the Kafka at kafka.bootstrap_servers instead of one "
                                           "embedded broker for the whole benchmark.")] = False,
) -> None:
    """Every planning policy on the live stack: 4 gloo ranks, emulated slow-downs, DIF 0/16/64.

    Each cell runs the coordinator with one policy and `streamtrain train --local-ranks 4` on the real
    broker. Rank r sleeps (factor_r - 1) x its measured compute after every step (trainer.slowdowns), so
    1,1,1,4 is three devices and one four times slower. Sample sizes are normal with mean 45 and
    std = DIF (lognormal where a normal that never goes below 1 cannot have that std). Before the services
    start, each device topic gets the same pre-produced backlog (same seed for every cell), so step time
    reflects the plan, not the arrival rate; every policy plans the same global batch per step.

    Per cell: median step time (slowest rank, emulated sleep included), median straggler effect (LBB
    Eq. 4 on compute seconds), samples/s and seconds to a target loss (what static reaches mid-window
    at DIF 0), over a fixed window after the warm-up. Writes DIR/balance.json ({"cells": [...]}, the
    targets) and DIR/balance.png; each cell's report, series, plots and logs go to --runs.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from streamtrain.cli_support import EXIT_CONFIG, config_from, console, die

    from .cli import _root_options

    cfg = config_from(ctx)
    root = _root_options(ctx)
    config_file = root[root.index("--config") + 1] if "--config" in root else None
    base_args = [a for i, a in enumerate(root) if not (a == "--config" or (i and root[i - 1] == "--config"))]
    try:
        slows = _factor_lists(slowdowns or ["1,1,1,4"], "--slowdowns")
        if control and (1.0, 1.0, 1.0, 1.0) not in slows:
            slows = (*slows, (1.0,) * len(slows[0]))
        difs = tuple(float(v) for v in dif.split(",")) if dif else ((0.0, 64.0) if quick else (0.0, 16.0, 64.0))
        chosen = tuple(policy or (("static", "lbbsp", "ett-stream") if quick else POLICY_NAMES))
        setup = BalanceSetup(policies=chosen, slowdowns=slows, difs=difs, global_batch=global_batch,
                             time_scale=time_scale, model_window=model_window, repeats=repeats,
                             steps=steps or (12 if quick else 24),
                             warmup_steps=warmup if warmup is not None else (8 if quick else 10), seed=seed,
                             notes={"quick": quick})
    except ValueError as exc:
        die(str(exc), EXIT_CONFIG)
    cells = setup.cells()
    if control:
        # The control: identical ranks, identical batches (static at the smallest DIF).
        cells = [c for c in cells if len(set(c.slowdowns)) > 1 or (c.dif == min(setup.difs) and c.policy == "static")]
    console.print(f"{len(cells)} cells{f' x {repeats} runs' if repeats > 1 else ''}: {', '.join(setup.policies)} "
                  f"x slow-downs "
                  f"{' / '.join(','.join(f'{f:g}' for f in s) for s in setup.slowdowns)} x DIF "
                  f"{', '.join(f'{d:g}' for d in setup.difs)}; global batch {setup.global_batch}, "
                  f"{setup.warmup_steps} + {setup.steps} steps, backlog {setup.backlog:,} samples per device",
                  highlight=False)
    columns = (TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[phase]}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        overall = bar.add_task("cells", total=len(cells) * repeats, phase="")
        current = bar.add_task("", total=setup.until_step, phase="")

        def progress(i: int, n: int, cell: BalanceCell, step: int, until: int, phase: str) -> None:
            bar.update(overall, completed=i)
            bar.update(current, description=cell.label, completed=min(step, until), total=until,
                       phase=phase[:40])

        def done(result: dict[str, Any]) -> None:
            if result.get("error"):
                bar.console.print(f"[red]{result['policy']} DIF {result['dif']:g}: {result['error'][:300]}")
                return
            bar.console.print(
                f"{result['policy']:<11} slow-downs {','.join(f'{f:g}' for f in result['slowdowns'])} "
                f"DIF {result['dif']:>3g}: step {result['step_seconds_median'] * 1e3:7.1f} ms, SE "
                f"{result['straggler_effect_median']:.3f}, {result['samples_per_s']:7.1f} samples/s "
                f"({result['seconds']:.0f} s)", highlight=False)

        doc = run_balance(setup, out, base_args, config_file, progress,
                          bootstrap=cfg.kafka.bootstrap_servers if external else None, cells=cells, on_cell=done,
                          runs=runs)
    _summary(doc, out, console)
    if any(c.get("error") for c in doc["cells"]):
        raise typer.Exit(1)


def _summary(doc: dict[str, Any], out: Path, console: Any) -> None:
    from rich.table import Table

    table = Table(title=f"bench balance — {out / 'balance.json'}")
    for col in ("policy", "slow-downs", "DIF", "step ms", "wall ms", "SE", "samples/s", "work/s", "size",
                "s to target", "lost"):
        table.add_column(col, justify="right")

    def f(value: Any, spec: str, scale: float = 1.0) -> str:
        return "-" if value is None else format(value * scale, spec)

    for c in doc["cells"]:
        table.add_row(c["policy"], ",".join(f"{x:g}" for x in c["slowdowns"]), f"{c['dif']:g}",
                      f(c.get("step_seconds_median"), ".1f", 1e3), f(c.get("wall_step_seconds_median"), ".1f", 1e3),
                      f(c.get("straggler_effect_median"), ".3f"), f(c.get("samples_per_s"), ".1f"),
                      f(c.get("size_per_s"), ".0f"), f(c.get("trained_size_mean"), ".1f"),
                      f(c.get("seconds_to_target_loss"), ".1f"), str(c.get("samples_lost", "-")))
    console.print(table)
    t = doc["targets"]
    losses = ", ".join(f"DIF {d}: {v:.4f}" for d, v in doc["target_loss"].items())
    console.print(f"target loss {losses} ({doc['target_loss_rule']})", highlight=False)
    console.print(f"at slow-downs {','.join(f'{x:g}' for x in t['slowdowns'])}, DIF {t['dif']:g}: ett-stream "
                  f"{f(t['speedup_vs_static'], '.2f')}x faster per step than static (target >= 2.5: "
                  f"{t['speedup_met']}), median SE {f(t['straggler_effect_median'], '.3f')} (target <= 0.10: "
                  f"{t['straggler_effect_met']}); best work rate or within 5% of it in every cell: "
                  f"{t['best_or_within_5_percent_met']}", highlight=False)
    console.print(f"wrote {out / 'balance.json'} and {out / 'balance.png'} in {doc['seconds']:.0f} s", highlight=False)


# ---------------------------------------------------------------------------------------------
# BENCHMARKS.md section


def render_balance(doc: dict[str, Any], ctx: Any) -> str:
    """The `balance` section of BENCHMARKS.md: targets, the full table and the plot (see `benchmarks.registry`)."""
    from .registry import _X, _table, _verdict

    png = plot_balance(doc, ctx.plot_path("balance.png"))
    setup, t = doc["setup"], doc["targets"]
    slow = ",".join(f"{f:g}" for f in t["slowdowns"])

    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value * 1e3:.1f} ms"

    cells: list[dict[str, Any]] = doc["cells"]
    repeated = int(setup.get("repeats", 1)) > 1
    ett: dict[str, Any] = next((c for c in cells if c["policy"] == "ett-stream" and c["slowdowns"] == t["slowdowns"]
                and c["dif"] == t["dif"]), {})
    static: dict[str, Any] = next((c for c in cells if c["policy"] == "static" and c["slowdowns"] == t["slowdowns"]
                   and c["dif"] == t["dif"]), {})
    missed = [f"slow-downs {','.join(f'{f:g}' for f in p['slowdowns'])} DIF {p['dif']:g}: best {p['best_policy']} "
              f"{p['best_over_ett_stream']:.2f}{_X} ett-stream's work rate" for p in t["per_cell"]
              if not p["within_5_percent"]]
    speed = t["speedup_vs_static"]
    control = next((c for c in cells if len(set(c["slowdowns"])) == 1 and c.get("straggler_effect_median")
                    is not None and c["policy"] == "static"), None)
    floor = control["straggler_effect_median"] if control else None
    targets = _table(["target (slow-downs " + slow + f", DIF {t['dif']:g})", "measured", "paper", "verdict"], [
        [f"`ett-stream` ≥ 2.5{_X} faster per step than `static`",
         "—" if speed is None else f"{ms(static.get('step_seconds_median'))} → {ms(ett.get('step_seconds_median'))}"
         f" = {speed:.2f}{_X}" + ("" if t.get("work_ratio") is None else
                                 f" (ett-stream's step holds {t['work_ratio']:.2f}{_X} static's work)"),
         f"LBB Table 2: 392.9 → 104.9 ms (3.75{_X}); CHRONICA Table IV: 578 → 247 s (2.34{_X})",
         _verdict(t["speedup_met"])],
        ["median straggler effect ≤ 0.10 (per step: (max - min) / mean of the ranks' compute)",
         "—" if t["straggler_effect_median"] is None else f"{t['straggler_effect_median']:.3f}"
         + (f" (noise floor: {floor:.3f}, the control's identical ranks on identical batches)" if floor is not None
            else ""),
         "LBB Table 2 reports averages, not per-step SE", _verdict(t["straggler_effect_met"])],
        ["(for the paper's figure) SE of the ranks' median compute over the window",
         "—" if t.get("straggler_effect_of_medians") is None else f"{t['straggler_effect_of_medians']:.3f}",
         "LBB Table 2: per-worker compute 103.5-104.9 ms after balancing, SE ≈ 0.013", "—"],
        ["`ett-stream` best or within 5% of the best policy (work rate: sample size trained per second) in every "
         "cell",
         "every cell" if not missed else "missed in " + "; ".join(missed), "—",
         _verdict(t["best_or_within_5_percent_met"])],
    ])

    def cell(value: Any, spec: str, scale: float = 1.0) -> str:
        return "—" if value is None else format(value * scale, spec)

    rows = [[c["policy"], ",".join(f"{f:g}" for f in c["slowdowns"]), f"{c['dif']:g}",
             cell(c.get("step_seconds_median"), ".1f", 1e3), cell(c.get("wall_step_seconds_median"), ".1f", 1e3),
             cell(c.get("straggler_effect_median"), ".3f"), cell(c.get("samples_per_s"), ".0f"),
             cell(c.get("size_per_s"), ".0f"), cell(c.get("trained_size_mean"), ".1f"),
             cell(c.get("seconds_to_target_loss"), ".1f"),
             "error" if c.get("error") else str(c.get("samples_lost", "—"))]
            + ([" / ".join(cell(r.get("step_seconds_median"), ".0f", 1e3) for r in c.get("runs", []))]
               if repeated else []) for c in cells]
    return "\n\n".join([
        f"Setup: {setup['devices']} gloo ranks on the CPU, each computing {setup.get('time_scale', 1):g}{_X} its "
        f"training thread's CPU time {_X} its slow-down factor, global batch {setup['global_batch']}, "
        f"{setup['warmup_steps']} warm-up + {setup['steps']} measured steps per cell"
        + (f", the whole matrix run {setup['repeats']} times one after another (each figure: the median over "
           "a cell's runs)" if repeated else "") + ", sizes mean "
        f"{setup['size_mean']:g} with std = DIF (normal; lognormal where a normal ≥ 1 cannot reach the DIF), "
        f"a pre-produced backlog of {setup['backlog_per_device']:,} samples per device (same seed in every cell). "
        "Target loss " + ", ".join(f"DIF {d}: {v:.4f}" for d, v in doc["target_loss"].items())
        + f" ({doc['target_loss_rule']}). Run time "
        f"{doc['seconds'] / 60:.1f} min. Settings of every cell: "
        + ", ".join(f"`{k}={v}`" for k, v in setup.get("settings", {}).items())
        + " (scadles cells also `coordinator.b_min` = global batch / devices).",
        targets,
        _table(["policy", "slow-downs", "DIF", "step ms (median)", "wall step ms", "SE (median)", "samples/s",
                "work/s (size)", "mean size trained", "s to target loss", "lost samples",
                *(["step ms of each run"] if repeated else [])], rows),
        f"![balance]({ctx.link(png)})",
    ])
