"""Plan latency of the planning policies on synthetic fleets (`streamtrain bench scheduler`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from streamtrain.config import CoordinatorConfig

from .perfmodel import PerfModel
from .policies import Policy, plan_step, plan_with
from .policies.chronica import plan_chronica_reference
from .policies.ett_stream import plan_ett_stream_reference
from .state import DeviceState, PendingIndex, PlanningState

__all__ = ["REFERENCES", "measure_scheduler", "synthetic_state"]

GRID = ((8, 256), (8, 4096), (32, 256), (32, 4096), (128, 256), (128, 4096), (1024, 256), (1024, 4096))


def synthetic_state(devices: int, pending: int, seed: int = 0) -> PlanningState:
    """A backlogged fleet: speeds 1-4x, sizes lognormal (mean 45, std 32), streams at 50-150 samples/s."""
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


#: The straightforward implementations the fast paths replaced, timed by `--reference` as "<policy>@reference".
REFERENCES: dict[str, Policy] = {"ett-stream": plan_ett_stream_reference, "chronica": plan_chronica_reference}


def measure_scheduler(
    config: CoordinatorConfig,
    policies: tuple[str, ...] = ("ett-stream", "chronica"),
    repeats: int = 30,
    progress: Callable[[str], None] | None = None,
    reference: bool = False,
) -> list[dict[str, Any]]:
    """Median and p99 plan latency (ms) per policy and (devices, pending per device) cell.

    With `reference`, each policy that has one in `REFERENCES` is also timed through its reference
    implementation, interleaved with the fast one (same states, same moment), as "<policy>@reference".
    """
    cells = []
    names = [p for policy in policies for p in (policy, f"{policy}@reference")
             if p == policy or (reference and policy in REFERENCES)]
    for devices, pending in GRID:
        state = synthetic_state(devices, pending)
        # chronica packs a fixed global batch: about one step's worth of what the fleet buffers.
        cfg = config.model_copy(update={"global_batch": max(devices * 32, 1)})
        timings: dict[str, list[float]] = {name: [] for name in names}
        for r in range(repeats):
            for name in names:
                t0 = time.perf_counter()
                if name.endswith("@reference"):
                    plan_with(replace(state, step=r), cfg, REFERENCES[name.removesuffix("@reference")])
                else:
                    plan_step(replace(state, step=r), cfg, name)
                timings[name].append((time.perf_counter() - t0) * 1000.0)
        for policy in names:
            times = timings[policy]
            cell = {"policy": policy, "devices": devices, "pending_per_device": pending,
                    "latency_ms_median": float(np.median(times)), "latency_ms_p99": float(np.percentile(times, 99))}
            cells.append(cell)
            if progress is not None:
                progress(f"{policy:10s} {devices:5d} devices x {pending:5d} pending: "
                         f"median {cell['latency_ms_median']:.2f} ms, p99 {cell['latency_ms_p99']:.2f} ms")
    return cells
