"""`streamtrain bench ...`: every benchmark of the set, `bench all` and `bench report`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from .common import Bench, LaunchOptions, RunContext, stamp_context
from .registry import REGISTRY
from .report import refresh
from .suite import NOT_CHOSEN, choose, run_suite

__all__ = ["register", "with_context"]


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add every benchmark of `benchmarks.registry.REGISTRY`, `bench all` and `bench report` to `bench`."""
    del app
    for item in REGISTRY:
        bench.command(item.name)(with_context(item))
    bench.command("all")(run_all)
    bench.command("report")(report)


def with_context(bench: Bench[Any]) -> Callable[..., None]:
    """`bench`'s command, recording its measuring context (`RunContext`) into the JSON it writes in `--out DIR`.

    The context is taken as the command starts (commit, machine, load, date, command line) and stamped, with the
    load at the end, into `DIR/<name>.json` when the command has written it, whether it then succeeded or not.
    """

    @functools.wraps(bench.command)
    def command(*args: Any, **kwargs: Any) -> None:
        context = RunContext.begin()
        path = Path(kwargs.get("out") or ".") / bench.json_name
        before = path.stat().st_mtime_ns if path.is_file() else None
        try:
            bench.command(*args, **kwargs)
        finally:
            if path.is_file() and path.stat().st_mtime_ns != before:
                stamp_context(path, context)

    return command


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

    The set is `benchmarks.registry.REGISTRY` (kafka, ingest, bridge, scheduler, convergence, balance,
    realdata, truncation, soak). Each runs as its own `streamtrain bench <name> --out DIR` process, with the
    global --config/--set passed on, under a time limit; a failure is recorded in DIR/all.json and
    the others still run.
    """
    from streamtrain.cli_support import console, die

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
    from streamtrain.cli_support import console

    refresh(markdown, out or [Path("docs/bench")], console)
