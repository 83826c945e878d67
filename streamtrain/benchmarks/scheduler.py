"""`streamtrain bench scheduler`: plan latency of the planning policies on backlogged fleets (docs/benchmarks)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
import typer

from streamtrain.config import CoordinatorConfig

from .common import TIMES, Bench, Out, Record, Result, Target, interleaved, publish, pyplot, table, targets_table

if TYPE_CHECKING:
    from streamtrain.coordinator.state import PlanningState

__all__ = ["BENCH", "SchedulerResult", "measure_scheduler", "synthetic_state"]

#: (devices, pending samples per device) of every cell.
GRID = ((8, 256), (8, 4096), (32, 256), (32, 4096), (128, 256), (128, 4096), (1024, 256), (1024, 4096))


class LatencyCell(Record):
    """Plan latency of one policy on one fleet."""

    policy: str
    devices: int
    pending_per_device: int
    latency_ms_median: float
    latency_ms_p99: float


class SchedulerResult(Result):
    """What `scheduler.json` holds."""

    cells: list[LatencyCell]


def synthetic_state(devices: int, pending: int, seed: int = 0) -> PlanningState:
    """A backlogged fleet: speeds 1-4x, sizes lognormal (mean 45, std 32), streams at 50-150 samples/s."""
    from streamtrain.coordinator.perfmodel import PerfModel
    from streamtrain.coordinator.state import DeviceState, PendingIndex, PlanningState

    rng = np.random.default_rng(seed)
    out = []
    for i in range(devices):
        sizes = np.maximum(np.rint(rng.lognormal(3.6, 0.6, pending)), 1.0)
        speed = rng.uniform(1.0, 4.0)
        out.append(DeviceState(
            device_id=f"d{i}", model=PerfModel(a=2e-4 / speed, b=0.02, n_obs=10, fitted=True),
            pending=PendingIndex(np.arange(pending), sizes, np.sort(rng.uniform(0, 10, pending))),
            arrival_rate=float(rng.uniform(50, 150)), mean_size=45.0, lag=pending, size_limit=20_000.0,
        ))
    return PlanningState(step=1, now=10.0, devices=tuple(out), last_step_seconds=0.3)


def measure_scheduler(config: CoordinatorConfig, repeats: int, reference: bool) -> list[LatencyCell]:
    """Median and p99 plan latency (ms) of ett-stream and chronica per (devices, pending per device) cell, the
    policies interleaved; with `reference`, also of their plain specifications, as "<policy>@reference"."""
    from streamtrain.coordinator.policies import get_policy, plan_with
    from streamtrain.coordinator.policies.chronica import plan_chronica_reference
    from streamtrain.coordinator.policies.ett_stream import plan_ett_stream_reference
    from streamtrain.runtime.commands import console

    policies = {}
    for name, specification in (("ett-stream", plan_ett_stream_reference), ("chronica", plan_chronica_reference)):
        policies[name] = get_policy(name)
        if reference:
            policies[f"{name}@reference"] = specification
    cells = []
    for devices, pending in GRID:
        state = synthetic_state(devices, pending)
        # chronica packs a fixed global batch: about one step's worth of what the fleet buffers.
        cfg = config.model_copy(update={"global_batch": max(devices * 32, 1)})

        def timed(name: str, r: int, state: PlanningState = state, cfg: CoordinatorConfig = cfg) -> float:
            t0 = time.perf_counter()
            plan_with(replace(state, step=r), cfg, policies[name])
            return (time.perf_counter() - t0) * 1000.0

        for name, times in interleaved(list(policies), repeats, timed).items():
            cells.append(cell := LatencyCell(policy=name, devices=devices, pending_per_device=pending,
                                             latency_ms_median=float(np.median(times)),
                                             latency_ms_p99=float(np.percentile(times, 99))))
            console.print(f"{name:10s} {devices:5d} devices x {pending:5d} pending: median "
                          f"{cell.latency_ms_median:.2f} ms, p99 {cell.latency_ms_p99:.2f} ms", highlight=False)
    return cells


def scheduler_command(
    ctx: typer.Context,
    out: Out = Path("reports/bench"),
    repeats: Annotated[int, typer.Option(min=3, help="Plans timed per cell.")] = 30,
    reference: Annotated[bool, typer.Option(help="Also time the plain specifications ('<policy>@reference').")] = False,
) -> None:
    """Plan latency (median, p99) of ett-stream and chronica for 8-1024 devices x 256/4096 pending."""
    from streamtrain.runtime.commands import config_from

    publish(BENCH, SchedulerResult(cells=measure_scheduler(config_from(ctx).coordinator, repeats, reference)), out)


def scheduler_targets(result: SchedulerResult) -> list[Target]:
    """ett-stream's median plan latency at 32 devices x 4096 pending and 1024 x 256."""
    medians = {(c.devices, c.pending_per_device): c.latency_ms_median for c in result.cells if c.policy == "ett-stream"}
    return [Target(f"≤ {limit:g} ms at {devices} devices {TIMES} {pending} pending", "—" if at is None else
                   f"{at:.2f} ms", None if at is None else at <= limit, "not reported")
            for devices, pending, limit in ((32, 4096, 5.0), (1024, 256, 50.0))
            for at in [medians.get((devices, pending))]]


def plot_scheduler(result: SchedulerResult) -> Any:
    """Median plan latency against devices (log-log), a line per policy and backlog."""
    cells = result.cells
    fig, ax = pyplot().subplots(figsize=(6, 3))
    for policy, pending in sorted({(c.policy, c.pending_per_device) for c in cells}):
        pts = sorted((c.devices, c.latency_ms_median) for c in cells
                     if c.policy == policy and c.pending_per_device == pending)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{policy}, {pending} pending")
    ax.set_xscale("log", base=2)
    devices = sorted({c.devices for c in cells})
    ax.set_xticks(devices, [str(n) for n in devices])
    ax.set(yscale="log", xlabel="devices", ylabel="plan latency, median (ms)")
    ax.legend(fontsize=7)
    return fig


def render_scheduler(result: SchedulerResult) -> str:
    """The `scheduler` section of BENCHMARKS.md: targets, every cell."""
    return "\n\n".join([targets_table(scheduler_targets(result), "target (ett-stream)"),
                        table(["policy", "devices", "pending/device", "median ms", "p99 ms"],
                              [[c.policy, c.devices, c.pending_per_device, c.latency_ms_median, c.latency_ms_p99]
                               for c in result.cells])])


BENCH = Bench("scheduler", scheduler_command, SchedulerResult, render_scheduler, scheduler_targets, plot_scheduler,
              quick_args=("--repeats", "5"), timeout_s=300)
