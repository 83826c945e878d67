"""`streamtrain bench truncation`: the command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..common import LaunchOptions, num
from .setup import POLICIES, TruncationSetup

__all__ = ["truncation_command"]


def truncation_command(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="Directory for truncation.json and truncation.png.",
                                      metavar="DIR")] = Path("reports/bench"),
    quick: Annotated[bool, typer.Option(help="2 devices and 100 steps per policy (about a minute and a half).")
                     ] = False,
    steps: Annotated[int | None, typer.Option(min=5, help="Steps per policy (default 400; 100 with --quick).")] = None,
    devices: Annotated[int | None, typer.Option(min=1, max=16, help="Device streams, one gloo rank each "
                                                "(default 4; 2 with --quick).")] = None,
    b_max: Annotated[int, typer.Option(min=1, help="coordinator.b_max: most samples per device per step "
                                       "(what makes the streams outrun training).")] = 12,
    max_lag_samples: Annotated[int, typer.Option(min=1, help="bounded: coordinator.max_lag_samples.")] = 512,
    policy: Annotated[list[str] | None, typer.Option("--policy", help="Truncation policy to run (repeatable; "
                                                     "default all three).")] = None,
    planner: Annotated[str, typer.Option(help="coordinator.policy that plans the batches.")] = "scadles",
    seed: Annotated[int, typer.Option(help="Seed of the stream rates, the data and the model.")] = 0,
    external: Annotated[bool, typer.Option(help="Use the configured Kafka (kafka.bootstrap_servers) instead of a "
                                           "private embedded broker.")] = False,
    work_dir: Annotated[Path, typer.Option(help="Service logs and checkpoints (WORK_DIR/truncation/<policy>).")
                        ] = Path("reports/bench-runs"),
) -> None:
    """Records retained under persist, truncate and bounded when ScaDLES S2 streams outrun training.

    For each policy, on the same seeds and data: producers at S2 rates, a coordinator with that
    truncation (DeleteRecords on for truncate and bounded) and one gloo rank per device, for N
    steps. Reports the records each device topic retains on the broker (high watermark - log start
    offset) and the trainer buffer depth over steps, the ratio persist/policy after N steps, and the
    held-out accuracy of the final model. Writes DIR/truncation.json and DIR/truncation.png; service
    logs go to WORK_DIR/truncation/<policy>/logs.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from streamtrain.cli_support import config_from, console, die

    from .run import run_truncation

    cfg = config_from(ctx)
    chosen = tuple(policy or POLICIES)
    unknown = sorted(set(chosen) - set(POLICIES))
    if unknown:
        die(f"--policy {', '.join(unknown)}: not a truncation policy (have: {', '.join(POLICIES)})", 2)
    setup = TruncationSetup(devices=devices or (2 if quick else 4), steps=steps or (100 if quick else 400),
                            seed=seed, b_max=b_max, max_lag_samples=max_lag_samples, planner=planner,
                            policies=chosen, work_dir=work_dir / "truncation", quick=quick)
    columns = (TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("broker retains {task.fields[retained]:>8,}  buffers {task.fields[depth]:>6,}"),
               TimeElapsedColumn())
    try:
        with Progress(*columns, console=console) as bar:
            tasks: dict[str, TaskID] = {p: bar.add_task(p, total=setup.steps, retained=0, depth=0, start=False)
                                        for p in chosen}

            def progress(name: str, step: int, total: int, retained: int, depth: int) -> None:
                bar.start_task(tasks[name])
                bar.update(tasks[name], completed=min(step, total), retained=retained, depth=depth)

            result = run_truncation(cfg, setup, out, external, LaunchOptions.of(ctx), progress)
    except RuntimeError as exc:
        die(str(exc))
    for cell in result.cells:
        console.print(f"{cell.policy:<9} retains {cell.retained_records_final:>9,} records "
                      f"(ratio to persist {num(cell.retained_ratio_to_persist, 1)}), buffer "
                      f"{cell.buffer_depth_final:,}, truncated {cell.truncated:,}, held-out accuracy "
                      f"{num(cell.accuracy, 3)}", highlight=False)
    console.print(f"wrote {out / 'truncation.json'} and {out / 'truncation.png'} in {result.seconds:.0f} s",
                  highlight=False)
