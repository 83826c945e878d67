"""`streamtrain bench freshness`: how soon a produced sample is in the model `serve` answers with (docs/benchmarks)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Annotated

import typer

from .common import Bench, LaunchOptions, Out, Record, Result, Target, WorkDir, num, publish, table, targets_table
from .live import CellRun, StackCell, live_broker, run_stack_cell

__all__ = ["BENCH", "FreshnessCell", "FreshnessResult"]

#: Targets at line rate (seconds).
MEDIAN_TARGET_S, P99_TARGET_S = 1.0, 3.0
#: The demo's rates (series/s per device).
RATES = (9.0, 9.0, 9.0, 3.0)
#: examples/plaid-demo.toml's model and plan settings (an installed package has no examples), unless --config is given.
DEMO: dict[str, object] = {
    "trainer.model": "seq", "trainer.num_features": 1, "trainer.num_classes": 11, "trainer.hidden_size": 32,
    "trainer.num_layers": 4, "trainer.optimizer": "adamw", "trainer.lr": 0.003, "trainer.lr_scaling": False,
    "trainer.slowdowns": [1, 1, 1, 4], "trainer.slowdown_clock": "wall", "trainer.eval_every": 25,
    "producer.dataset.sharding": "stratified", "coordinator.global_batch": 256, "coordinator.truncation": "bounded",
    "coordinator.max_lag_seconds": 8, "versions.publish_every_seconds": 0.25,
}
#: Each scenario's rate schedule (the demo's burst: 25x the rates from 20 s to 26 s).
SCHEDULES: dict[str, list[dict[str, float]]] = {
    "line-rate": [{"at_seconds": 0, "factor": 1}],
    "burst": [{"at_seconds": 0, "factor": 1}, {"at_seconds": 20, "factor": 25}, {"at_seconds": 26, "factor": 1}],
}


class FreshnessCell(Record):
    """One scenario's run: its freshness and what it is made of."""

    scenario: str
    repeat: int = 0
    freshness_median_s: float | None = None
    freshness_p99_s: float | None = None
    published_median_s: float | None = None
    samples: int = 0
    unserved_samples: int = 0
    versions_published: int = 0
    versions_served: int = 0
    request_latency_median_s: float | None = None
    sample_delay_median_s: float | None = None
    heldout_accuracy_final: float | None = None
    error: str | None = None


class FreshnessResult(Result):
    """What `bench freshness` measured."""

    duration_s: float
    publish_every_s: float
    request_rate: float
    repeats: int = 1
    cells: list[FreshnessCell]


def _cell(scenario: str, repeat: int, ran: CellRun) -> FreshnessCell:
    report = ran.report
    out = report.model_out if report is not None else None
    if report is None or out is None:
        return FreshnessCell(scenario=scenario, repeat=repeat, error=ran.error or "no report")
    return FreshnessCell(
        scenario=scenario, repeat=repeat, freshness_median_s=out.freshness_seconds_median,
        freshness_p99_s=out.freshness_seconds_p99,
        published_median_s=out.freshness_published_seconds_median, samples=out.freshness_samples or 0,
        unserved_samples=out.freshness_unserved_samples or 0, versions_published=out.versions_published,
        versions_served=out.versions_served or 0, request_latency_median_s=out.request_latency_seconds_median,
        sample_delay_median_s=report.sample_delay_seconds_median,
        heldout_accuracy_final=report.heldout_accuracy_final, error=ran.error)


