"""The balance benchmark's runs: each cell one `live.run_stack_cell` on one shared broker, read back.

`run_balance` (the synthetic matrix) and `run_realdata` (a dataset replayed) differ in what a cell's streams and
settings are and in the figures read from it; the schedule, the broker and the progress are `run_schedule`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..common import LaunchOptions
from ..live import CellRun, StackCell, live_broker, run_stack_cell
from .accuracy import accuracy_curve, summarise_realdata, wall_period_median
from .analysis import analyse_cell, summarise
from .render import plot_balance, plot_realdata
from .results import BalanceResult, CellResult, RealdataResult, RunResult
from .setup import (
    BalanceCell,
    BalanceRunSetup,
    BalanceSetup,
    FleetSetup,
    RealdataCell,
    RealdataSetup,
    fleet_label,
    schedule,
)

__all__ = ["CellProgress", "dataset_settings", "run_balance", "run_realdata", "run_schedule"]

logger = logging.getLogger(__name__)

#: `(cell index, cells, cell label, step, until_step, phase)` — what a progress display receives.
CellProgress = Callable[[int, int, str, int, int, str], None]
T = TypeVar("T")


def run_schedule(setup: FleetSetup, plan: Sequence[tuple[int, Any]], stack_cell: Callable[[int, Any], StackCell],
                 read: Callable[[CellRun, Any, int, int], T], runs: Path, launch: LaunchOptions,
                 progress: CellProgress | None = None, bootstrap: str | None = None,
                 on_result: Callable[[T], None] | None = None) -> list[T]:
    """Run each (repeat, cell) of `plan` on one broker (embedded unless `bootstrap` names one), in order.

    Args:
        setup: the workload's setup (its stopping step).
        plan: (repeat, cell) in running order.
        stack_cell: (index, cell) → what the stack runs.
        read: (run, cell, repeat, index) → the cell's result.
        runs: where each run's directory (report, series, plots, logs) goes.
        launch: the root options the services are started with.
        progress: called as cells and steps go by.
        bootstrap: a broker to use instead of an embedded one.
        on_result: called with each result as soon as it is known.
    """
    until, results = setup.until_step, []

    def say(i: int, cell: Any, step: int, phase: str) -> None:
        if progress is not None:
            progress(i, len(plan), cell.label, step, until, phase)

    cfg = launch.config({"kafka.bootstrap_servers": bootstrap} if bootstrap else None)
    with live_broker(cfg, bootstrap is not None, "balance",
                     lambda: say(0, plan[0][1], 0, "starting the Kafka broker")) as broker:
        address = broker.kafka.bootstrap_servers
        for i, (rep, cell) in enumerate(plan):
            def on_step(step: int, phase: str, i: int = i, cell: Any = cell) -> None:
                say(i, cell, step, phase)

            ran = run_stack_cell(stack_cell(i, cell), address, runs, launch, on_step)
            results.append(read(ran, cell, rep, i))
            if on_result is not None:
                on_result(results[-1])
            say(i + 1, cell, until, "done")
    return results


def _plot(plot: Callable[[Any, Path], Path], result: Any, path: Path) -> None:
    try:
        plot(result, path)
    except (ValueError, RuntimeError) as exc:  # a plot must never lose the figures
        logger.warning("%s failed: %s", path.name, exc)


def balance_cell_result(ran: CellRun, setup: BalanceSetup, cell: BalanceCell, repeat: int) -> CellResult:
    """A synthetic cell's figures from what it left in Kafka; `error` set (with what could be measured) on failure."""
    from stack.services import size_kind_for

    identity: dict[str, Any] = {"policy": cell.policy, "slowdowns": cell.slowdowns, "dif": cell.dif, "repeat": repeat,
                                "size_kind": size_kind_for(setup.size_mean, cell.dif)}
    if ran.records is None or ran.report is None:
        return CellResult.model_validate({**identity, "error": ran.error})
    try:
        figures = analyse_cell(ran.records.feedback, setup.devices, setup.warmup_steps, setup.steps,
                               setup.smooth_steps)
    except ValueError as exc:
        return CellResult.model_validate({**identity, "error": f"{ran.error or ''} analysis: {exc}".strip()})
    report = ran.report
    sizes = np.concatenate([recs.sizes[recs.decoded] for recs in ran.records.records.values()] or [np.zeros(0)])
    return CellResult.model_validate({
        **identity, **dict(figures), "seconds": ran.seconds, "steps": report.steps,
        "samples_trained": report.samples_trained,
        "samples_pending": report.samples_pending,  # the backlog left over by design: not lost
        "samples_unaccounted": report.samples_unaccounted, "samples_lost": report.samples_unaccounted,
        "size_mean_measured": float(np.mean(sizes)) if len(sizes) else None,
        "size_dif_measured": float(np.std(sizes)) if len(sizes) else None,
        "plan_latency_ms_median": report.plan_latency_ms_median, "backlog_seconds": ran.backlog_seconds,
        "run_dir": str(ran.run_dir), "error": ran.error,
    })


