"""`streamtrain bench convergence | all | report`: the cross-service benchmarks and `BENCHMARKS.md`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["register"]

_OUT_HELP = "Directory for the JSON files and PNG plots."


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add `bench convergence`, `bench all` and `bench report` to the benchmarks."""
    del app
    bench.command("convergence")(convergence)
    bench.command("report")(report)
    from .soak import soak_command
    from .truncation import truncation_command

    bench.command("truncation")(truncation_command)
    bench.command("soak")(soak_command)
    from .balance import balance_command

    bench.command("balance")(balance_command)

    @bench.command("all")
    def run_all(
        ctx: typer.Context,
        out: Annotated[Path, typer.Option("--out", help=_OUT_HELP + " The default is committed: BENCHMARKS.md "
                                          "links its plots.", metavar="DIR")] = Path("docs/bench"),
        quick: Annotated[bool, typer.Option(help="Short variants of every benchmark (a few minutes in all).")] = False,
        only: Annotated[list[str] | None, typer.Option("--only", help="Run just this benchmark (repeatable).")] = None,
        skip: Annotated[list[str] | None, typer.Option("--skip", help="Leave this benchmark out (repeatable).")] = None,
        markdown: Annotated[Path, typer.Option(help="Markdown file whose bench sections are refreshed.")] = Path(
            "BENCHMARKS.md"),
        budget_minutes: Annotated[float, typer.Option(min=1, help="Wall-clock budget for the whole set.")] = 30.0,
    ) -> None:
        """Run every benchmark that exists, then refresh the tables and plots in BENCHMARKS.md.

        The set is `benchmarks.registry.REGISTRY` (kafka, ingest, scheduler, convergence, and
        balance / truncation / soak once those commands exist). Each runs as its own
        `streamtrain bench <name> --out DIR` process, with the global --config/--set passed on, under
        a time limit; a failure is recorded in DIR/all.json and the others still run.
        """
        from streamtrain.cli_support import CLI_MODULE, console, die, module_command

        from .registry import available, command_names

        root_opts = _root_options(ctx)
        benches = available(command_names(bench))
        unknown = sorted(set(only or []) - {b.name for b in benches})
        if unknown:
            die(f"--only {', '.join(unknown)}: no such benchmark here (have: {', '.join(b.name for b in benches)})")
        chosen = [b for b in benches if (not only or b.name in only) and b.name not in (skip or [])]
        out.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + budget_minutes * 60
        results: list[dict[str, Any]] = [{"name": b.name, "status": "not run (--only/--skip)", "seconds": 0.0}
                                         for b in benches if b not in chosen]
        benches = chosen
        for i, item in enumerate(benches, 1):
            args = item.quick_args if quick else item.args
            argv = list(module_command(CLI_MODULE, "bench", item.name, "--out", str(out), *args, global_args=root_opts))
            left = deadline - time.monotonic()
            console.rule(f"[bold][{i}/{len(benches)}] streamtrain bench {item.name} {' '.join(args)}")
            if left < 30:
                console.print(f"[yellow]skipped: {left:.0f} s of the {budget_minutes:g}-minute budget left")
                results.append({"name": item.name, "status": "skipped", "seconds": 0.0})
                continue
            status, seconds = _run(argv, min(item.timeout_s, left))
            results.append({"name": item.name, "status": status, "seconds": round(seconds, 1), "argv": argv[3:]})
            colour = "green" if status == "ok" else "red"
            console.print(f"[{colour}]bench {item.name}: {status} in {seconds:.0f} s")
        order = {b.name: i for i, b in enumerate(available(command_names(bench)))}
        results.sort(key=lambda r: order.get(r["name"], len(order)))
        (out / "all.json").write_text(json.dumps({"quick": quick, "runs": results}, indent=1) + "\n")
        console.rule("[bold]summary")
        for r in results:
            console.print(f"  {r['name']:<12} {r['status']:<22} {r['seconds']:>7.0f} s", highlight=False)
        _refresh(markdown, [out], console)
        if any(r["status"] not in ("ok", "not run (--only/--skip)") for r in results):
            raise typer.Exit(1)


def _root_options(ctx: typer.Context) -> list[str]:
    from streamtrain.cli_support import GlobalOptions

    opts = ctx.find_root().obj
    argv: list[str] = []
    if isinstance(opts, GlobalOptions):
        if opts.config_file:
            argv += ["--config", opts.config_file]
        for assignment in opts.sets:
            argv += ["--set", assignment]
    return argv


