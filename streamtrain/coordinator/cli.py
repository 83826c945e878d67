"""Commands of the coordinator service, added to the `streamtrain` CLI by `register`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from streamtrain.runtime.commands import EXIT_CONFIG, config_from, console, die, run_service

__all__ = ["coordinate", "register", "sim"]

_SIM_HELP = "\n\n".join((
    "Run planning policies on a simulated fleet and write DIR/sim.json and PNG plots.",
    "The policies are the coordinator's own functions (truncation, then the policy), fed by simulated buffers, "
    "stream arrivals and fitted performance models. Scenarios:",
    "[bold]stream[/]: 8 devices, half twice as fast, streams of 30-150 samples/s, 60 simulated seconds.",
    "[bold]table-iv[/]: CHRONICA Table IV — one epoch of 1500 samples per device, sizes normal with mean 45 and "
    "std DIF, clipped to >= 1 (which raises the mean to ~54 at DIF 64); sweep the imbalance with --dif 0 --dif 16 "
    "--dif 64 and compare epoch times (epoch_vs_dif.png). The count-based policies (static, lbbsp, lbb, scadles) "
    "run on a simulated dense-batch trainer that pads each batch to its largest sample, as the paper's baselines "
    "did; --padded none turns that off.",
    "[bold]lbb-disturbance[/]: LBB §4.4 — +50 ms on one device at a time, moving every 30 steps; the summary "
    "gives the steps until SE is back under 0.1 after each move.",
    "The simulated ranks hold a step's report until the plan's target when the plan took every pending sample, "
    "as live ranks do (streamtrain.pacing; at most trainer.hold_max_seconds; "
    "streamtrain --set trainer.hold_max_seconds=0 sim ... turns it off). Plans are made one step ahead, from the "
    "buffers less the running step's plan, as the live coordinator makes them "
    "(streamtrain --set coordinator.plan_ahead=0 sim ... plans after each step's results).",
    "Examples:\n\n"
    "  streamtrain sim --scenario table-iv -p static -p ett-stream --dif 0 --dif 16 --dif 64 --global-batch 64 "
    "--out out/t4\n\n"
    "  streamtrain sim --scenario stream --devices 2000 --duration 30 -p ett-stream --out out/big",
))


def _floats(text: str | None, name: str) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        die(f"{name} {text!r}: expected comma-separated numbers, e.g. 1,2", EXIT_CONFIG)
    if not values:
        die(f"{name} {text!r}: no values", EXIT_CONFIG)
    return values


def register(app: typer.Typer, bench: typer.Typer | None = None) -> None:
    """Add `sim` and `coordinate` to a command group (its benchmark, `bench scheduler`, is in `benchmarks`)."""
    del bench
    app.command("sim", help=_SIM_HELP)(sim)
    app.command("coordinate")(coordinate)


def _sim_policies(policy: list[str] | None, padded: str | None) -> tuple[list[str], tuple[str, ...] | None]:
    """The policies `sim` runs, and those whose simulated trainer pads (None: the scenario's); exits naming a
    policy there is not."""
    from .policies import POLICIES

    policies = policy or ["static", "ett-stream"]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        die(f"--policy {', '.join(unknown)}: unknown; choose from {', '.join(POLICIES)}", EXIT_CONFIG)
    if padded is None:
        return policies, None
    pad = tuple(p.strip() for p in padded.split(",") if p.strip() and p.strip() != "none")
    wrong = [p for p in pad if p not in POLICIES]
    if wrong:
        die(f"--padded {', '.join(wrong)}: unknown policy; choose from {', '.join(POLICIES)} or none", EXIT_CONFIG)
    return policies, pad


def _print_run(labels: dict[str, float], r: Any) -> None:
    s = r.summary
    line = (f"{r.policy}{''.join(f' {k}={v:g}' for k, v in labels.items())}: median step "
            f"{s['median_step_seconds']:.3f}s, median SE {s['median_straggler_effect']:.3f}, "
            f"{s['samples_per_second']:.0f} samples/s, backlog {s['final_backlog']}, truncated "
            f"{s['samples_truncated']}")
    if "epoch_seconds" in s:
        line += f", epoch {s['epoch_seconds']:.2f}s ({s['epoch_seconds_nominal']:.2f}s at the mean size asked)"
    if "disturbance_recovery_steps" in s:
        line += f", recovery ≤ {s['disturbance_recovery_steps']['max']} steps"
    console.print(line, highlight=False)


def sim(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="Directory for sim.json and plots.", metavar="DIR")] = Path(
        "sim-out"),
    scenario: Annotated[str, typer.Option(help="stream, table-iv or lbb-disturbance.")] = "stream",
    policy: Annotated[list[str] | None, typer.Option("--policy", "-p", help="Policy to run (repeatable); "
                      "default static and ett-stream.")] = None,
    devices: Annotated[int | None, typer.Option(min=1, help="Number of devices.")] = None,
    steps: Annotated[int | None, typer.Option(min=1, help="Most steps per run.")] = None,
    duration: Annotated[float | None, typer.Option(min=0.0, help="Simulated seconds per run.")] = None,
    dif: Annotated[list[float] | None, typer.Option(help="Sample-size std (repeatable: one run each).")] = None,
    speed: Annotated[str | None, typer.Option(help="Speed factors, cycled over devices, e.g. 1,2.")] = None,
    rate: Annotated[str | None, typer.Option(help="Arrival rates in samples/s, cycled, e.g. 30,90.")] = None,
    disturb_seconds: Annotated[float | None, typer.Option(min=0.0, help="Seconds added to one device at a "
                               "time (LBB disturbance).")] = None,
    seed: Annotated[int | None, typer.Option(help="Random seed of the workload.")] = None,
    padded: Annotated[str | None, typer.Option(help="Policies whose simulated trainer pads each batch to its "
                      "largest sample (comma-separated, or 'none'); default: the scenario's.")] = None,
    global_batch: Annotated[int | None, typer.Option(min=1, help="coordinator.global_batch.")] = None,
    series: Annotated[bool, typer.Option(help="Include per-step series in sim.json.")] = True,
) -> None:
    """Planning policies on a simulated fleet (the command's help is `_SIM_HELP`)."""
    full = config_from(ctx, {"coordinator.global_batch": global_batch})
    from rich.progress import Progress, TaskID

    from .sim import build_scenario, simulate
    from .sim.report import plot_runs, write_report

    policies, pad = _sim_policies(policy, padded)
    overrides = dict(padded=pad, hold_max_seconds=full.trainer.hold_max_seconds,
                     devices=devices, steps=steps, duration=duration, seed=seed,
                     disturb_seconds=disturb_seconds, speed=_floats(speed, "--speed"), rate=_floats(rate, "--rate"))
    difs: list[float | None] = list(dif) if dif else [None]
    try:
        grid = [build_scenario(scenario, **overrides, size_dif=d) for d in difs]
    except (ValueError, TypeError) as exc:
        die(f"scenario: {exc}", EXIT_CONFIG)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    with Progress(console=console, transient=True) as bar:
        for sc in grid:
            for name in policies:
                task = bar.add_task(f"{name} DIF {sc.size_dif:g}", total=1.0)

                def advance(done: float, task: TaskID = task) -> None:
                    bar.update(task, completed=done)

                result = simulate(sc, full.coordinator, name, progress=advance)
                bar.update(task, completed=1.0)
                runs.append(({"dif": sc.size_dif} if dif else {}, result))
    write_report(out / "sim.json", {"name": scenario, **{k: v for k, v in vars(grid[0]).items()
                                                         if k != "size_dif"}}, runs, series)
    plots = plot_runs(out, runs)
    for labels, r in runs:
        _print_run(labels, r)
    console.print(f"wrote {out / 'sim.json'} and {', '.join(str(p) for p in plots)}", highlight=False)


def coordinate(
    ctx: typer.Context,
    policy: Annotated[str | None, typer.Option(help="coordinator.policy: static, lbbsp, lbb, scadles, "
                                               "chronica or ett-stream.")] = None,
    truncation: Annotated[str | None, typer.Option(help="coordinator.truncation: persist, truncate or "
                                                   "bounded.")] = None,
    delete_records: Annotated[bool | None, typer.Option("--delete-records/--keep-records",
                                                        help="coordinator.delete_records.")] = None,
    delete_trained: Annotated[bool | None, typer.Option("--delete-trained/--keep-trained",
                                                        help="coordinator.delete_trained.")] = None,
    port: Annotated[int | None, typer.Option(help="metrics.port of /status and /metrics (0: any free).")] = None,
) -> None:
    """Run the coordinator: feedback and lag in, the next step's plan out, /status and /metrics served."""
    cfg = config_from(ctx, {"coordinator.policy": policy, "coordinator.truncation": truncation,
                            "coordinator.delete_records": delete_records,
                            "coordinator.delete_trained": delete_trained, "metrics.port": port})
    from .service import Coordinator

    service = Coordinator(cfg)
    run_service(service, cfg, lambda: f"coordinating job {cfg.job} ({cfg.coordinator.policy}, truncation "
                f"{cfg.coordinator.truncation}); status on http://{cfg.metrics.bind_address}:{service.port}/status")
