"""`streamtrain bench ...`: every benchmark of the set (each recording its measuring context), `bench all` (the set,
each benchmark its own process, within a budget) and `bench report` (BENCHMARKS.md from the JSON)."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from streamtrain.runtime.commands import CLI_MODULE

from .common import Bench, LaunchOptions, RunContext
from .registry import REGISTRY
from .report import BenchRun, SuiteRuns, refresh

__all__ = ["NOT_CHOSEN", "choose", "register", "run_suite", "with_context"]

#: The status of a benchmark `--only` / `--skip` left out.
NOT_CHOSEN = "not run (--only/--skip)"


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add every benchmark of `benchmarks.registry.REGISTRY`, `bench all` and `bench report` to `bench`."""
    del app
    for item in REGISTRY:
        bench.command(item.name)(with_context(item))
    bench.command("all")(run_all)
    bench.command("report")(report)


def with_context(bench: Bench[Any]) -> Callable[..., None]:
    """`bench`'s command, stamping its measuring context (`RunContext`, taken as it starts) into the JSON it wrote
    in `--out DIR`, whether it then succeeded or not."""

    @functools.wraps(bench.command)
    def command(*args: Any, **kwargs: Any) -> None:
        context = RunContext.begin()
        path = Path(kwargs.get("out") or ".") / bench.json_name
        before = path.stat().st_mtime_ns if path.is_file() else None
        try:
            bench.command(*args, **kwargs)
        finally:
            if path.is_file() and path.stat().st_mtime_ns != before:
                context.stamp(path)

    return command


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
    """Run one benchmark process in its own session (a timeout stops its children too), tied to this one."""
    from streamtrain.runtime.lifeline import tie_to_parent

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
    """Run each chosen benchmark as `streamtrain bench <name> --out OUT <its args>`, one after another, each under
    its own time limit and all within `budget_s` (one with under 30 s left is skipped); write OUT/all.json.
    Returns how each ended, in the set's order (those not chosen listed as not run)."""
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
        say.print(f"[{'green' if status == 'ok' else 'red'}]bench {bench.name}: {status} in {seconds:.0f} s")
    suite = SuiteRuns(quick=quick, runs=[results[b.name] for b in benches if b.name in results])
    suite.write(out / "all.json")
    return suite


def run_all(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="Directory for the JSON files and PNG plots. The default is "
                                      "committed: BENCHMARKS.md links its plots.", metavar="DIR")] = Path("docs/bench"),
    quick: Annotated[bool, typer.Option(help="Short variants of every benchmark (a few minutes in all).")] = False,
    only: Annotated[list[str] | None, typer.Option("--only", help="Run just this benchmark (repeatable).")] = None,
    skip: Annotated[list[str] | None, typer.Option("--skip", help="Leave this benchmark out (repeatable).")] = None,
    markdown: Annotated[Path, typer.Option(help="Markdown file written whole.")] = Path("BENCHMARKS.md"),
    budget_minutes: Annotated[float, typer.Option(min=1, help="Wall-clock budget for the whole set.")] = 30.0,
) -> None:
    """Run every benchmark, then regenerate BENCHMARKS.md from their JSON.

    The set is `benchmarks.registry.REGISTRY`. Each runs as its own `streamtrain bench <name> --out DIR` process,
    with the global --config/--set passed on, under a time limit; a failure is recorded in DIR/all.json and the
    others still run.
    """
    from streamtrain.runtime.commands import console, die

    try:
        chosen = choose(only or [], skip or [])
    except ValueError as exc:
        die(str(exc))
    suite = run_suite(chosen, out, quick, budget_minutes * 60, LaunchOptions.of(ctx), console)
    console.rule("[bold]summary")
    for r in suite.runs:
        console.print(f"  {r.name:<12} {r.status:<22} {r.seconds:>7.0f} s", highlight=False)
    refresh(markdown, [out], console)
    if any(r.status not in ("ok", NOT_CHOSEN) for r in suite.runs):
        raise typer.Exit(1)


def report(
    out: Annotated[list[Path] | None, typer.Option(
        "--out", metavar="DIR",
        help="Directory of the JSON files (repeatable; the first holding a benchmark's file wins; default docs/bench).",
    )] = None,
    markdown: Annotated[Path, typer.Option(help="Markdown file written whole.")] = Path("BENCHMARKS.md"),
) -> None:
    """Regenerate BENCHMARKS.md from JSON files already measured (runs nothing).

    The whole file is generated: each benchmark's description (from its code), the context its figures were
    measured in, its tables, targets and plot. Plots are redrawn next to the JSON files.
    """
    from streamtrain.runtime.commands import console

    refresh(markdown, out or [Path("docs/bench")], console)
