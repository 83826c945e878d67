"""Freshness end to end: how soon a produced sample is in the model `serve` answers with (`bench freshness`).

Runs the local stack with `--serve` on the demo's workload (PLAID replayed at 9, 9, 9 and 3 series/s, device 3
emulated 4x slower, requests from PLAID's test split at 20/s) twice: at line rate, and with the demo's burst
(25x the rates for 6 s, 20 s in). Each run's freshness is measured from what Kafka holds: for every trained
sample, from its produced_at to serve's first answer by a version that trained it (`streamtrain.versions.
freshness`), median and p99 over samples. The split says what dominates: the training side (produced to the
announcement of the version that first trained it: waiting in the buffer, the step, the publish interval, the
write) against serve's side (reading the announcement, loading the version, the gate, the next request).

Target at line rate on the development machine: median <= 1.5 s, p99 <= 5 s.

What dominates at line rate is the training side: a sample waits in its device's buffer and plan (the report's
sample delay), then up to `versions.publish_every_seconds` (0.5 s here) for the next version, whose write and
announcement take milliseconds; serve's side (reading the announcement, loading the version, the gate, the next
request at 20/s) adds under a tenth of a second. The tail is the gate's: a version refused for a drop in held-out
accuracy holds its samples until a later version passes (with a version every second and the gate at 0.02,
dips of 5-12 points in PLAID's held-out accuracy held the live version for ~10 s: p99 15 s; with the gate wide
open, `--set serve.tolerance=1`, the same workload measured a median of 0.98 s and a p99 of 2.2 s). Under the
burst every device builds a backlog (bounded truncation keeps up to 8 s of stream) and freshness is the
backlog's age, nearly all of it on the training side.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .common import (
    Bench,
    LaunchOptions,
    Record,
    RenderContext,
    Result,
    Target,
    num,
    table,
    target_lines,
    targets_table,
)

if TYPE_CHECKING:
    from stack.results import StackReport

__all__ = ["BENCH", "FreshnessCell", "FreshnessResult", "freshness_command"]

logger = logging.getLogger(__name__)

#: Targets at line rate (seconds).
MEDIAN_TARGET_S = 1.5
P99_TARGET_S = 5.0

#: The demo's rates (series/s per device) and its burst (the schedule of examples/plaid-demo.toml).
RATES = (9.0, 9.0, 9.0, 3.0)
#: examples/plaid-demo.toml's model and plan settings, used when the benchmark is given no --config (a benchmark
#: must run from an installed package, where the examples are not).
DEMO: dict[str, object] = {
    "trainer.model": "seq", "trainer.num_features": 1, "trainer.num_classes": 11, "trainer.hidden_size": 32,
    "trainer.num_layers": 4, "trainer.optimizer": "adamw", "trainer.lr": 0.003, "trainer.lr_scaling": False,
    "trainer.slowdowns": [1, 1, 1, 4], "trainer.slowdown_clock": "wall", "trainer.eval_every": 25,
    "producer.dataset.sharding": "stratified", "coordinator.global_batch": 256, "coordinator.truncation": "bounded",
    "coordinator.max_lag_seconds": 8, "versions.publish_every_seconds": 0.5,
}
BURST: list[dict[str, float]] = [{"at_seconds": 0, "factor": 1}, {"at_seconds": 20, "factor": 25},
                                 {"at_seconds": 26, "factor": 1}]


class FreshnessCell(Record):
    """One run: a scenario's freshness and what it is made of."""

    scenario: str
    seconds: float
    freshness_median_s: float | None
    freshness_p99_s: float | None
    published_median_s: float | None
    """Produced to the announcement of the version that first trained the sample (the training side)."""
    samples: int
    unserved_samples: int
    versions_published: int
    versions_served: int
    requests_answered: int
    request_latency_median_s: float | None
    sample_delay_median_s: float | None
    """Appended to processed by a step (the report's sample delay): waiting in Kafka and the buffer."""
    heldout_accuracy_final: float | None
    error: str | None = None