def run_balance(setup: BalanceSetup, out: Path, launch: LaunchOptions = LaunchOptions(),
                progress: CellProgress | None = None, bootstrap: str | None = None,
                cells: Sequence[BalanceCell] | None = None, on_cell: Callable[[CellResult], None] | None = None,
                runs: Path | None = None) -> BalanceResult:
    """Run every synthetic cell `setup.repeats` times and write DIR/balance.json and DIR/balance.png.

    Args:
        setup: the experiment.
        out: where balance.json and balance.png go.
        launch: the root options the services are started with.
        progress: called as cells and steps go by.
        bootstrap: a broker to use instead of an embedded one.
        cells: the cells to run (default `setup.cells()`).
        on_cell: called with each cell's result as soon as it is known.
        runs: where each cell's run directory goes; default DIR/balance-runs.
    """
    from stack.services import DeviceStream, size_kind_for

    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    cells = list(cells) if cells is not None else setup.cells()

    def stack_cell(i: int, cell: BalanceCell) -> StackCell:
        kind = size_kind_for(setup.size_mean, cell.dif)
        streams = [DeviceStream(str(d), 1.0, setup.size_mean, cell.dif, kind) for d in range(setup.devices)]
        return StackCell(name=f"{i:02d}-{cell.policy}-dif{cell.dif:g}-{fleet_label(cell.slowdowns, 'x')}",
                         tag="balance", index=i, policy=cell.policy, streams=streams, settings=setup.settings_of(cell),
                         backlog=setup.backlog_per_device, until_step=setup.until_step, seed=setup.seed,
                         start_timeout_s=setup.start_timeout_s, extra_sets=setup.extra_sets)

    results = run_schedule(setup, [(rep, cell) for rep in range(setup.repeats) for cell in cells], stack_cell,
                           lambda ran, cell, rep, _i: balance_cell_result(ran, setup, cell, rep),
                           runs or out / "balance-runs", launch, progress, bootstrap, on_cell)
    figures = summarise(results, setup)
    settings = {**setup.settings_of(cells[0]), "trainer.slowdowns": "per cell", **launch.overrides()}
    result = BalanceResult(
        setup=BalanceRunSetup.model_validate({**setup.model_dump(), "settings": settings}),
        target_loss=figures.target_loss, target_loss_rule=figures.target_loss_rule,
        seconds=round(time.monotonic() - began, 1), cells=figures.cells, targets=figures.targets,
        runs=[r.model_copy(update={"loss_curve": None}) for r in figures.runs] if figures.runs else None)
    result.write(out / "balance.json")
    _plot(plot_balance, result, out / "balance.png")
    return result


def dataset_settings(setup: RealdataSetup, launch: LaunchOptions) -> dict[str, object]:
    """What replaying `setup.dataset` sets (producers' source, held-out set), checked against the model.

    Raises:
        ValueError: the dataset cannot be loaded (its package not installed) or does not fit the model.
    """
    from stack.replay import resolve_replay

    replay = resolve_replay(setup.dataset, launch.config(setup.settings_of(setup.cells()[0])))
    if replay.held_out is None:
        raise ValueError(f"dataset {setup.dataset}: no held-out split to measure accuracy on")
    return replay.settings


