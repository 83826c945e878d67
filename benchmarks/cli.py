"""`streamtrain bench ...`: every benchmark of the set, `bench all` and `bench report`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import LaunchOptions
from .registry import REGISTRY
from .report import refresh
from .suite import NOT_CHOSEN, choose, run_suite

__all__ = ["register"]


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add every benchmark of `benchmarks.registry.REGISTRY`, `bench all` and `bench report` to `bench`."""
    del app
    for item in REGISTRY:
        bench.command(item.name)(item.command)
    bench.command("all")(run_all)
    bench.command("report")(report)


def run_all(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="Directory for the JSON files and PNG plots. The default is "
                                      "committed: BENCHMARKS.md links its plots.", metavar="DIR")] = Path("docs/bench"),
    quick: Annotated[bool, typer.Option(help="Short variants of every benchmark (a few minutes in all).")] = False,
    only: Annotated[list[str] | None, typer.Option("--only", help="Run just this benchmark (repeatable).")] = None,
    skip: Annotated[list[str] | None, typer.Option("--skip", help="Leave this benchmark out (repeatable).")] = None,
    markdown: Annotated[Path, typer.Option(help="Markdown file whose bench sections are refreshed.")] = Path(
        "BENCHMARKS.md"),
    budget_minutes: Annotated[float, typer.Option(min=1, help="Wall-clock budget for the whole set.")] = 30.0,
) -> None:
    """Run every benchmark, then refresh the tables and plots in BENCHMARKS.md.

    The set is `benchmarks.registry.REGISTRY` (kafka, ingest, bridge, scheduler, convergence, balance,
    truncation, soak). Each runs as its own `streamtrain bench <name> --out DIR` process, with the
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
    markdown: Annotated[Path, typer.Option(help="Markdown file whose bench sections are refreshed.")] = Path(
        "BENCHMARKS.md"),
) -> None:
    """Refresh the generated sections of BENCHMARKS.md from JSON files already measured (runs nothing).

    Only the text between <!-- bench:NAME --> and <!-- /bench:NAME --> is rewritten; prose around it
    stays. Plots are redrawn next to the JSON files.
    """
    from streamtrain.cli_support import console

    refresh(markdown, out or [Path("docs/bench")], console)