class FreshnessResult(Result):
    """What `bench freshness` measured."""

    duration_s: float
    publish_every_s: float
    request_rate: float
    cells: list[FreshnessCell]
    median_target_s: float = MEDIAN_TARGET_S
    p99_target_s: float = P99_TARGET_S

    def line_rate(self) -> FreshnessCell | None:
        return next((c for c in self.cells if c.scenario == "line rate" and c.error is None), None)

    def met(self) -> bool | None:
        cell = self.line_rate()
        if cell is None or cell.freshness_median_s is None or cell.freshness_p99_s is None:
            return None
        return cell.freshness_median_s <= self.median_target_s and cell.freshness_p99_s <= self.p99_target_s


def demo_settings(launch: LaunchOptions) -> dict[str, object]:
    """`DEMO` under the launch's own `--set` flags (which win), or nothing when a --config file says it all."""
    return {**DEMO, **launch.overrides()} if launch.config_file is None else {}


def _cell(scenario: str, report: StackReport | None, seconds: float, error: str | None) -> FreshnessCell:
    out = report.model_out if report is not None else None
    if report is None or out is None:
        return FreshnessCell(scenario=scenario, seconds=round(seconds, 1), freshness_median_s=None,
                             freshness_p99_s=None, published_median_s=None, samples=0, unserved_samples=0,
                             versions_published=0, versions_served=0, requests_answered=0,
                             request_latency_median_s=None, sample_delay_median_s=None, heldout_accuracy_final=None,
                             error=error or "no report")
    return FreshnessCell(
        scenario=scenario, seconds=round(seconds, 1), freshness_median_s=out.freshness_seconds_median,
        freshness_p99_s=out.freshness_seconds_p99, published_median_s=out.freshness_published_seconds_median,
        samples=out.freshness_samples or 0, unserved_samples=out.freshness_unserved_samples or 0,
        versions_published=out.versions_published, versions_served=out.versions_served or 0,
        requests_answered=out.requests_answered or 0, request_latency_median_s=out.request_latency_seconds_median,
        sample_delay_median_s=report.sample_delay_seconds_median,
        heldout_accuracy_final=report.heldout_accuracy_final, error=error)


def run_scenario(launch: LaunchOptions, scenario: str, schedule: list[dict[str, float]], duration: float,
                 request_rate: float, bootstrap: str, runs: Path) -> FreshnessCell:
    """One `up --dataset plaid --serve` run of `duration` seconds on the broker at `bootstrap`."""
    import time

    from stack.replay import resolve_replay
    from stack.runner import LocalStack, StackError, StackOptions
    from stack.services import device_streams

    from .stack_cell import delete_topics

    base = {**demo_settings(launch), "kafka.bootstrap_servers": bootstrap}
    replay = resolve_replay("plaid", launch.config(base), len(RATES))
    settings = {**base, **replay.settings, "producer.rate.schedule": schedule,
                "job": f"fresh-{scenario.replace(' ', '-')}"}
    out = runs / scenario.replace(" ", "-")
    opts = StackOptions(streams=device_streams(len(RATES), RATES), out=out.resolve(), broker="external",
                        prometheus=False, duration_s=duration, drain_timeout_s=10.0, torch_threads=1,
                        global_args=launch.argv(settings), replay=True, serve=True, request_rate=request_rate)
    stack = LocalStack(launch.config(settings), opts, say=lambda line: logger.info("%s", line))
    began = time.monotonic()
    try:
        report = stack.run()
    except StackError as exc:
        return _cell(scenario, None, time.monotonic() - began, str(exc))
    finally:
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
        delete_topics(stack.cfg.model_copy(update={"kafka": stack.kafka}))
    return _cell(scenario, report, time.monotonic() - began, "; ".join(stack.failures) or None)


