"""One benchmark cell on the live stack: a `stack.runner.LocalStack` run on a broker the benchmark shares.

What every benchmark that compares runs of the whole stack does the same way: one embedded broker for all
its cells (`shared_broker`), each cell with its own topic prefix and job, its services started with the
benchmark's root options plus the cell's settings, a backlog pre-produced before training, the run stopped at
a fixed step, its records read back from Kafka, and its topics (and checkpoints) deleted once read.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamtrain.config import StreamtrainConfig, parse_assignment

from .common import LaunchOptions

if TYPE_CHECKING:
    from stack.ledger import RunRecords
    from stack.results import StackReport
    from stack.services import DeviceStream

__all__ = ["CellRun", "StackCell", "delete_topics", "run_stack_cell", "shared_broker"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StackCell:
    """What one cell runs: the stack's streams, policy and stopping step, and the settings that make it this cell."""

    name: str
    """Names the cell's run directory (under the benchmark's runs directory)."""
    tag: str
    """Short prefix of the cell's topic prefix and job (the benchmark's name)."""
    index: int
    """The cell's place in the schedule (in its topic prefix, job and log lines)."""
    policy: str
    streams: Sequence[DeviceStream]
    settings: Mapping[str, object]
    """Dotted settings on top of the launch options (before `extra_sets`)."""
    backlog: int
    """Samples pre-produced per device before the trainers start."""
    until_step: int
    seed: int = 0
    replay: bool = False
    """Replay the configured dataset (`producer.dataset.*`) instead of synthetic streams."""
    start_timeout_s: float = 240.0
    extra_sets: Sequence[str] = ()
    """`KEY=VALUE` settings applied after the cell's own (the command's `--set`-like escape hatch)."""


@dataclass(frozen=True)
class CellRun:
    """What a cell's run left: the report `up` writes, the records read back, and what went wrong."""

    report: StackReport | None
    records: RunRecords | None
    """None when the run could not be read back (then `error` says why)."""
    seconds: float
    run_dir: Path
    backlog_seconds: float | None
    error: str | None


def delete_topics(cfg: StreamtrainConfig) -> None:
    """Delete every topic under `cfg`'s topic prefix (disk space only: a failure is logged, never raised)."""
    from streamtrain.kafka import make_admin

    admin = make_admin(cfg.kafka)
    names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(cfg.kafka.topic_prefix + ".")]
    if names:
        for fut in admin.delete_topics(names, operation_timeout=30).values():
            try:
                fut.result(timeout=30)
            except Exception as exc:  # disk space only: never fail a benchmark over it
                logger.warning("could not delete a topic of %s: %s", cfg.kafka.topic_prefix, exc)


def run_stack_cell(cell: StackCell, bootstrap: str, runs: Path, launch: LaunchOptions = LaunchOptions(),
                   on_step: Callable[[int, str], None] | None = None) -> CellRun:
    """Run one cell on the broker at `bootstrap` and read it back.

    Args:
        cell: what to run.
        bootstrap: the broker (shared by the benchmark's cells).
        runs: where the cell's run directory (report, series, plots, logs) goes.
        launch: the root options the services are started with (the cell's settings on top).
        on_step: called with (step, phase) as the stack runs.

    Returns:
        The run; `error` set (and `records` None when nothing could be read back) when it failed.
    """
    from stack.runner import LocalStack, StackError, StackOptions

    run_id = uuid.uuid4().hex[:6]
    settings = {"job": f"{cell.tag}-{run_id}-{cell.index}", "kafka.bootstrap_servers": bootstrap,
                "kafka.topic_prefix": f"{cell.tag[:3]}{run_id}c{cell.index}", **cell.settings,
                **dict(parse_assignment(s) for s in cell.extra_sets)}
    run_dir = runs / cell.name
    opts = StackOptions(streams=cell.streams, out=run_dir.resolve(), policy=cell.policy, broker="external",
                        prometheus=False, drain_timeout_s=0.0, start_timeout_s=cell.start_timeout_s,
                        torch_threads=1, seed=cell.seed, global_args=launch.argv(settings), backlog=cell.backlog,
                        until_step=cell.until_step, replay=cell.replay)

    def update(snap: Any) -> None:
        if on_step is not None:
            on_step(snap.step or 0, snap.phase)

    stack = LocalStack(launch.config(settings), opts, on_update=update, say=lambda line: logger.info("%s", line))
    began = time.monotonic()
    try:
        report = stack.run()
    except StackError as exc:
        return CellRun(None, None, round(time.monotonic() - began, 1), run_dir, stack.backlog_seconds, str(exc))
    finally:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # the model is not what a benchmark measures
        try:
            delete_topics(stack.cfg.model_copy(update={"kafka": stack.kafka}))
        except Exception as exc:  # see delete_topics
            logger.warning("topic clean-up of cell %d failed: %s", cell.index, exc)
    error = "; ".join(stack.failures) or (None if stack.records is not None else "no records read back")
    return CellRun(report, stack.records, round(time.monotonic() - began, 1), run_dir, stack.backlog_seconds, error)


@contextlib.contextmanager
def shared_broker(launch: LaunchOptions, bootstrap: str | None = None,
                  starting: Callable[[], None] | None = None, prefix: str = "st-bench-") -> Iterator[str]:
    """The bootstrap address of the broker a benchmark's cells share: `bootstrap` when given, else an embedded
    broker (data in a scratch directory) started now and stopped, its data deleted, when the block ends.

    Args:
        launch: the root options (the embedded broker's settings).
        bootstrap: an external broker to use instead.
        starting: called just before an embedded broker starts (a progress line: it takes seconds).
        prefix: the scratch directory's name prefix.
    """
    if bootstrap is not None:
        yield bootstrap
        return
    from streamtrain.broker import EmbeddedBroker

    with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        broker = EmbeddedBroker(launch.config().broker.model_copy(update={
            "data_dir": Path(scratch) / "kafka", "port": 0, "controller_port": 0}))
        if starting is not None:
            starting()
        try:
            yield broker.start()
        finally:
            broker.stop()