def freshness_command(
    ctx: typer.Context,
    out: Out = Path("reports/bench"),
    duration: Annotated[float, typer.Option(min=30.0, help="Seconds per scenario (the burst comes 20 s in).")] = 60.0,
    request_rate: Annotated[float, typer.Option(min=1.0, help="Requests per second sent to serve.")] = 20.0,
    scenario: Annotated[list[str] | None, typer.Option(help="line-rate and/or burst (default both).")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Runs of each scenario, one after the other; the targets are "
                                         "judged on the median of their medians and of their p99s.")] = 1,
    work_dir: WorkDir = Path("reports/bench-runs"),
) -> None:
    """Freshness (a sample's production to serve's first answer by a version that trained it) of `up --dataset plaid
    --serve` with the demo's model and plans (or --config's), at line rate and under the demo's burst, on an embedded
    broker (or kafka.bootstrap_servers when set). Target at line rate: median <= 1.0 s, p99 <= 3 s."""
    from streamtrain.runtime.commands import EXIT_CONFIG, config_from, console, die
    from streamtrain.stack.replay import resolve_replay
    from streamtrain.stack.services import device_streams

    cfg = config_from(ctx)
    chosen = scenario or list(SCHEDULES)
    if unknown := [s for s in chosen if s not in SCHEDULES]:
        die(f"--scenario {', '.join(unknown)}: choose line-rate or burst", EXIT_CONFIG)
    launch = LaunchOptions.of(ctx)
    demo = {**DEMO, **launch.overrides()} if launch.config_file is None else {}  # a --config file says it all
    cells = []
    with live_broker(cfg, "bootstrap_servers" in cfg.kafka.model_fields_set, "freshness") as broker:
        base = {**demo, "kafka.bootstrap_servers": broker.kafka.bootstrap_servers}
        replay = resolve_replay("plaid", launch.config(base), len(RATES)).settings
        runs = [(r, name) for r in range(repeats) for name in chosen]  # scenarios alternate: drift falls on both
        for i, (r, name) in enumerate(runs):
            console.print(f"freshness: {name}, {duration:g} s" + (f", run {r + 1} of {repeats}" if repeats > 1 else ""),
                          highlight=False)
            where = work_dir / "freshness" / (name if repeats == 1 else f"{name}-{r}")
            cell = StackCell(streams=device_streams(len(RATES), RATES), out=where, tag="fresh",
                             index=i, settings={**base, **replay, "producer.rate.schedule": SCHEDULES[name]},
                             duration_s=duration, replay=True, serve=True, request_rate=request_rate,
                             drain_timeout_s=10.0)
            ran = run_stack_cell(cell, broker.kafka.bootstrap_servers, launch)
            cells.append(c := _cell(name.replace("-", " "), r, ran))
            console.print(f"  median {num(c.freshness_median_s)} s, p99 {num(c.freshness_p99_s)} s over {c.samples:,} "
                          f"samples, {c.versions_served} of {c.versions_published} versions served"
                          + (f"; error: {c.error}" if c.error else ""), highlight=False)
    publish(BENCH, FreshnessResult(duration_s=duration, request_rate=request_rate, repeats=repeats, cells=cells,
                                   publish_every_s=launch.config(demo).versions.publish_every_seconds), out)
    if any(c.error for c in cells):
        raise typer.Exit(1)


def freshness_targets(result: FreshnessResult) -> list[Target]:
    """Median and p99 at line rate (over several runs: the median of the runs' medians and of their p99s)."""
    cells = [c for c in result.cells if c.scenario == "line rate" and c.error is None]
    medians = [c.freshness_median_s for c in cells if c.freshness_median_s is not None]
    p99s = [c.freshness_p99_s for c in cells if c.freshness_p99_s is not None]
    median = statistics.median(medians) if medians else None
    p99 = statistics.median(p99s) if p99s else None
    runs = (f"over {cells[0].samples:,} samples" if len(cells) == 1 else
            f"medians of {len(cells)} runs (p99s {', '.join(num(c.freshness_p99_s) for c in cells)} s)")
    return [Target(f"freshness at line rate: median <= {MEDIAN_TARGET_S:g} s, p99 <= {P99_TARGET_S:g} s",
                   f"median {num(median)} s, p99 {num(p99)} s {runs}" if cells else
                   "not measured", None if median is None or p99 is None else
                   median <= MEDIAN_TARGET_S and p99 <= P99_TARGET_S,
                   "Ekko (OSDI '22): 2.4 s from an update to serving; Monolith syncs parameters every 10 s")]


def render_freshness(result: FreshnessResult) -> str:
    """The freshness section of BENCHMARKS.md: the target, then each scenario and what its freshness is made of."""
    rows = [(c.scenario, c.repeat + 1, c.freshness_median_s, c.freshness_p99_s, c.published_median_s,
             c.sample_delay_median_s, c.request_latency_median_s, f"{c.versions_served}/{c.versions_published}",
             c.samples, c.unserved_samples, num(c.heldout_accuracy_final, 3)) for c in result.cells]
    header = ("scenario", "run", "median s", "p99 s", "training side median s", "sample delay median s",
              "request latency median s", "versions served/published", "samples", "unserved", "held-out acc.")
    return "\n\n".join((f"Setup: {result.duration_s:g} s per scenario, a version every {result.publish_every_s:g} s, "
                        f"{result.request_rate:g} requests/s; "
                        + (f"{result.repeats} runs of each scenario." if result.repeats > 1 else "single runs."),
                        targets_table(freshness_targets(result)),
                        table(header, rows)))


BENCH = Bench("freshness", freshness_command, FreshnessResult, render_freshness, freshness_targets,
              quick_args=("--duration", "30", "--scenario", "line-rate"), timeout_s=900.0,
              command_line="--duration 45 --repeats 3")
