"""`streamtrain bench balance` and `streamtrain bench realdata`: every run one `live.run_stack_cell` on one shared
broker, read back from Kafka and timed to its target."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated

import typer

from streamtrain.config.coordinator import POLICY_NAMES

from ..common import External, LaunchOptions, Out, Seed, WorkDir, figure, problems, publish
from ..live import StackCell, live_broker, run_stack_cell
from .figures import BalanceResult, Curve, RealdataResult, judge_balance, judge_realdata, read_run
from .setup import DEFAULT_FLEETS, FLEETS, REALDATA_POLICIES, BalanceSetup, RealdataSetup, Run, fleet_label, parse_fleet

__all__ = ["balance_command", "realdata_command"]

Setup = BalanceSetup | RealdataSetup


def _run_plan(setup: Setup, tag: str, replay: dict[str, object] | None, runs: Path, launch: LaunchOptions,
              bootstrap: str | None) -> list[tuple[Run, Curve]]:
    """Run the setup's plan on one broker (embedded unless `bootstrap` names one), replaying the dataset of `replay`
    (its settings) or the setup's synthetic streams."""
    from streamtrain.runtime.commands import console

    plan, out = setup.plan(), []
    cfg = launch.config({"kafka.bootstrap_servers": bootstrap} if bootstrap else None)
    with live_broker(cfg, bootstrap is not None, tag) as broker:
        for i, cell in enumerate(plan):
            console.print(f"[{i + 1}/{len(plan)}] round {cell.repeat}: {cell.label} ...", highlight=False)
            name = (f"{i:02d}-{cell.policy}" + ("" if cell.dif is None else f"-dif{cell.dif:g}")
                    + f"-{fleet_label(cell.slowdowns, 'x')}")
            ran = run_stack_cell(StackCell(
                streams=setup.streams(cell), out=runs / name, tag=tag, index=i, policy=cell.policy,
                settings={**setup.settings_of(cell), **(replay or {})}, replay=replay is not None,
                backlog=setup.backlog_per_device, until_step=setup.until_step, seed=setup.seed,
                start_timeout_s=setup.start_timeout_s, extra_sets=setup.extra_sets), broker.kafka.bootstrap_servers,
                launch)
            run, curve = read_run(ran, cell, setup)
            out.append((run, curve))
            console.print(f"  [red]{run.error[:300]}" if run.error else
                          f"  step {figure(run.step_seconds_median, '.1f', 1e3)} ms, wall "
                          f"{figure(run.wall_step_seconds_median, '.1f', 1e3)} ms, SE "
                          f"{figure(run.straggler_effect_median, '.3f')}, {figure(run.samples_per_s, '.1f')} samples/s "
                          f"({run.seconds or 0:.0f} s)", highlight=False)
    return out


def _main(ctx: typer.Context, name: str, build: Callable[[], Setup], out: Path, work_dir: Path, external: bool) -> None:
    """Build the setup and run its plan (each run in WORK_DIR/<name>), time each run to its target, write
    DIR/<name>.json and .png; exit 2 when the setup is bad or its dataset has no held-out split, 1 when a run failed."""
    from streamtrain.runtime.commands import EXIT_CONFIG, config_from, die
    from streamtrain.stack.replay import resolve_replay

    from . import BALANCE, REALDATA

    bootstrap, launch = config_from(ctx).kafka.bootstrap_servers if external else None, LaunchOptions.of(ctx)
    replay: dict[str, object] | None = None
    try:
        setup = build()
        if isinstance(setup, RealdataSetup):
            resolved = resolve_replay(setup.dataset, launch.config(setup.settings_of(setup.cells()[0])))
            if resolved.held_out is None:
                raise ValueError(f"dataset {setup.dataset}: no held-out split to measure {setup.held_out_metric} on")
            replay = resolved.settings
    except ValueError as exc:
        die(f"bench {name}: {problems(exc)}", EXIT_CONFIG)
    began = time.monotonic()
    ran = _run_plan(setup, name, replay, work_dir / name, launch, bootstrap)
    settings = {**setup.settings_of(setup.cells()[0]), **(replay or {}), "trainer.slowdowns": "per cell",
                **launch.overrides()}
    done = {"setup": setup.model_copy(update={"settings": settings}), "seconds": round(time.monotonic() - began, 1)}
    result: BalanceResult | RealdataResult
    if isinstance(setup, BalanceSetup):
        judged, targets, rule = judge_balance(ran, setup)
        result = publish(BALANCE, BalanceResult.model_validate(
            {**done, "target_loss": targets, "target_loss_rule": rule, "runs": judged}), out)
    else:
        judged, target, rule = judge_realdata([run for run, _ in ran], setup)
        result = publish(REALDATA, RealdataResult.model_validate(
            {**done, "target": target, "target_rule": rule, "runs": judged}), out)
    if any(r.error for r in result.runs):
        raise typer.Exit(1)


def _fleets(named: Sequence[str], texts: Sequence[str], control: bool, quick: bool) -> tuple[tuple[float, ...], ...]:
    """The fleets of `--fleet` and `--slowdowns` (default `DEFAULT_FLEETS`, one-slow with --quick), and a control."""
    if unknown := sorted(set(named) - set(FLEETS)):
        raise ValueError(f"--fleet {', '.join(unknown)}: no such fleet (have: {', '.join(FLEETS)})")
    out = [FLEETS[name] for name in named] + [parse_fleet(text) for text in texts]
    out = out or [FLEETS[name] for name in (("one-slow",) if quick else DEFAULT_FLEETS)]
    return tuple(out + ([(1.0,) * len(out[0])] if control and (1.0,) * len(out[0]) not in out else []))


