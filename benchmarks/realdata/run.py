"""`bench realdata`, the run: each cell one `stack_cell.run_stack_cell` replaying the dataset, read back, judged."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..balance.analysis import analyse_cell
from ..balance.setup import fleet_label
from ..common import LaunchOptions
from ..stack_cell import CellRun, StackCell, run_stack_cell, shared_broker
from .analysis import accuracy_curve, summarise, wall_period_median
from .render import plot_realdata
from .results import RealdataResult, RunResult
from .setup import RealdataCell, RealdataSetup, cell_settings, schedule

__all__ = ["CellProgress", "dataset_settings", "run_realdata", "run_result"]

logger = logging.getLogger(__name__)

#: `(run index, runs, cell, step, until_step, phase)` — what a progress display receives.
CellProgress = Callable[[int, int, RealdataCell, int, int, str], None]


def dataset_settings(setup: RealdataSetup, launch: LaunchOptions) -> dict[str, object]:
    """What replaying `setup.dataset` sets (producers' source, held-out set), checked against the model.

    Raises:
        ValueError: the dataset cannot be loaded (its package not installed) or does not fit the model.
    """
    from stack.replay import resolve_replay

    cell = RealdataCell(setup.policies[0], setup.slowdowns)
    replay = resolve_replay(setup.dataset, launch.config(cell_settings(setup, cell)))
    if replay.held_out is None:
        raise ValueError(f"dataset {setup.dataset}: no held-out split to measure accuracy on")
    return replay.settings


def run_result(ran: CellRun, setup: RealdataSetup, cell: RealdataCell, repeat: int, order: int) -> RunResult:
    """A run's figures from what it left in Kafka (its window's step figures, its accuracy over time)."""
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
        **identity, **dict(figures), "loss_curve": None,
        "wall_period_seconds_median": period, "accuracy": curve,
        "final_accuracy": curve[-1].accuracy if curve else None,
        "samples_trained": ran.report.samples_trained,
        "samples_unaccounted": ran.report.samples_unaccounted,
        "backlog_left_min": min(left) if left else None,
        "error": ran.error or (None if curve else "no held-out evaluation read back"),
    })


def run_realdata(setup: RealdataSetup, out: Path, launch: LaunchOptions = LaunchOptions(),
                 progress: CellProgress | None = None, bootstrap: str | None = None,
                 on_run: Callable[[RunResult], None] | None = None, runs: Path | None = None) -> RealdataResult:
    """Run every cell `setup.repeats` times in rotated order on one broker, and write DIR/realdata.json and .png.

    Args:
        setup: the experiment.
        out: where realdata.json and realdata.png go.
        launch: the root options the services are started with.
        progress: called as runs and steps go by.
        bootstrap: a broker to use instead of an embedded one.
        on_run: called with each run's result as soon as it is known.
        runs: where each run's directory (report, series, plots, logs) goes; default DIR/realdata-runs.

    Raises:
        ValueError: the dataset cannot be replayed with the benchmark's model.
    """
    from stack.services import DeviceStream

    replay = dataset_settings(setup, launch)
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    plan = schedule(setup)
    results: list[RunResult] = []

    def starting() -> None:
        if progress is not None:
            progress(0, len(plan), plan[0][1], 0, setup.until_step, "starting the Kafka broker")

    with shared_broker(launch, bootstrap, starting, "st-realdata-") as address:
        for i, (rep, cell) in enumerate(plan):
            def on_step(step: int, phase: str, i: int = i, cell: RealdataCell = cell) -> None:
                if progress is not None:
                    progress(i, len(plan), cell, step, setup.until_step, phase)

            # Replayed from a backlog: the rate and sizes of a stream do not apply (a sample's size is its length).
            streams = [DeviceStream(str(d), 1.0, 1.0, 0.0) for d in range(setup.devices)]
            stack_cell = StackCell(
                name=f"{i:02d}-{cell.policy}-{fleet_label(cell.slowdowns, 'x')}", tag="realdata", index=i,
                policy=cell.policy, streams=streams, settings={**cell_settings(setup, cell), **replay},
                backlog=setup.backlog_per_device, until_step=setup.until_step, seed=setup.seed, replay=True,
                start_timeout_s=setup.start_timeout_s, extra_sets=setup.extra_sets)
            ran = run_stack_cell(stack_cell, address, runs or out / "realdata-runs", launch, on_step)
            results.append(run_result(ran, setup, cell, rep, i))
            if on_run is not None:
                on_run(results[-1])
            if progress is not None:
                progress(i + 1, len(plan), cell, setup.until_step, setup.until_step, "done")
    result = summarise(results, setup, {**cell_settings(setup, plan[0][1]), **replay,
                                        "trainer.slowdowns": "per cell", **launch.overrides()},
                       round(time.monotonic() - began, 1))
    result.write(out / "realdata.json")
    try:
        plot_realdata(result, out / "realdata.png")
    except (ValueError, RuntimeError) as exc:
        logger.warning("realdata plot failed: %s", exc)
    return result

