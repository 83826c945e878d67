"""`bench balance`, the run: each cell one `stack.runner.LocalStack` on one shared broker, its figures read back."""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from streamtrain.config import StreamtrainConfig, parse_assignment

from ..common import LaunchOptions
from .analysis import analyse_cell, summarise
from .render import plot_balance
from .results import BalanceResult, BalanceRunSetup, CellResult
from .setup import BalanceCell, BalanceSetup, cell_settings, fleet_label

__all__ = ["CellProgress", "run_balance", "run_cell"]

logger = logging.getLogger(__name__)

#: `(cell index, cells, cell, step, until_step, phase)` — what a progress display receives.
CellProgress = Callable[[int, int, BalanceCell, int, int, str], None]


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
    from stack.runner import LocalStack, StackError, StackOptions
    from stack.services import DeviceStream, size_kind_for

    run_id = uuid.uuid4().hex[:6]
    prefix = f"bal{run_id}c{index}"
    settings = {"job": f"balance-{run_id}-{index}", "kafka.bootstrap_servers": bootstrap,
                "kafka.topic_prefix": prefix, **cell_settings(setup, cell),
                **dict(parse_assignment(s) for s in setup.extra_sets)}
    kind = size_kind_for(setup.size_mean, cell.dif)
    streams = [DeviceStream(str(i), 1.0, setup.size_mean, cell.dif, kind) for i in range(setup.devices)]
    cell_dir = runs / f"{index:02d}-{cell.policy}-dif{cell.dif:g}-{fleet_label(cell.slowdowns, 'x')}"
    opts = StackOptions(streams=streams, out=cell_dir.resolve(), policy=cell.policy, broker="external",
                        prometheus=False, drain_timeout_s=0.0, start_timeout_s=setup.start_timeout_s,
                        torch_threads=1, seed=setup.seed, global_args=launch.argv(settings),
                        backlog=setup.backlog_per_device, until_step=setup.until_step)

    def update(snap: Any) -> None:
        if on_step is not None:
            on_step(snap.step or 0, snap.phase)

    stack = LocalStack(launch.config(settings), opts, on_update=update, say=lambda line: logger.info("%s", line))
    began = time.monotonic()
    identity: dict[str, Any] = {"policy": cell.policy, "slowdowns": cell.slowdowns, "dif": cell.dif,
                                "size_kind": kind}
    try:
        report = stack.run()
    except StackError as exc:
        return CellResult.model_validate({**identity, "error": str(exc)})
    finally:
        shutil.rmtree(cell_dir / "checkpoints", ignore_errors=True)  # the model is not what this measures
        try:
            _delete_topics(stack.cfg.model_copy(update={"kafka": stack.kafka}))
        except Exception as exc:  # see _delete_topics
            logger.warning("topic clean-up of %s failed: %s", prefix, exc)
    identity["seconds"] = round(time.monotonic() - began, 1)
    error = "; ".join(stack.failures) or (None if stack.records is not None else "no records read back")
    if stack.records is None:
        return CellResult.model_validate({**identity, "error": error})
    try:
        figures = analyse_cell(stack.records.feedback, setup.devices, setup.warmup_steps, setup.steps,
                               setup.smooth_steps)
    except ValueError as exc:
        return CellResult.model_validate({**identity, "error": f"{error or ''} analysis: {exc}".strip()})
    sizes = np.concatenate([recs.sizes[recs.decoded] for recs in stack.records.records.values()] or [np.zeros(0)])
    return CellResult.model_validate({
        **identity, **dict(figures),
        "steps": report.get("steps"),
        "samples_trained": report.get("samples_trained"),
        "samples_pending": report.get("samples_pending"),  # the backlog left over by design: not lost
        "samples_unaccounted": report.get("samples_unaccounted"),
        "samples_lost": report.get("samples_unaccounted"),
        "size_mean_measured": float(np.mean(sizes)) if len(sizes) else None,
        "size_dif_measured": float(np.std(sizes)) if len(sizes) else None,
        "plan_latency_ms_median": report.get("plan_latency_ms_median"),
        "backlog_seconds": stack.backlog_seconds,
        "run_dir": str(cell_dir),
        "error": error,
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
    from streamtrain.broker import EmbeddedBroker

    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    cells = list(cells) if cells is not None else setup.cells()
    results: list[CellResult] = []
    broker: EmbeddedBroker | None = None
    scratch = tempfile.TemporaryDirectory(prefix="st-balance-")
    try:
        if bootstrap is None:
            broker = EmbeddedBroker(launch.config().broker.model_copy(update={
                "data_dir": Path(scratch.name) / "kafka", "port": 0, "controller_port": 0}))
            if progress is not None:
                progress(0, len(cells), cells[0], 0, setup.until_step, "starting the Kafka broker")
            bootstrap = broker.start()
        schedule = [(rep, cell) for rep in range(setup.repeats) for cell in cells]
        for i, (rep, cell) in enumerate(schedule):
            def on_step(step: int, phase: str, i: int = i, cell: BalanceCell = cell) -> None:
                if progress is not None:
                    progress(i, len(schedule), cell, step, setup.until_step, phase)

            ran = run_cell(setup, cell, i, bootstrap, runs or out / "balance-runs", launch, on_step)
            results.append(ran.model_copy(update={"repeat": rep}))
            if on_cell is not None:
                on_cell(results[-1])
            if progress is not None:
                progress(i + 1, len(schedule), cell, setup.until_step, setup.until_step, "done")
    finally:
        if broker is not None:
            broker.stop()
        scratch.cleanup()
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