def _run(argv: list[str], timeout_s: float) -> tuple[str, float]:
    """Run one benchmark process (its own session, so a timeout stops its children too; tied to this one, so it
    ends if this process is killed)."""
    from streamtrain.lifeline import tie_to_parent

    began = time.monotonic()
    proc = subprocess.Popen(tie_to_parent(argv), start_new_session=True)
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


def _refresh(markdown: Path, data_dirs: list[Path], console: Any) -> None:
    from .registry import marker_names, refresh_markdown, render_sections

    if not markdown.is_file():
        console.print(f"[yellow]{markdown} does not exist: nothing to refresh")
        return
    sections = render_sections(data_dirs, markdown.parent)
    text = markdown.read_text()
    new, missing = refresh_markdown(text, sections)
    if new != text:
        markdown.write_text(new)
    console.print(f"refreshed {', '.join(sorted(set(sections) - set(missing))) or 'no'} section(s) of {markdown}"
                  f" from {', '.join(str(d) for d in data_dirs)}", highlight=False)
    for name in missing:
        console.print(f"[yellow]{markdown} has no <!-- bench:{name} --> section; {name} was not written")
    stale = [n for n in marker_names(text) if n not in sections]
    if stale:
        console.print(f"kept as they were (no JSON found): {', '.join(stale)}", highlight=False)


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

    _refresh(markdown, out or [Path("docs/bench")], console)


def convergence(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help=_OUT_HELP, metavar="DIR")] = Path("reports/bench"),
    quick: Annotated[bool, typer.Option(help="Fewer steps and a smaller held-out set (about half the time).")
                     ] = False,
    steps: Annotated[int | None, typer.Option(min=1, help="Steps per cell (default 200; 100 with --quick).")] = None,
    target: Annotated[float | None, typer.Option(min=0.01, max=0.99, help="Held-out accuracy to reach.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the stream, the split and the model.")] = 0,
) -> None:
    """Weighted vs plain gradient aggregation with uneven batches, against single-process SGD.

    Three cells train the trainer's own model, packing, step runner and DDP hook on the same
    non-IID synthetic stream in the same order: `sgd` (one process, the union of every step),
    `weighted` (4 gloo ranks, λ = samples) and `plain` (4 gloo ranks, conventional averaging).
    Per-rank batches are deliberately uneven, with idle ranks. Writes DIR/convergence.json
    (samples to the target accuracy, ratio to SGD, curves) and DIR/convergence.png.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from streamtrain.cli_support import config_from, console

    from .convergence import AGGREGATIONS, ConvergenceSetup, run_convergence

    config_from(ctx)
    base = ConvergenceSetup(seed=seed)
    setup = ConvergenceSetup(
        seed=seed,
        steps=steps or (100 if quick else base.steps),
        heldout=1000 if quick else base.heldout,
        target_accuracy=target or base.target_accuracy,
        extra={"quick": quick},
    )
    columns = (TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("samples {task.fields[samples]:>6,}  held-out acc {task.fields[acc]:.3f}"),
               TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        tasks: dict[str, TaskID] = {name: bar.add_task(name, total=setup.steps, samples=0, acc=0.0,
                                                             start=False)
                                    for name in AGGREGATIONS}

        def progress(cell: str, step: int, total: int, samples: int, accuracy: float) -> None:
            if step == 1:
                bar.start_task(tasks[cell])
            bar.update(tasks[cell], completed=step, samples=samples, acc=accuracy)

        doc = run_convergence(setup, out, progress)
    for cell in doc["cells"]:
        reached = (f"target at {cell['samples_to_target']:,} samples ({cell['ratio_to_sgd']}x SGD)"
                   if cell["samples_to_target"] is not None else "target not reached")
        console.print(f"{cell['aggregation']:<9} {reached}; final accuracy {cell['final_accuracy']:.3f}",
                      highlight=False)
    console.print(f"weighted vs SGD parameters: max |diff| {doc['weighted_vs_sgd_max_param_diff']:.1e}; "
                  f"wrote {out / 'convergence.json'} and {out / 'convergence.png'} in {doc['seconds']:.0f} s",
                  highlight=False)
