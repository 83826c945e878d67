"""`streamtrain bench balance` and `streamtrain bench realdata`: the balance benchmark's two workloads' commands
(flags → setup, live progress, the targets at the end)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from streamtrain.config.coordinator import POLICY_NAMES

from ..common import LaunchOptions, Target, figure, problems, progress_bars, target_lines
from .render import balance_targets, realdata_targets
from .results import CellResult, RunResult
from .run import CellProgress
from .setup import (
    DEFAULT_FLEETS,
    FLEETS,
    REALDATA_POLICIES,
    BalanceSetup,
    RealdataSetup,
    fleet_label,
    parse_fleet,
)

__all__ = ["balance_command", "realdata_command"]


def _default(setup: type[Any], name: str) -> Any:
    return setup.model_fields[name].default


_BALANCE, _REALDATA = BalanceSetup, RealdataSetup
_TimeScale = Annotated[float, typer.Option(min=1.0, help="Every rank computes this many times its CPU time (slow-downs "
                                           "multiply on top), so 4 ranks fit on 2 cores without contending.")]
_External = Annotated[bool, typer.Option(help="Use the Kafka at kafka.bootstrap_servers instead of one embedded "
                                         "broker for the whole benchmark.")]


@contextlib.contextmanager
def _progress(cells: int, until: int) -> Iterator[CellProgress]:
    """Two bars: the cells done, and the running cell's steps with its phase."""
    with progress_bars(["cells", "cell"], cells, "{task.fields[phase]}", width=44, phase="") as update:
        def progress(i: int, n: int, label: str, step: int, until: int, phase: str) -> None:
            update("cells", i, total=n)
            update("cell", min(step, until), total=until, description=label, phase=phase[:40])

        yield progress


def _summary(targets: Sequence[Target], path: Path, seconds: float) -> None:
    from streamtrain.cli_support import console

    for line in target_lines(targets):
        console.print(line, highlight=False, soft_wrap=True)
    console.print(f"wrote {path} and {path.with_suffix('.png')} in {seconds:.0f} s", highlight=False)


def _fleets(named: Sequence[str], texts: Sequence[str], control: bool,
            default: Sequence[str] = DEFAULT_FLEETS) -> tuple[tuple[float, ...], ...]:
    """The fleets of `--fleet` and `--slowdowns` (default `DEFAULT_FLEETS`), plus an all-equal control."""
    unknown = sorted(set(named) - set(FLEETS))
    if unknown:
        raise ValueError(f"--fleet {', '.join(unknown)}: no such fleet (have: {', '.join(FLEETS)})")
    out = [FLEETS[name] for name in named]
    out += [parse_fleet(text) for text in texts]
    out = out or [FLEETS[name] for name in default]
    if control and (1.0,) * len(out[0]) not in out:
        out.append((1.0,) * len(out[0]))
    return tuple(out)


