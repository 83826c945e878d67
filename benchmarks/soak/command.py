"""`streamtrain bench soak`: the command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..common import LaunchOptions
from .results import MIB, SoakSample
from .setup import SoakSetup

__all__ = ["soak_command"]


def soak_command(
    ctx: typer.Context,
    minutes: Annotated[float, typer.Option(min=0.2, help="Length of the run (half truncate, half bounded). 2 is a "
                                           "smoke run; --minutes 30 is the real soak.")] = 2.0,
    out: Annotated[Path, typer.Option("--out", help="Directory for soak.json and soak.png.", metavar="DIR")
                   ] = Path("reports/bench"),
    devices: Annotated[int, typer.Option(min=1, max=256, help="Device streams.")] = 32,
    ranks: Annotated[int, typer.Option(min=0, max=32, help="Gloo ranks (one process each, ~0.5 GiB) training "
                                       "devices 0..R-1; the rest are consumed by truncation alone.")] = 4,
    producer_procs: Annotated[int, typer.Option(min=1, help="Producer processes sharing the streams.")] = 4,
    sample_every: Annotated[float, typer.Option(min=0.5, help="Seconds between samples.")] = 5.0,
    max_lag_samples: Annotated[int, typer.Option(min=1, help="bounded: coordinator.max_lag_samples.")] = 512,
    seed: Annotated[int, typer.Option(help="Seed of the stream rates and data.")] = 0,
    external: Annotated[bool, typer.Option(help="Use the configured Kafka (kafka.bootstrap_servers) instead of a "
                                           "private embedded broker (whose memory is then not measured).")] = False,
    work_dir: Annotated[Path, typer.Option(help="Service logs and checkpoints (WORK_DIR/soak).")
                        ] = Path("reports/bench-runs"),
    serve: Annotated[bool, typer.Option(help="Model versions every second and `serve` answering 20 requests/s "
                                        "with them, in the loop (needs --ranks >= 1).")] = False,
) -> None:
    """Soak: 32 streams at ScaDLES S2 rates through the stack; memory, retained records and lag must stay bounded.

    Producers, a coordinator (truncate for the first half, then restarted with bounded) with
    DeleteRecords, and --ranks gloo ranks; the streams without a rank are consumed by truncation
    alone. Samples RSS of every process (/proc), records retained per topic and lag every
    --sample-every seconds, and judges boundedness on slopes over the second half of each phase.
    Writes DIR/soak.json and DIR/soak.png; logs in WORK_DIR/soak/logs. Exit 1 when something grew.
    """
    from streamtrain.cli_support import config_from, console, die

    from .run import run_soak

    cfg = config_from(ctx)
    if ranks > devices:
        die(f"--ranks {ranks} is more than --devices {devices}", 2)
    setup = SoakSetup(minutes=minutes, devices=devices, ranks=ranks, producer_procs=producer_procs,
                      sample_every_s=sample_every, max_lag_samples=max_lag_samples, seed=seed,
                      work_dir=work_dir / "soak", serve=serve and ranks > 0)

    def progress(t: float, total: float, phase: str, sample: SoakSample) -> None:
        rss = sum(sample.rss.values()) / MIB
        console.print(f"{t:4.0f}/{total:.0f}s {phase:<8} retained {sum(sample.retained.values()):>7,} "
                      f"lag {sum(sample.lag.values()):>7,} RSS {rss:5.0f} MiB ({len(sample.rss)} procs)",
                      highlight=False, soft_wrap=True)

    try:
        result = run_soak(cfg, setup, out, external, LaunchOptions.of(ctx), progress)
    except RuntimeError as exc:
        die(str(exc))
    for name, p in sorted(result.processes.items()):
        console.print(f"  {name:<18} peak {p.peak_rss_mb:8.1f} MiB  slope {p.slope_mb_per_min_second_half} "
                      f"MiB/min", highlight=False)
    for phase in result.phases:
        console.print(f"  {phase.truncation:<9} retained peak {phase.retained_records_peak:,}, slope "
                      f"{phase.retained_slope_records_per_min_second_half}/min; lag peak {phase.lag_records_peak:,}",
                      highlight=False)
    bounded = result.bounded
    verdicts = {"memory": bounded.memory, "retained_records": bounded.retained_records, "lag": bounded.lag}
    verdict = ", ".join(f"{k} {'bounded' if ok else 'NOT bounded'}" for k, ok in verdicts.items())
    console.print(f"{verdict}; wrote {out / 'soak.json'} and {out / 'soak.png'}", highlight=False, soft_wrap=True)
    if result.failures:  # a verdict is a finding (it is in the JSON); a service that failed is an error
        console.print(f"[red]failures: {'; '.join(result.failures)}")
        raise typer.Exit(1)
