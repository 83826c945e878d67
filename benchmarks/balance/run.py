"""`bench balance`, the run: each cell one `stack_cell.run_stack_cell` on one shared broker, its figures read back."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..common import LaunchOptions
from ..stack_cell import StackCell, run_stack_cell, shared_broker
from .analysis import analyse_cell, summarise
from .render import plot_balance
from .results import BalanceResult, BalanceRunSetup, CellResult
from .setup import BalanceCell, BalanceSetup, cell_settings, fleet_label

__all__ = ["CellProgress", "run_balance", "run_cell"]

logger = logging.getLogger(__name__)

#: `(cell index, cells, cell, step, until_step, phase)` — what a progress display receives.
CellProgress = Callable[[int, int, BalanceCell, int, int, str], None]


def run_cell(setup: BalanceSetup, cell: BalanceCell, index: int, bootstrap: str, runs: Path,
             launch: LaunchOptions = LaunchOptions(), on_step: Callable[[int, str], None] | None = None) -> CellResult:
    """Run one cell on the broker at `bootstrap`.

    Args:
        setup: the experiment.
        cell: the policy, fleet and DIF to run.
        index: the cell's place in the schedule (names its topics and run directory).
        bootstrap: the broker.
        runs: where the cell's run directory (report, series, plots, logs) goes.
        launch: the root options the services are started with (the cell's settings on top).
        on_step: called with (step, phase) as the stack runs.

    Returns:
        Its figures, or `error` set (with what could be measured) when it failed.
    """
    from stack.services import DeviceStream, size_kind_for

    kind = size_kind_for(setup.size_mean, cell.dif)
    streams = [DeviceStream(str(i), 1.0, setup.size_mean, cell.dif, kind) for i in range(setup.devices)]
    ran = run_stack_cell(StackCell(
        name=f"{index:02d}-{cell.policy}-dif{cell.dif:g}-{fleet_label(cell.slowdowns, 'x')}", tag="balance",
        index=index, policy=cell.policy, streams=streams, settings=cell_settings(setup, cell),
        backlog=setup.backlog_per_device, until_step=setup.until_step, seed=setup.seed,
        start_timeout_s=setup.start_timeout_s, extra_sets=setup.extra_sets), bootstrap, runs, launch, on_step)
    identity: dict[str, Any] = {"policy": cell.policy, "slowdowns": cell.slowdowns, "dif": cell.dif,
                                "size_kind": kind}
    if ran.records is None or ran.report is None:
        return CellResult.model_validate({**identity, "error": ran.error})
    identity["seconds"] = ran.seconds
    try:
        figures = analyse_cell(ran.records.feedback, setup.devices, setup.warmup_steps, setup.steps,
                               setup.smooth_steps)
    except ValueError as exc:
        return CellResult.model_validate({**identity, "error": f"{ran.error or ''} analysis: {exc}".strip()})
    report = ran.report
    sizes = np.concatenate([recs.sizes[recs.decoded] for recs in ran.records.records.values()] or [np.zeros(0)])
    return CellResult.model_validate({
        **identity, **dict(figures),
        "steps": report.steps,
        "samples_trained": report.samples_trained,
        "samples_pending": report.samples_pending,  # the backlog left over by design: not lost
        "samples_unaccounted": report.samples_unaccounted,
        "samples_lost": report.samples_unaccounted,
        "size_mean_measured": float(np.mean(sizes)) if len(sizes) else None,
        "size_dif_measured": float(np.std(sizes)) if len(sizes) else None,
        "plan_latency_ms_median": report.plan_latency_ms_median,
        "backlog_seconds": ran.backlog_seconds,
        "run_dir": str(ran.run_dir),
        "error": ran.error,
    })


def run_balance(setup: BalanceSetup, out: Path, launch: LaunchOptions = LaunchOptions(),
                progress: CellProgress | None = None, bootstrap: str | None = None,
                cells: Sequence[BalanceCell] | None = None, on_cell: Callable[[CellResult], None] | None = None,
                runs: Path | None = None) -> BalanceResult:
    """Run every cell (one embedded broker for all, unless `bootstrap` names one) and write DIR/balance.json.

    Args:
        setup: the experiment.
        out: where balance.json and balance.png go.
        launch: the root options the services are started with.
        progress: called as cells and steps go by.
        bootstrap: a broker to use instead of an embedded one.
        cells: the cells to run (default `setup.cells()`).
        on_cell: called with each cell's result as soon as it is known.
        runs: where each cell's run directory (report, series, plots, logs) goes; default DIR/balance-runs.
    """
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    cells = list(cells) if cells is not None else setup.cells()
    results: list[CellResult] = []

    def starting() -> None:
        if progress is not None:
            progress(0, len(cells), cells[0], 0, setup.until_step, "starting the Kafka broker")

    with shared_broker(launch, bootstrap, starting, "st-balance-") as address:
        schedule = [(rep, cell) for rep in range(setup.repeats) for cell in cells]
        for i, (rep, cell) in enumerate(schedule):
            def on_step(step: int, phase: str, i: int = i, cell: BalanceCell = cell) -> None:
                if progress is not None:
                    progress(i, len(schedule), cell, step, setup.until_step, phase)

            ran = run_cell(setup, cell, i, address, runs or out / "balance-runs", launch, on_step)
            results.append(ran.model_copy(update={"repeat": rep}))
            if on_cell is not None:
                on_cell(results[-1])
            if progress is not None:
                progress(i + 1, len(schedule), cell, setup.until_step, setup.until_step, "done")
    figures = summarise(results, setup)
    settings = {**cell_settings(setup, cells[0]), "trainer.slowdowns": "per cell", **launch.overrides()}
    result = BalanceResult(
        setup=BalanceRunSetup.model_validate({**setup.model_dump(), "settings": settings}),
        target_loss=figures.target_loss, target_loss_rule=figures.target_loss_rule,
        seconds=round(time.monotonic() - began, 1), cells=figures.cells, targets=figures.targets,
        runs=[r.model_copy(update={"loss_curve": None}) for r in figures.runs] if figures.runs else None)
    result.write(out / "balance.json")
    try:
        plot_balance(result, out / "balance.png")
    except (ValueError, RuntimeError) as exc:
        logger.warning("balance plot failed: %s", exc)
    return result