def balance_command(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="Directory for balance.json and balance.png.", metavar="DIR")
                   ] = Path("reports/bench"),
    runs: Annotated[Path, typer.Option("--runs", help="Directory of each cell's run (report.json, series.json, "
                                       "plots, logs); kept out of --out, which may be committed.", metavar="DIR")
                    ] = Path("reports/balance-runs"),
    quick: Annotated[bool, typer.Option(help="static, lbbsp and ett-stream at DIF 0 and 64 on the one-slow fleet "
                                        "with fewer steps (about 4 minutes).")] = False,
    policy: Annotated[list[str] | None, typer.Option("--policy", help="Policy to run (repeatable; default all "
                                                     "six).")] = None,
    fleet: Annotated[list[str] | None, typer.Option("--fleet", help="A named fleet of slow-downs (repeatable): "
                                                    + ", ".join(f"{k} ({fleet_label(v)})" for k, v in FLEETS.items())
                                                    + f"; default {' and '.join(DEFAULT_FLEETS)}.")] = None,
    slowdowns: Annotated[list[str] | None, typer.Option("--slowdowns", help="Per-rank slow-down factors, one "
                                                        "list per set (repeatable; instead of or besides "
                                                        "--fleet).")] = None,
    control: Annotated[bool, typer.Option(help="Also run static at slow-downs 1,1,1,1, DIF 0: identical batches on "
                                          "identical ranks, whose straggler effect is the machine's noise floor (a "
                                          "control with no heterogeneity).")] = False,
    dif: Annotated[str | None, typer.Option(help="DIF values (std of sample sizes), comma-separated (default "
                                            "0,16,64).")] = None,
    global_batch: Annotated[int, typer.Option(min=4, help="coordinator.global_batch: samples per step over "
                                              "all ranks.")] = _default(_BALANCE, "global_batch"),
    steps: Annotated[int | None, typer.Option(min=2, help="Measured steps per cell (default 24; 12 with "
                                              "--quick).")] = None,
    warmup: Annotated[int | None, typer.Option(min=0, help="Warm-up steps left out of the figures (default 10; "
                                               "8 with --quick).")] = None,
    model_window: Annotated[int, typer.Option(min=4, help="coordinator.model_window: feedback records each device's "
                                              "time model is fitted on.")] = _default(_BALANCE, "model_window"),
    time_scale: _TimeScale = _default(_BALANCE, "time_scale"),
    repeats: Annotated[int, typer.Option(min=1, help="Run the whole matrix this many times; each cell reports the "
                                         "median over its runs (and the runs themselves).")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the data (every cell of a DIF trains the same samples) and "
                                      "the model.")] = 0,
    external: _External = False,
) -> None:
    """Every planning policy on the live stack: 4 gloo ranks, emulated fleets of slow-downs, DIF 0/16/64.

    Per cell: step time, wall period and its split on the critical path, straggler effect, work rate, time to a
    target loss, over a window under a backlog; per fleet and DIF, ett-stream against the oracle (needs
    --control), static and chronica. Writes DIR/balance.json and DIR/balance.png; each cell's run goes to --runs.
    """
    from streamtrain.cli_support import EXIT_CONFIG, config_from, console, die

    from .run import run_balance

    cfg = config_from(ctx)
    try:
        difs = tuple(float(v) for v in dif.split(",")) if dif else ((0.0, 64.0) if quick else (0.0, 16.0, 64.0))
        setup = BalanceSetup(policies=tuple(policy or (("static", "lbbsp", "ett-stream") if quick else POLICY_NAMES)),
                             slowdowns=_fleets(fleet or [], slowdowns or [], control,
                                               ("one-slow",) if quick else DEFAULT_FLEETS), difs=difs,
                             global_batch=global_batch, time_scale=time_scale, model_window=model_window,
                             repeats=repeats, steps=steps or (12 if quick else 24),
                             warmup_steps=warmup if warmup is not None else (8 if quick else 10), seed=seed,
                             quick=quick)
    except ValueError as exc:
        die(f"bench balance: {problems(exc)}", EXIT_CONFIG)
    cells = setup.cells()
    if control:
        # The control: identical ranks, identical batches (static at the smallest DIF).
        cells = [c for c in cells if len(set(c.slowdowns)) > 1 or (c.dif == min(setup.difs) and c.policy == "static")]
    console.print(f"{len(cells)} cells{f' x {repeats} runs' if repeats > 1 else ''}: {', '.join(setup.policies)} "
                  f"x slow-downs {' / '.join(fleet_label(s) for s in setup.slowdowns)} x DIF "
                  f"{', '.join(f'{d:g}' for d in setup.difs)}; global batch {setup.global_batch}, "
                  f"{setup.warmup_steps} + {setup.steps} steps, backlog {setup.backlog_per_device:,} samples per "
                  "device", highlight=False)

    def done(c: CellResult) -> None:
        console.print(f"[red]{c.policy} DIF {c.dif:g}: {c.error[:300]}" if c.error else
                      f"{c.policy:<11} slow-downs {fleet_label(c.slowdowns)} DIF {c.dif:>3g}: step "
                      f"{figure(c.step_seconds_median, '7.1f', 1e3, '-')} ms, SE "
                      f"{figure(c.straggler_effect_median, '.3f', missing='-')}, "
                      f"{figure(c.samples_per_s, '7.1f', missing='-')} samples/s ({c.seconds or 0:.0f} s)",
                      highlight=False)

    with _progress(len(cells) * repeats, setup.until_step) as progress:
        result = run_balance(setup, out, LaunchOptions.of(ctx), progress,
                             bootstrap=cfg.kafka.bootstrap_servers if external else None, cells=cells, on_cell=done,
                             runs=runs)
    _summary(balance_targets(result), out / "balance.json", result.seconds)
    if any(c.error for c in result.cells):
        raise typer.Exit(1)