def run_result(ran: CellRun, setup: RealdataSetup, cell: RealdataCell, repeat: int, order: int) -> RunResult:
    """A dataset run's figures from what it left in Kafka (its window's step figures, its accuracy over time)."""
    identity: dict[str, Any] = {"policy": cell.policy, "slowdowns": cell.slowdowns, "control": cell.control,
                                "repeat": repeat, "order": order, "seconds": ran.seconds, "run_dir": str(ran.run_dir)}
    if ran.records is None or ran.report is None:
        return RunResult.model_validate({**identity, "error": ran.error})
    records = ran.records
    try:
        figures = analyse_cell(records.feedback, setup.devices, setup.warmup_steps, setup.steps, 1)
        curve = accuracy_curve(records.evaluations, records.feedback, setup.smooth_evals)
        period = wall_period_median(records.feedback, [p.step for p in curve], setup.warmup_steps, setup.until_step)
    except ValueError as exc:
        return RunResult.model_validate({**identity, "error": f"{ran.error or ''} analysis: {exc}".strip()})
    left = [len(records.records[d]) - sum(fb.samples for fb in records.feedback if fb.device_id == d)
            for d in records.devices if d in records.records]
    return RunResult.model_validate({
        **identity, **dict(figures), "loss_curve": None, "wall_period_seconds_median": period, "accuracy": curve,
        "final_accuracy": curve[-1].accuracy if curve else None, "samples_trained": ran.report.samples_trained,
        "samples_unaccounted": ran.report.samples_unaccounted, "backlog_left_min": min(left) if left else None,
        "error": ran.error or (None if curve else "no held-out evaluation read back"),
    })


def run_realdata(setup: RealdataSetup, out: Path, launch: LaunchOptions = LaunchOptions(),
                 progress: CellProgress | None = None, bootstrap: str | None = None,
                 on_run: Callable[[RunResult], None] | None = None, runs: Path | None = None) -> RealdataResult:
    """Run every dataset cell `setup.repeats` times in rotated order, and write DIR/realdata.json and .png.

    Args:
        setup: the experiment.
        out: where realdata.json and realdata.png go.
        launch: the root options the services are started with.
        progress: called as runs and steps go by.
        bootstrap: a broker to use instead of an embedded one.
        on_run: called with each run's result as soon as it is known.
        runs: where each run's directory goes; default DIR/realdata-runs.

    Raises:
        ValueError: the dataset cannot be replayed with the benchmark's model.
    """
    from stack.services import DeviceStream

    replay = dataset_settings(setup, launch)
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    plan = schedule(setup)
    # Replayed from a backlog: the rate and sizes of a stream do not apply (a sample's size is its length).
    streams = [DeviceStream(str(d), 1.0, 1.0, 0.0) for d in range(setup.devices)]

    def stack_cell(i: int, cell: RealdataCell) -> StackCell:
        return StackCell(name=f"{i:02d}-{cell.policy}-{fleet_label(cell.slowdowns, 'x')}", tag="realdata", index=i,
                         policy=cell.policy, streams=streams, settings={**setup.settings_of(cell), **replay},
                         backlog=setup.backlog_per_device, until_step=setup.until_step, seed=setup.seed, replay=True,
                         start_timeout_s=setup.start_timeout_s, extra_sets=setup.extra_sets)

    results = run_schedule(setup, plan, stack_cell, lambda ran, cell, rep, i: run_result(ran, setup, cell, rep, i),
                           runs or out / "realdata-runs", launch, progress, bootstrap, on_run)
    result = summarise_realdata(results, setup, {**setup.settings_of(plan[0][1]), **replay,
                                                 "trainer.slowdowns": "per cell", **launch.overrides()},
                                round(time.monotonic() - began, 1))
    result.write(out / "realdata.json")
    _plot(plot_realdata, result, out / "realdata.png")
    return result
