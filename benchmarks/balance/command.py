"""`streamtrain bench balance`: the command (flags → setup, live progress, the summary table)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from streamtrain.config.coordinator import POLICY_NAMES

from ..common import LaunchOptions
from .render import SPLIT_KEY, backlog_text, figure, split_text, target_lines
from .results import BalanceResult, CellResult
from .setup import DEFAULT_FLEETS, FLEETS, BalanceCell, BalanceSetup, fleet_label

__all__ = ["balance_command"]


def _default(name: str) -> Any:
    return BalanceSetup.model_fields[name].default


def _fleets(named: Sequence[str], texts: Sequence[str], control: bool,
            default: Sequence[str] = DEFAULT_FLEETS) -> tuple[tuple[float, ...], ...]:
    """The fleets of `--fleet` and `--slowdowns` (default `DEFAULT_FLEETS`), plus an all-equal control."""
    unknown = sorted(set(named) - set(FLEETS))
    if unknown:
        raise ValueError(f"--fleet {', '.join(unknown)}: no such fleet (have: {', '.join(FLEETS)})")
    out = [FLEETS[name] for name in named]
    for text in texts:
        try:
            out.append(tuple(float(v) for v in text.replace(" ", "").split(",") if v))
        except ValueError:
            raise ValueError(f"--slowdowns {text!r}: expected comma-separated factors, e.g. 1,1,1,4") from None
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
                                              "all ranks.")] = _default("global_batch"),
    steps: Annotated[int | None, typer.Option(min=2, help="Measured steps per cell (default 24; 12 with "
                                              "--quick).")] = None,
    warmup: Annotated[int | None, typer.Option(min=0, help="Warm-up steps left out of the figures (default 10; "
                                               "8 with --quick).")] = None,
    model_window: Annotated[int, typer.Option(min=4, help="coordinator.model_window: feedback records each "
                                              "device's time model is fitted on.")] = _default("model_window"),
    time_scale: Annotated[float, typer.Option(min=1.0, help="Every rank computes this many times its CPU time "
                                              "(slow-downs multiply on top), so 4 ranks fit on 2 cores without "
                                              "contending.")] = _default("time_scale"),
    repeats: Annotated[int, typer.Option(min=1, help="Run the whole matrix this many times; each cell reports the "
                                         "median over its runs (and the runs themselves).")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the data (every cell of a DIF trains the same samples) and "
                                      "the model.")] = 0,
    external: Annotated[bool, typer.Option(help="Use the Kafka at kafka.bootstrap_servers instead of one "
                                           "embedded broker for the whole benchmark.")] = False,
) -> None:
    """Every planning policy on the live stack: 4 gloo ranks, emulated fleets of slow-downs, DIF 0/16/64.

    Each cell runs the coordinator with one policy and `streamtrain train --local-ranks 4` on the real
    broker. Rank r sleeps (factor_r - 1) x its measured compute after every step (trainer.slowdowns), so
    1,1,1,4 is three devices and one four times slower. Sample sizes are normal with mean 45 and
    std = DIF (lognormal where a normal that never goes below 1 cannot have that std). Before the services
    start, each device topic gets the same pre-produced backlog (same seed for every cell), so step time
    reflects the plan, not the arrival rate; every policy plans the same global batch per step.

    Per cell: median step time (slowest rank, emulated sleep included), median wall period and its split
    (compute, communication, plan wait, data wait, hold) on the critical path, median straggler effect
    (LBB Eq. 4 on compute seconds), samples/s, seconds to a target loss (what static reaches mid-window),
    and whether every device still had samples waiting at every step of the window (a drained backlog is
    flagged), over a fixed window after the warm-up. Per fleet and DIF: ett-stream's wall period against
    the oracle (the control's period x n / sum(1 / s_i); needs --control), static and chronica. Writes
    DIR/balance.json ({"cells": [...]}, the targets) and DIR/balance.png; each cell's report, series,
    plots and logs go to --runs.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from streamtrain.cli_support import EXIT_CONFIG, config_from, console, die

    from .run import run_balance

    cfg = config_from(ctx)
    try:
        difs = tuple(float(v) for v in dif.split(",")) if dif else ((0.0, 64.0) if quick else (0.0, 16.0, 64.0))
    except ValueError:
        die(f"--dif {dif!r}: expected comma-separated numbers, e.g. 0,16,64", EXIT_CONFIG)
    try:
        setup = BalanceSetup(policies=tuple(policy or (("static", "lbbsp", "ett-stream") if quick else POLICY_NAMES)),
                             slowdowns=_fleets(fleet or [], slowdowns or [], control,
                                                       ("one-slow",) if quick else DEFAULT_FLEETS), difs=difs,
                             global_batch=global_batch, time_scale=time_scale, model_window=model_window,
                             repeats=repeats, steps=steps or (12 if quick else 24),
                             warmup_steps=warmup if warmup is not None else (8 if quick else 10), seed=seed,
                             quick=quick)
    except ValueError as exc:
        die(str(exc), EXIT_CONFIG)
    cells = setup.cells()
    if control:
        # The control: identical ranks, identical batches (static at the smallest DIF).
        cells = [c for c in cells if len(set(c.slowdowns)) > 1 or (c.dif == min(setup.difs) and c.policy == "static")]
    console.print(f"{len(cells)} cells{f' x {repeats} runs' if repeats > 1 else ''}: {', '.join(setup.policies)} "
                  f"x slow-downs {' / '.join(fleet_label(s) for s in setup.slowdowns)} x DIF "
                  f"{', '.join(f'{d:g}' for d in setup.difs)}; global batch {setup.global_batch}, "
                  f"{setup.warmup_steps} + {setup.steps} steps, backlog {setup.backlog_per_device:,} samples per "
                  "device", highlight=False)
    columns = (TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[phase]}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        overall = bar.add_task("cells", total=len(cells) * repeats, phase="")
        current = bar.add_task("", total=setup.until_step, phase="")

        def progress(i: int, n: int, cell: BalanceCell, step: int, until: int, phase: str) -> None:
            bar.update(overall, completed=i)
            bar.update(current, description=cell.label, completed=min(step, until), total=until,
                       phase=phase[:40])

        def done(result: CellResult) -> None:
            if result.error:
                bar.console.print(f"[red]{result.policy} DIF {result.dif:g}: {result.error[:300]}")
                return
            bar.console.print(
                f"{result.policy:<11} slow-downs {fleet_label(result.slowdowns)} DIF {result.dif:>3g}: step "
                f"{figure(result.step_seconds_median, '7.1f', 1e3, '-')} ms, SE "
                f"{figure(result.straggler_effect_median, '.3f', missing='-')}, "
                f"{figure(result.samples_per_s, '7.1f', missing='-')} samples/s ({result.seconds or 0:.0f} s)",
                highlight=False)

        result = run_balance(setup, out, LaunchOptions.of(ctx), progress,
                             bootstrap=cfg.kafka.bootstrap_servers if external else None, cells=cells, on_cell=done,
                             runs=runs)
    _summary(result, out, console)
    if any(c.error for c in result.cells):
        raise typer.Exit(1)


def _summary(result: BalanceResult, out: Path, console: Any) -> None:
    from rich.table import Table

    table = Table(title=f"bench balance — {out / 'balance.json'}")
    for col in ("policy", "slow-downs", "DIF", "step ms", "wall ms", "split ms", "SE", "samples/s", "work/s",
                "size", "s to target", "lost", "backlog"):
        table.add_column(col, justify="right")
    for c in result.cells:
        table.add_row(c.policy, fleet_label(c.slowdowns), f"{c.dif:g}",
                      figure(c.step_seconds_median, ".1f", 1e3, "-"),
                      figure(c.wall_step_seconds_median, ".1f", 1e3, "-"), split_text(c, "-"),
                      figure(c.straggler_effect_median, ".3f", missing="-"),
                      figure(c.samples_per_s, ".1f", missing="-"), figure(c.size_per_s, ".0f", missing="-"),
                      figure(c.trained_size_mean, ".1f", missing="-"),
                      figure(c.seconds_to_target_loss, ".1f", missing="-"),
                      "-" if c.samples_lost is None else str(c.samples_lost), backlog_text(c))
    console.print(table)
    console.print(f"split ms: {SPLIT_KEY}", highlight=False)
    for line in target_lines(result):
        console.print(line, highlight=False)
    console.print(f"wrote {out / 'balance.json'} and {out / 'balance.png'} in {result.seconds:.0f} s",
                  highlight=False)