def realdata_command(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="Directory for realdata.json and realdata.png.", metavar="DIR")
                   ] = Path("reports/bench"),
    runs: Annotated[Path, typer.Option("--runs", help="Directory of each run's report, series, plots and logs; kept "
                                       "out of --out, which may be committed.", metavar="DIR")
                    ] = Path("reports/realdata-runs"),
    quick: Annotated[bool, typer.Option(help="static and ett-stream plus the control, one round, a short window: "
                                        "proves it works (about 4 minutes), measures little.")] = False,
    policy: Annotated[list[str] | None, typer.Option("--policy", help="Policy to compare (repeatable; default "
                                                     + ", ".join(REALDATA_POLICIES) + "). static is needed unless "
                                                     "--target-accuracy is given.")] = None,
    slowdowns: Annotated[str, typer.Option(help="Per-rank slow-down factors (one per rank).")] = "1,1,1,4",
    control: Annotated[bool, typer.Option(help="Run the homogeneous control (ett-stream, every factor 1) each "
                                          "round: its step time gives the oracle.")] = True,
    repeats: Annotated[int | None, typer.Option(min=1, help="Rounds of every cell, the order rotated each round "
                                                "(default 3; 1 with --quick).")] = None,
    steps: Annotated[int | None, typer.Option(min=2, help="Measured steps per run after the warm-up (default 40; "
                                              "15 with --quick).")] = None,
    warmup: Annotated[int | None, typer.Option(min=0, help="Warm-up steps left out of the step-time figures "
                                               "(default 5; 3 with --quick).")] = None,
    global_batch: Annotated[int, typer.Option(min=4, help="coordinator.global_batch: samples per step over all "
                                              "ranks.")] = _default(_REALDATA, "global_batch"),
    eval_every: Annotated[int, typer.Option(min=1, help="trainer.eval_every: steps between held-out "
                                            "evaluations.")] = _default(_REALDATA, "eval_every"),
    target_accuracy: Annotated[float | None, typer.Option(min=0.0, max=1.0, help="A fixed target accuracy instead "
                                                          "of static's at mid-window.")] = None,
    time_scale: _TimeScale = _default(_REALDATA, "time_scale"),
    seed: Annotated[int, typer.Option(help="Seed of the shards' order and of the model.")] = 0,
    external: _External = False,
) -> None:
    """Time to a held-out accuracy on real data (PLAID), per policy, with one device four times slower.

    Judged: ett-stream reaches static's mid-window accuracy no later than the best other policy and >= 2x sooner
    than static, and its step time is within 15% of the oracle (the control x n / sum(1/s_i)). Writes
    DIR/realdata.json and DIR/realdata.png. Example: streamtrain bench realdata --quick --out /tmp/rd
    """
    from streamtrain.cli_support import EXIT_CONFIG, config_from, console, die

    from .run import run_realdata

    cfg = config_from(ctx)
    try:
        setup = RealdataSetup(
            policies=tuple(policy or (("static", "ett-stream") if quick else REALDATA_POLICIES)),
            slowdowns=parse_fleet(slowdowns), control=control,
            repeats=repeats or (1 if quick else _default(_REALDATA, "repeats")),
            steps=steps or (15 if quick else 40), warmup_steps=warmup if warmup is not None else (3 if quick else 5),
            global_batch=global_batch, eval_every=eval_every, target_accuracy=target_accuracy, time_scale=time_scale,
            seed=seed, quick=quick)
    except ValueError as exc:
        die(f"bench realdata: {problems(exc)}", EXIT_CONFIG)
    cells = setup.cells()
    console.print(f"{len(cells)} cells x {setup.repeats} rounds: {', '.join(c.label for c in cells)}; global batch "
                  f"{setup.global_batch}, {setup.warmup_steps} + {setup.steps} steps, held-out every "
                  f"{setup.eval_every}, backlog {setup.backlog_per_device:,} samples per device", highlight=False)

    def done(run: RunResult) -> None:
        last = run.accuracy[-1] if run.accuracy else None
        console.print(f"[red]{run.policy} round {run.repeat}: {run.error[:300]}" if run.error else
                      f"round {run.repeat} {run.policy:<11}{' (control)' if run.control else '':<10} step "
                      f"{(run.wall_period_seconds_median or 0) * 1e3:6.0f} ms, SE "
                      f"{run.straggler_effect_median or 0:.3f}, "
                      f"accuracy {last.accuracy if last else 0:.3f} at {last.seconds if last else 0:.1f} s of "
                      f"training ({run.seconds or 0:.0f} s in all)", highlight=False)

    with _progress(len(cells) * setup.repeats, setup.until_step) as progress:
        try:
            result = run_realdata(setup, out, LaunchOptions.of(ctx), progress,
                                  bootstrap=cfg.kafka.bootstrap_servers if external else None, on_run=done, runs=runs)
        except ValueError as exc:
            die(f"bench realdata: {exc}", EXIT_CONFIG)
    _summary(realdata_targets(result), out / "realdata.json", result.seconds)
    if any(r.error for r in result.runs):
        raise typer.Exit(1)
