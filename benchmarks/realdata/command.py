"""`streamtrain bench realdata`: the command (flags → setup, live progress, the summary)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ..common import LaunchOptions, problems
from .results import RealdataResult, RunResult
from .setup import DEFAULT_POLICIES, RealdataCell, RealdataSetup

__all__ = ["realdata_command"]


def _default(name: str) -> Any:
    return RealdataSetup.model_fields[name].default


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
                                                     + ", ".join(DEFAULT_POLICIES) + "). static is needed unless "
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
                                              "ranks.")] = _default("global_batch"),
    eval_every: Annotated[int, typer.Option(min=1, help="trainer.eval_every: steps between held-out "
                                            "evaluations.")] = _default("eval_every"),
    target_accuracy: Annotated[float | None, typer.Option(min=0.0, max=1.0, help="A fixed target accuracy instead "
                                                          "of static's at mid-window.")] = None,
    time_scale: Annotated[float, typer.Option(min=1.0, help="Every rank computes this many times its CPU time "
                                              "(slow-downs multiply on top), so 4 ranks fit on 2 cores without "
                                              "contending.")] = _default("time_scale"),
    seed: Annotated[int, typer.Option(help="Seed of the shards' order and of the model.")] = 0,
    external: Annotated[bool, typer.Option(help="Use the Kafka at kafka.bootstrap_servers instead of one "
                                           "embedded broker for the whole benchmark.")] = False,
) -> None:
    """Time to a held-out accuracy on real data (PLAID), per policy, with one device four times slower.

    PLAID (appliance current series of 100 to 1,344 values, 11 classes; the `plaid` extra installs it) is
    replayed into four device topics from a backlog: every device has work waiting for the whole window, so
    step time is the plan's, not the stream's. Four gloo ranks train the `seq` model; rank r computes
    time_scale x factor_r x its CPU time (trainer.slowdowns on the CPU clock). Every policy plans the same
    global batch per step; the trainers evaluate on PLAID's test split every --eval-every steps.

    Per run: training seconds (evaluation pauses left out) until the held-out accuracy (trailing mean of two
    evaluations) reaches the target; the median step time (wall period between step completions); the
    straggler effect. The target is static's accuracy at mid-window (median over its runs) unless
    --target-accuracy fixes it. The control (ett-stream on equal ranks) gives the oracle step time,
    control x n / sum(1/s_i). Judged: ett-stream reaches the target no later than the best other policy and
    >= 2x sooner than static, and its step time is within 15% of the oracle.

    Writes DIR/realdata.json and DIR/realdata.png; `streamtrain bench report` puts them in BENCHMARKS.md.

    Example: streamtrain bench realdata --quick --out /tmp/rd
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from streamtrain.cli_support import EXIT_CONFIG, config_from, console, die

    from .run import run_realdata

    cfg = config_from(ctx)
    try:
        factors = tuple(float(v) for v in slowdowns.replace(" ", "").split(",") if v)
    except ValueError:
        die(f"--slowdowns {slowdowns!r}: expected comma-separated factors, e.g. 1,1,1,4", EXIT_CONFIG)
    try:
        setup = RealdataSetup(
            policies=tuple(policy or (("static", "ett-stream") if quick else DEFAULT_POLICIES)),
            slowdowns=factors, control=control,
            repeats=repeats or (1 if quick else _default("repeats")), steps=steps or (15 if quick else 40),
            warmup_steps=warmup if warmup is not None else (3 if quick else 5), global_batch=global_batch,
            eval_every=eval_every, target_accuracy=target_accuracy, time_scale=time_scale, seed=seed, quick=quick)
    except ValueError as exc:
        die(f"bench realdata: {problems(exc)}", EXIT_CONFIG)
    cells = setup.cells()
    console.print(f"{len(cells)} cells x {setup.repeats} rounds: {', '.join(c.label for c in cells)}; global batch "
                  f"{setup.global_batch}, {setup.warmup_steps} + {setup.steps} steps, held-out every "
                  f"{setup.eval_every}, backlog {setup.backlog_per_device:,} samples per device", highlight=False)
    columns = (TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[phase]}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        overall = bar.add_task("runs", total=len(cells) * setup.repeats, phase="")
        current = bar.add_task("", total=setup.until_step, phase="")

        def progress(i: int, n: int, cell: RealdataCell, step: int, until: int, phase: str) -> None:
            bar.update(overall, completed=i)
            bar.update(current, description=cell.label, completed=min(step, until), total=until, phase=phase[:40])

        def done(run: RunResult) -> None:
            if run.error:
                bar.console.print(f"[red]{run.policy} round {run.repeat}: {run.error[:300]}")
                return
            last = run.accuracy[-1] if run.accuracy else None
            bar.console.print(
                f"round {run.repeat} {run.policy:<11}{' (control)' if run.control else '':<10} step "
                f"{(run.wall_period_seconds_median or 0) * 1e3:6.0f} ms, SE {run.straggler_effect_median or 0:.3f}, "
                f"accuracy {last.accuracy if last else 0:.3f} at {last.seconds if last else 0:.1f} s of training "
                f"({run.seconds or 0:.0f} s in all)", highlight=False)

        try:
            result = run_realdata(setup, out, LaunchOptions.of(ctx), progress,
                                  bootstrap=cfg.kafka.bootstrap_servers if external else None, on_run=done, runs=runs)
        except ValueError as exc:
            die(f"bench realdata: {exc}", EXIT_CONFIG)
    _summary(result, out, console)
    if any(r.error for r in result.runs):
        raise typer.Exit(1)


def _summary(result: RealdataResult, out: Path, console: Any) -> None:
    from rich.table import Table

    from ..balance.render import figure

    table = Table(title=f"bench realdata — {out / 'realdata.json'}")
    for col in ("policy", "s to target", "each run", "step ms", "SE", "final accuracy", "unaccounted"):
        table.add_column(col, justify="right")
    for p in result.policies:
        table.add_row(p.policy + (" (control)" if p.control else ""), figure(p.seconds_to_target, ".1f", missing="-"),
                      " / ".join(figure(v, ".1f", missing="never") for v in p.seconds_to_target_runs),
                      figure(p.wall_period_seconds_median, ".0f", 1e3, "-"),
                      figure(p.straggler_effect_median, ".3f", missing="-"),
                      figure(p.final_accuracy, ".3f", missing="-"),
                      str(p.samples_unaccounted))
    console.print(table)
    t = result.targets
    console.print(f"target accuracy {figure(t.target_accuracy, '.3f', missing='-')} ({t.target_rule})",
                  highlight=False)
    console.print(f"ett-stream no later than the best other policy ({t.best_other_policy}): "
                  f"{t.no_later_than_best_met}; "
                  f"{figure(t.speedup_vs_static, '.2f', missing='-')}x sooner than static (target >= 2: "
                  f"{t.speedup_met}; a perfect split from step 0: "
                  f"{figure(t.oracle_speedup_vs_static, '.2f', missing='-')}x); "
                  f"step {figure(t.over_oracle, '.2f', missing='-')}x the oracle "
                  f"{figure(t.oracle_step_seconds, '.0f', 1e3, '-')} ms (target <= 1.15: {t.oracle_met}"
                  + ("; not judged: the control ran slower than the heterogeneous fleet" if t.oracle_is_bound is False
                     else "") + ")",
                  highlight=False)
    console.print(f"wrote {out / 'realdata.json'} and {out / 'realdata.png'} in {result.seconds:.0f} s",
                  highlight=False)