def freshness_command(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", metavar="DIR", help="Directory for freshness.json.")
                   ] = Path("reports/bench"),
    duration: Annotated[float, typer.Option(min=30.0, help="Seconds each scenario runs (once every service is "
                                            "up); the burst comes 20 s in.")] = 60.0,
    request_rate: Annotated[float, typer.Option(min=1.0, help="Requests per second sent to serve.")] = 20.0,
    scenario: Annotated[list[str] | None, typer.Option(help="line-rate and/or burst (default both).")] = None,
    work_dir: Annotated[Path, typer.Option(help="The runs' directories (WORK_DIR/freshness).")
                        ] = Path("reports/bench-runs"),
) -> None:
    """Freshness end to end on the demo's workload: from a sample's production to serve's first answer by a model
    version that trained it, median and p99 over every trained sample, at line rate and under the demo's burst.

    Runs `up --dataset plaid --serve` with examples/plaid-demo.toml's model and plans (or those of --config) for
    --duration seconds per scenario on an embedded broker (or the one at kafka.bootstrap_servers when set). Writes
    DIR/freshness.json. Target at line rate: median <= 1.5 s, p99 <= 5 s.
    """
    from streamtrain.cli_support import EXIT_CONFIG, config_from, console, die

    from .stack_cell import shared_broker

    cfg = config_from(ctx)
    chosen = scenario or ["line-rate", "burst"]
    unknown = [s for s in chosen if s not in ("line-rate", "burst")]
    if unknown:
        die(f"--scenario {', '.join(unknown)}: choose line-rate or burst", EXIT_CONFIG)
    launch = LaunchOptions.of(ctx)
    external = cfg.kafka.bootstrap_servers if "bootstrap_servers" in cfg.kafka.model_fields_set else None
    cells = []
    with shared_broker(launch, external, prefix="st-bench-fresh-") as bootstrap:
        for name in chosen:
            console.print(f"freshness: {name}, {duration:g} s", highlight=False)
            schedule: list[dict[str, float]] = BURST if name == "burst" else [{"at_seconds": 0, "factor": 1}]
            cell = run_scenario(launch, name.replace("-", " "), schedule, duration, request_rate, bootstrap,
                                work_dir / "freshness")
            console.print(f"  median {num(cell.freshness_median_s)} s, p99 {num(cell.freshness_p99_s)} s "
                          f"(training side {num(cell.published_median_s)} s) over {cell.samples:,} samples; "
                          f"{cell.versions_served} of {cell.versions_published} versions served"
                          + (f"; error: {cell.error}" if cell.error else ""), highlight=False)
            cells.append(cell)
    publish = launch.config(demo_settings(launch)).versions.publish_every_seconds
    result = FreshnessResult(duration_s=duration, publish_every_s=publish,
                             request_rate=request_rate, cells=cells)
    out.mkdir(parents=True, exist_ok=True)
    result.write(out / BENCH.json_name)
    for line in target_lines(freshness_targets(result)):
        console.print(line, highlight=False)
    console.print(f"wrote {out / 'freshness.json'}", highlight=False)
    if any(c.error for c in cells):
        raise typer.Exit(1)


def freshness_targets(result: FreshnessResult) -> list[Target]:
    """Median and p99 at line rate."""
    cell = result.line_rate()
    measured = (f"median {num(cell.freshness_median_s)} s, p99 {num(cell.freshness_p99_s)} s over "
                f"{cell.samples:,} samples" if cell is not None else "not measured")
    return [Target(f"freshness at line rate: median <= {result.median_target_s:g} s, p99 <= "
                   f"{result.p99_target_s:g} s", measured, result.met(),
                   "Ekko (OSDI '22): 2.4 s from an update to serving; Monolith syncs parameters every 10 s")]


def render_freshness(result: FreshnessResult, _ctx: RenderContext) -> str:
    """The freshness section of BENCHMARKS.md: the target, then each scenario and what its freshness is made of."""
    rows = [(c.scenario, num(c.freshness_median_s), num(c.freshness_p99_s), num(c.published_median_s),
             num(c.sample_delay_median_s), num(c.request_latency_median_s), f"{c.versions_served}/"
             f"{c.versions_published}", c.samples, c.unserved_samples, num(c.heldout_accuracy_final, 3))
            for c in result.cells]
    header = ("scenario", "median s", "p99 s", "training side median s", "sample delay median s",
              "request latency median s", "versions served/published", "samples", "unserved", "held-out acc.")
    return "\n\n".join((
        f"Setup: {result.duration_s:g} s per scenario, a version every {result.publish_every_s:g} s, "
        f"{result.request_rate:g} requests/s; single runs.",
        targets_table(freshness_targets(result)),
        table(header, rows),
    ))


BENCH = Bench("freshness", freshness_command, FreshnessResult, render_freshness,
              quick_args=("--duration", "30", "--scenario", "line-rate"), timeout_s=900.0, about=__doc__ or "",
              command_line="--duration 45")
