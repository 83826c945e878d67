"""`streamtrain bench all`: every benchmark of the set as its own process, within a budget, then the report."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from streamtrain.cli_support import CLI_MODULE

from .common import Bench, LaunchOptions
from .registry import REGISTRY
from .report import BenchRun, SuiteRuns

__all__ = ["NOT_CHOSEN", "choose", "run_suite"]

#: The status of a benchmark `--only` / `--skip` left out.
NOT_CHOSEN = "not run (--only/--skip)"


def choose(only: Sequence[str], skip: Sequence[str], benches: Sequence[Bench[Any]] = REGISTRY) -> list[Bench[Any]]:
    """The benchmarks `--only` and `--skip` leave, in registry order.

    Raises:
        ValueError: `--only` names a benchmark there is not.
    """
    unknown = sorted(set(only) - {b.name for b in benches})
    if unknown:
        raise ValueError(f"--only {', '.join(unknown)}: no such benchmark here (have: "
                         f"{', '.join(b.name for b in benches)})")
    return [b for b in benches if (not only or b.name in only) and b.name not in skip]


def _run(argv: Sequence[str], timeout_s: float) -> tuple[str, float]:
    """Run one benchmark process (its own session, so a timeout stops its children too; tied to this one, so it
    ends if this process is killed)."""
    from streamtrain.lifeline import tie_to_parent

    began = time.monotonic()
    proc = subprocess.Popen(tie_to_parent(list(argv)), start_new_session=True)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return f"timed out after {timeout_s:.0f} s", time.monotonic() - began
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        raise
    return ("ok" if code == 0 else f"failed (exit {code})"), time.monotonic() - began


def run_suite(chosen: Sequence[Bench[Any]], out: Path, quick: bool, budget_s: float, launch: LaunchOptions,
              say: Any, benches: Sequence[Bench[Any]] = REGISTRY) -> SuiteRuns:
    """Run each chosen benchmark as `streamtrain bench <name> --out OUT <its args>`, one after another, each
    under its own time limit and all within `budget_s`; write OUT/all.json.

    Args:
        chosen: the benchmarks to run.
        out: their --out directory.
        quick: pass each its quick arguments.
        budget_s: wall-clock budget for the whole set (a benchmark with under 30 s left is skipped).
        launch: the root options every benchmark process gets.
        say: a rich console.
        benches: the whole set (those not chosen are listed as not run).

    Returns:
        How each ended, in the set's order.
    """
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + budget_s
    results = {b.name: BenchRun(name=b.name, status=NOT_CHOSEN, seconds=0.0) for b in benches if b not in chosen}
    for i, bench in enumerate(chosen, 1):
        args = bench.quick_args if quick else bench.args
        argv = launch.command(CLI_MODULE, "bench", bench.name, "--out", str(out), *args)
        left = deadline - time.monotonic()
        say.rule(f"[bold][{i}/{len(chosen)}] streamtrain bench {bench.name} {' '.join(args)}")
        if left < 30:
            say.print(f"[yellow]skipped: {left:.0f} s of the {budget_s / 60:g}-minute budget left")
            results[bench.name] = BenchRun(name=bench.name, status="skipped", seconds=0.0)
            continue
        status, seconds = _run(argv, min(bench.timeout_s, left))
        results[bench.name] = BenchRun(name=bench.name, status=status, seconds=round(seconds, 1), argv=list(argv[3:]))
        colour = "green" if status == "ok" else "red"
        say.print(f"[{colour}]bench {bench.name}: {status} in {seconds:.0f} s")
    suite = SuiteRuns(quick=quick, runs=[results[b.name] for b in benches if b.name in results])
    suite.write(out / "all.json")
    return suite
