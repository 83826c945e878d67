"""The benchmark set: every `streamtrain bench <name>`, in the order `bench all` runs them.

A new benchmark is a module (or package) that defines its command, its typed result (a `common.Result`) and its
renderer, and a `BENCH = Bench(...)` naming them; listing that `BENCH` here adds it to the CLI, to `bench all`
and to `bench report`, and `bench` stamps its measuring context into its JSON. (The balance benchmark has two
workloads, so two: `balance.BALANCE` and `balance.REALDATA`.)
"""

from __future__ import annotations

from typing import Any

from . import balance, bridge, convergence, freshness, ingest, kafka, scheduler, soak, truncation
from .common import Bench

__all__ = ["REGISTRY", "bench_named"]

REGISTRY: tuple[Bench[Any], ...] = (
    kafka.BENCH,
    ingest.BENCH,
    bridge.BENCH,
    scheduler.BENCH,
    convergence.BENCH,
    balance.BALANCE,
    balance.REALDATA,
    truncation.BENCH,
    freshness.BENCH,
    soak.BENCH,
)


def bench_named(name: str) -> Bench[Any]:
    """The benchmark called `name`.

    Raises:
        KeyError: naming the benchmarks there are.
    """
    for bench in REGISTRY:
        if bench.name == name:
            return bench
    raise KeyError(f"no benchmark {name!r} (have: {', '.join(b.name for b in REGISTRY)})")