Policies = Annotated[list[str] | None, typer.Option("--policy", help="Policy to run (repeatable; default: all).")]
Steps = Annotated[int | None, typer.Option(min=2, help="Measured steps per run after the warm-up.")]
Warmup = Annotated[int | None, typer.Option(min=0, help="Warm-up steps left out of the step figures.")]
GlobalBatch = Annotated[int | None, typer.Option(min=4, help="coordinator.global_batch: samples per step, all ranks.")]
TimeScale = Annotated[float, typer.Option(min=1.0, help="Each rank computes this x its CPU time x its slow-down.")]
Control = Annotated[bool, typer.Option(help="Also run the homogeneous control (every factor 1): the oracle's base.")]


def balance_command(
    ctx: typer.Context,
    out: Out = Path("reports/bench"),
    work_dir: WorkDir = Path("reports/bench-runs"),
    quick: Annotated[bool, typer.Option(help="static, lbbsp, ett-stream; DIF 0,64; one-slow; 12 + 8 steps.")] = False,
    policy: Policies = None,
    fleet: Annotated[list[str] | None, typer.Option("--fleet", help="A named fleet (repeatable): " + ", ".join(
        f"{k} ({fleet_label(v)})" for k, v in FLEETS.items()) + f"; default {' and '.join(DEFAULT_FLEETS)}.")] = None,
    slowdowns: Annotated[list[str] | None, typer.Option("--slowdowns", help="A fleet's per-rank slow-down factors "
                                                        "(repeatable; besides --fleet).")] = None,
    control: Control = False,
    dif: Annotated[str | None, typer.Option(help="Comma-separated DIFs (sample sizes' std); default 0,16,64.")] = None,
    global_batch: GlobalBatch = None,
    steps: Steps = None,
    warmup: Warmup = None,
    model_window: Annotated[int, typer.Option(min=4, help="coordinator.model_window: records a time model fits.")] = 8,
    time_scale: TimeScale = 4.0,
    repeats: Annotated[int, typer.Option(min=1, help="Rounds of the whole matrix (each cell: the median).")] = 1,
    seed: Seed = 0,
    external: External = False,
) -> None:
    """Every planning policy on the live stack: 4 gloo ranks, fleets of slow-downs, DIF 0/16/64 (global batch 512, 24
    steps after 10 of warm-up unless set); ett-stream against the oracle (needs --control), static and chronica.
    Writes DIR/balance.json and DIR/balance.png; each run goes to WORK_DIR/balance.
    """
    _main(ctx, "balance", lambda: BalanceSetup(
        policies=tuple(policy or (("static", "lbbsp", "ett-stream") if quick else POLICY_NAMES)),
        slowdowns=_fleets(fleet or [], slowdowns or [], control, quick),
        difs=tuple(float(v) for v in dif.split(",")) if dif else ((0.0, 64.0) if quick else (0.0, 16.0, 64.0)),
        global_batch=global_batch or 512, time_scale=time_scale, model_window=model_window, repeats=repeats,
        steps=steps or (12 if quick else 24), warmup_steps=warmup if warmup is not None else (8 if quick else 10),
        seed=seed, quick=quick), out, work_dir, external)


def realdata_command(
    ctx: typer.Context,
    out: Out = Path("reports/bench"),
    work_dir: WorkDir = Path("reports/bench-runs"),
    quick: Annotated[bool, typer.Option(help="static, ett-stream and the control; one round; 15 + 3 steps.")] = False,
    policy: Policies = None,
    slowdowns: Annotated[str, typer.Option(help="Per-rank slow-down factors.")] = "1,1,1,4",
    dataset: Annotated[str, typer.Option(help="plaid (held-out accuracy), tecator or covid3month (RMSE).")] = "plaid",
    control: Control = True,
    repeats: Annotated[int | None, typer.Option(min=1, help="Rounds (default 3; 1 with --quick).")] = None,
    steps: Steps = None,
    warmup: Warmup = None,
    global_batch: GlobalBatch = None,
    eval_every: Annotated[int, typer.Option(min=1, help="trainer.eval_every: steps between evaluations.")] = 3,
    target_accuracy: Annotated[float | None, typer.Option(min=0.0, help="A fixed target of the held-out metric "
                                                          "(default: static's at mid-window).")] = None,
    time_scale: TimeScale = 4.0,
    seed: Seed = 0,
    external: External = False,
) -> None:
    """Time to a held-out accuracy (RMSE with --dataset tecator) on real data, per policy, one device of four 4x
    slower (global batch 64, 40 steps after 5 of warm-up unless set). Judged: ett-stream no later than the best other
    policy, >= 2x sooner than static, its step within 15% of the oracle. Writes DIR/realdata.json and .png.
    """
    _main(ctx, "realdata", lambda: RealdataSetup(
        policies=tuple(policy or (("static", "ett-stream") if quick else REALDATA_POLICIES)),
        dataset=dataset, slowdowns=parse_fleet(slowdowns), control=control, repeats=repeats or (1 if quick else 3),
        steps=steps or (15 if quick else 40), warmup_steps=warmup if warmup is not None else (3 if quick else 5),
        global_batch=global_batch or 64, eval_every=eval_every, target_accuracy=target_accuracy,
        time_scale=time_scale, seed=seed, quick=quick), out, work_dir, external)
