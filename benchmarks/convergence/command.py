"""`streamtrain bench convergence`: the command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .setup import AGGREGATIONS, ConvergenceSetup

__all__ = ["convergence_command"]


def convergence_command(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="Directory for the JSON file and PNG plot.", metavar="DIR")
                   ] = Path("reports/bench"),
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

    from .run import run_convergence

    config_from(ctx)
    base = ConvergenceSetup(seed=seed)
    setup = ConvergenceSetup(seed=seed, steps=steps or (100 if quick else base.steps),
                             heldout=1000 if quick else base.heldout,
                             target_accuracy=target or base.target_accuracy, quick=quick)
    columns = (TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("samples {task.fields[samples]:>6,}  held-out acc {task.fields[acc]:.3f}"),
               TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        tasks: dict[str, TaskID] = {name: bar.add_task(name, total=setup.steps, samples=0, acc=0.0, start=False)
                                    for name in AGGREGATIONS}

        def progress(cell: str, step: int, total: int, samples: int, accuracy: float) -> None:
            if step == 1:
                bar.start_task(tasks[cell])
            bar.update(tasks[cell], completed=step, samples=samples, acc=accuracy)

        result = run_convergence(setup, out, progress)
    for cell in result.cells:
        reached = (f"target at {cell.samples_to_target:,} samples ({cell.ratio_to_sgd}x SGD)"
                   if cell.samples_to_target is not None else "target not reached")
        console.print(f"{cell.aggregation:<9} {reached}; final accuracy {cell.final_accuracy:.3f}", highlight=False)
    console.print(f"weighted vs SGD parameters: max |diff| {result.weighted_vs_sgd_max_param_diff:.1e}; "
                  f"wrote {out / 'convergence.json'} and {out / 'convergence.png'} in {result.seconds:.0f} s",
                  highlight=False)
