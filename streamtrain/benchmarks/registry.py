"""The benchmark set: every `streamtrain bench <name>`, in the order `bench all` runs them.

A benchmark is a module defining its command, its typed result (a `common.Result`), its renderer and a
`BENCH = Bench(...)` naming them; listing it here adds it to the CLI, to `bench all` and to `bench report`.
"""

from __future__ import annotations

from typing import Any

from . import balance, bridge, convergence, freshness, ingest, overhead, quality, scheduler, soak, truncation
from .common import Bench

__all__ = ["REGISTRY"]

REGISTRY: tuple[Bench[Any], ...] = (ingest.BENCH, bridge.BENCH, scheduler.BENCH, convergence.BENCH,
                                    balance.BALANCE, balance.REALDATA, overhead.BENCH, truncation.BENCH,
                                    freshness.BENCH, soak.BENCH, quality.BENCH)
