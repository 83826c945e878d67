"""The balance benchmark's two sections of BENCHMARKS.md (`balance`, `realdata`): their targets (the same lines on
the console after a run), tables and plots, all computed from the stored runs (`figures`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from coordinator.balance import straggler_effect
from stack.report import median
from streamtrain.config.coordinator import POLICY_NAMES

from ..common import TIMES, Target, figure, pyplot, table, targets_table
from .figures import BalanceResult, RealdataResult, Run, combine, comparisons, control_cell, ratio, realdata_figures
from .setup import fleet_label

__all__ = ["balance_targets", "plot_balance", "plot_realdata", "realdata_targets", "render_balance",
           "render_realdata", "target_cells"]

#: The parts of the wall period `split_text` shows, in its order, and what its numbers are.
_SPLIT_SHOWN = ("compute", "communication", "plan_wait", "data_wait", "hold")
SPLIT_KEY = ("compute / communication / plan wait / data wait / hold, ms: medians over the window, each read from "
             "the rank with the largest compute (the critical path); the rest of the wall period is commits, "
             "feedback and scheduling")


def split_text(run: Run) -> str:
    split = run.step_period_split_median
    return "/".join(f"{split.get(p, 0.0) * 1e3:.{0 if p == 'compute' else 1}f}" for p in _SPLIT_SHOWN) if split else "—"


def backlog_text(run: Run) -> str:
    """`held`, or the measured steps at which some device's buffer was empty."""
    if run.backlog_held is None:
        return "—"
    return "held" if run.backlog_held else "drained at step " + ",".join(str(s) for s in run.backlog_drained_steps)


#: The columns of the balance section's table of every cell: each its header and its text from the cell's figures.
_CELL_COLUMNS: tuple[tuple[str, Callable[[Run], str]], ...] = (
    ("policy", lambda f: f.policy), ("slow-downs", lambda f: fleet_label(f.slowdowns)), ("DIF", lambda f: f"{f.dif:g}"),
    ("step ms (median)", lambda f: figure(f.step_seconds_median, ".1f", 1e3)),
    ("wall step ms", lambda f: figure(f.wall_step_seconds_median, ".1f", 1e3)),
    ("plan wait ms", lambda f: figure(f.plan_wait_seconds_median, ".2f", 1e3)), ("split ms", split_text),
    ("SE (median)", lambda f: figure(f.straggler_effect_median, ".3f")),
    ("samples/s", lambda f: figure(f.samples_per_s, ".0f")), ("work/s (size)", lambda f: figure(f.size_per_s, ".0f")),
    ("mean size trained", lambda f: figure(f.trained_size_mean, ".1f")),
    ("s to target loss", lambda f: figure(f.seconds_to_target, ".1f")),
    ("lost samples", lambda f: "error" if f.error else str(f.samples_unaccounted)), ("backlog", backlog_text))


def _s(value: float | None, never: str = "never") -> str:
    return never if value is None else f"{value:.1f} s"


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1e3:.1f} ms"


def _where(items: list[str], kind: str = "not") -> str:
    return "every cell" if not items else f"{kind} in " + "; ".join(items)


def _known(flags: list[bool | None]) -> bool | None:
    return all(known) if (known := [f for f in flags if f is not None]) else None


def target_cells(result: BalanceResult) -> tuple[tuple[float, ...], float, Run | None, Run | None]:
    """Where the speed-up and SE targets are judged — the first heterogeneous fleet at the largest DIF — and the
    ett-stream and static cells there."""
    setup = result.setup
    hetero = next((s for s in setup.slowdowns if len(set(s)) > 1), setup.slowdowns[0])
    cells = {c.fig.policy: c.fig for c in combine(result.runs) if (c.fig.slowdowns, c.fig.dif) == (hetero, max(
        setup.difs)) and c.fig.step_seconds_median}
    return hetero, max(setup.difs), cells.get("ett-stream"), cells.get("static")


def balance_targets(result: BalanceResult) -> list[Target]:
    """The synthetic workload's targets: plan wait, speed-up over static, the oracle, the target loss, SE, work."""
    cells, per_cell = combine(result.runs), comparisons(result.runs, result.setup)
    _, _, ett, static = target_cells(result)
    at = {id(p): f"slow-downs {fleet_label(p.slowdowns)} DIF {p.dif:g}" for p in per_cell}
    control = control_cell(cells)
    floor = next((c.fig.straggler_effect_median for c in cells if c.fig.control and c.fig.policy == "static"
                  and c.fig.straggler_effect_median is not None), None)
    medians = [v for v in (ett.rank_compute_seconds_median.values() if ett else []) if v]
    waits = [w for c in cells if (w := c.fig.plan_wait_seconds_median) is not None]
    se = ett.straggler_effect_median if ett else None
    wall = ratio(static.wall_step_seconds_median, ett.wall_step_seconds_median) if ett and static else None
    step = ratio(static.step_seconds_median, ett.step_seconds_median) if ett and static else None
    work = ratio(ett.step_size_median, static.step_size_median) if ett and static else None
    judged = wall if wall is not None else step
    return [
        Target("median plan wait on the critical path ≤ 2 ms in every cell (under a backlog)",
               f"at most {_ms(max(waits) if waits else None)}", max(waits) <= 0.002 if waits else None, "—"),
        Target(f"`ett-stream` ≥ 2.5{TIMES} faster than `static` (median wall period)",
               "—" if wall is None else f"{_ms(static.wall_step_seconds_median if static else None)} → "
               f"{_ms(ett.wall_step_seconds_median if ett else None)} = {wall:.2f}{TIMES}"
               + ("" if step is None else f"; per step (slowest rank) {step:.2f}{TIMES}")
               + ("" if work is None else f" (ett-stream's step holds {work:.2f}{TIMES} static's work)"),
               None if judged is None else judged >= 2.5,
               f"LBB Table 2: 392.9 → 104.9 ms (3.75{TIMES}); CHRONICA Table IV: 578 → 247 s (2.34{TIMES})"),
        Target("`ett-stream`'s wall period within 5% of the oracle at DIF 0, 10% with varying sizes, in every cell",
               _where([f"{at[id(p)]}: {p.over_oracle:.3f}{TIMES}" for p in per_cell
                       if p.within_oracle is False and p.over_oracle is not None])
               + f" (oracle: the control's {_ms(control.wall_step_seconds_median if control else None)} {TIMES} n / "
               "Σ 1/s_i)", _known([p.within_oracle for p in per_cell]), "—"),
        Target("`ett-stream` reaches the target loss no later than `chronica` in every cell (medians)",
               _where([f"{at[id(p)]}: {_s(p.ett_stream_seconds_to_target)} vs {_s(p.chronica_seconds_to_target)}"
                       for p in per_cell if p.target_no_later_than_chronica is False]),
               _known([p.target_no_later_than_chronica for p in per_cell]), "—"),
        Target("median straggler effect ≤ 0.10 (per step: (max - min) / mean of the ranks' compute)",
               "—" if se is None else f"{se:.3f}" + (f" (noise floor: {floor:.3f}, the control's identical ranks on "
                                                     "identical batches)" if floor is not None else ""),
               None if se is None else se <= 0.10, "LBB Table 2 reports averages, not per-step SE"),
        Target("(for the paper's figure) SE of the ranks' median compute over the window",
               figure(straggler_effect(medians) if len(medians) > 1 else None, ".3f"), None,
               "LBB Table 2: per-worker compute 103.5-104.9 ms after balancing, SE ≈ 0.013"),
        Target("`ett-stream` best or within 5% of the best policy (work rate: sample size trained per second) in "
               "every cell", _where([f"{at[id(p)]}: best {p.best_policy} {p.best_over_ett_stream:.2f}{TIMES} "
                                     "ett-stream's work rate" for p in per_cell if p.best_over_ett_stream > 1.05]),
               all(p.best_over_ett_stream <= 1.05 for p in per_cell) if per_cell else None, "—"),
        Target("every measured window ends before any device's backlog drains (buffer depth > 0 after every step)",
               _where([f"{c.fig.policy} slow-downs {fleet_label(c.fig.slowdowns)} DIF {c.fig.dif:g}" for c in cells
                       if c.fig.backlog_held is False], "drained"),
               _known([c.fig.backlog_held for c in cells if not c.fig.error]), "—"),
    ]


def plot_balance(result: BalanceResult) -> Any:
    """Wall period (with the fleet's oracle) and straggler effect (log scale) per policy vs DIF, one column per
    heterogeneous fleet; the control (every factor equal) is drawn as the machine's noise floor."""
    cells = [c.fig for c in combine(result.runs) if c.fig.step_seconds_median is not None]
    if not cells:
        raise ValueError("no measured cells to plot")
    controls = [c for c in cells if c.control]
    slows = (sorted({c.slowdowns for c in cells if not c.control}, key=lambda s: -max(s))
             or sorted({c.slowdowns for c in cells}))
    oracles = {p.slowdowns: p.oracle_wall_seconds for p in comparisons(result.runs, result.setup)}
    fig, axes = pyplot().subplots(2, len(slows), figsize=(6.0 * len(slows), 6.4), squeeze=False)
    for col, slow in enumerate(slows):
        period, se = axes[0][col], axes[1][col]
        for policy in [p for p in POLICY_NAMES if any(c.policy == p for c in cells)]:
            pts = sorted((c.dif or 0.0, (c.wall_step_seconds_median or c.step_seconds_median or 0.0) * 1e3,
                          c.straggler_effect_median) for c in cells if c.policy == policy and c.slowdowns == slow)
            style = {"linewidth": 2.5, "color": "black"} if policy == "ett-stream" else {"alpha": 0.8}
            period.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=policy, **style)
            se.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", **style)
        if oracle := oracles.get(slow):
            period.axhline(oracle * 1e3, color="green", linestyle=":", linewidth=1,
                           label=f"oracle (control {TIMES} n / Σ 1/s_i)")
        period.set(title=f"slow-downs {fleet_label(slow)}", ylabel="wall period, median (ms)", ylim=(0, None))
        se.axhline(0.10, color="green", linestyle=":", linewidth=1, label="SE 0.10 target")
        for control in controls if slow not in {c.slowdowns for c in controls} else ():
            se.axhline(control.straggler_effect_median or 0.0, color="grey", linestyle="--", linewidth=1,
                       label=f"noise floor ({control.policy}, equal ranks, DIF {control.dif:g})")
        se.set(xlabel="DIF (std of sample sizes)", ylabel="straggler effect, median (log)", yscale="log")
        difs = sorted({c.dif or 0.0 for c in cells if c.slowdowns == slow})
        for ax in (period, se):
            ax.set_xticks(difs)
            if len(difs) == 1:
                ax.set_xlim(difs[0] - 10, difs[0] + 10)
        se.legend(fontsize=7, loc="center right")
    axes[0][0].legend(fontsize=7, loc="center right")
    setup = result.setup
    fig.suptitle(f"{setup.devices} gloo ranks, global batch {setup.global_batch}, "
                 f"{setup.steps} measured steps after {setup.warmup_steps} warm-up", fontsize=9)
    return fig


def render_balance(result: BalanceResult) -> str:
    """The `balance` section of BENCHMARKS.md: setup, targets, ett-stream per cell, the full table."""
    setup = result.setup
    repeated = setup.repeats > 1
    fleet, dif, _, _ = target_cells(result)
    per_cell = [[fleet_label(p.slowdowns), f"{p.dif:g}", figure(p.ett_stream_wall_seconds, ".1f", 1e3),
                 figure(p.oracle_wall_seconds, ".1f", 1e3), figure(p.over_oracle, ".3f"),
                 " / ".join(f"{v:.2f}" for v in p.over_oracle_runs) or "—", f"{p.tolerance:.0%}",
                 figure(p.wall_speedup_vs_static, ".2f"), _s(p.ett_stream_seconds_to_target),
                 _s(p.chronica_seconds_to_target), {None: "—", True: "held", False: "drained"}[p.backlog_held]]
                for p in comparisons(result.runs, setup)]
    rows = [[text(c.fig) for _, text in _CELL_COLUMNS]
            + ([" / ".join(figure(r.step_seconds_median, ".0f", 1e3) for r in c.runs)] if repeated else [])
            for c in combine(result.runs)]
    return "\n\n".join([
        f"Setup: {setup.devices} gloo ranks on the CPU, each computing {setup.time_scale:g}{TIMES} its "
        f"training thread's CPU time {TIMES} its slow-down factor, global batch {setup.global_batch}, "
        f"{setup.warmup_steps} warm-up + {setup.steps} measured steps per cell"
        + (f", the whole matrix run {setup.repeats} times one after another (each figure: the median over "
           "a cell's runs)" if repeated else "") + ", sizes mean "
        f"{setup.size_mean:g} with std = DIF (normal; lognormal where a normal ≥ 1 cannot reach the DIF), "
        f"a pre-produced backlog of {setup.backlog_per_device:,} samples per device (same seed in every cell). "
        "Target loss " + ", ".join(f"DIF {d}: {v:.4f}" for d, v in result.target_loss.items())
        + f" ({result.target_loss_rule}). Run time {result.seconds / 60:.1f} min. Settings of every cell: "
        + ", ".join(f"`{k}={v}`" for k, v in setup.settings.items())
        + " (scadles cells also `coordinator.b_min` = global batch / devices).",
        targets_table(balance_targets(result), f"target (speed-up and SE at slow-downs {fleet_label(fleet)}, DIF "
                      f"{dif:g})"),
        table(["slow-downs", "DIF", "ett-stream wall ms", "oracle ms", "over oracle", "each run vs its own",
               "tolerance", f"{TIMES} static (wall)", "s to target: ett-stream", "chronica", "backlog"], per_cell),
        table([header for header, _ in _CELL_COLUMNS] + (["step ms of each run"] if repeated else []), rows),
        f"Split ms: {SPLIT_KEY}. Backlog: whether every device still had samples waiting after every measured "
        "step.",
    ])


def _name(run: Run) -> str:
    return f"{run.policy} (control, {fleet_label(run.slowdowns)})" if run.control else run.policy


def plot_realdata(result: RealdataResult) -> Any:
    """Held-out accuracy (or the setup's metric) over training time for every run, each policy's median time to the
    target, and its median step time (wall period) against the oracle."""
    measured = [c for c in combine(result.runs) if not c.fig.error]
    if not measured:
        raise ValueError("no measured runs to plot")
    colours = {_name(c.fig): f"C{i}" for i, c in enumerate(measured)}
    fig, (acc, reach, period) = pyplot().subplots(1, 3, figsize=(15.0, 4.6), gridspec_kw={"width_ratios": [1.6, 1, 1]})
    for c in measured:
        for i, run in enumerate(c.ok):
            acc.plot([p.seconds for p in run.accuracy], [p.smoothed for p in run.accuracy], color=colours[_name(c.fig)],
                     alpha=0.85, linestyle="--" if c.fig.control else "-", label=None if i else
                     f"{run.policy}{' (control)' if c.fig.control else ''}",
                     linewidth=2.2 if run.policy == "ett-stream" and not c.fig.control else 1.1)
    setup, figs, metric = result.setup, realdata_figures(result), result.setup.held_out_metric
    if result.target is not None:
        acc.axhline(result.target, color="black", linestyle=":", linewidth=1, label=f"target {result.target:.3f}")
    acc.set(xlabel="training seconds (evaluation pauses left out)", ylabel=f"held-out {metric} (smoothed)",
            title=f"{setup.dataset}: held-out {metric}, every run")
    acc.legend(fontsize=7, loc="upper right" if setup.lower_is_better else "lower right")
    hetero = [c for c in measured if not c.fig.control]
    reach.bar([_name(c.fig) for c in hetero], [c.fig.seconds_to_target or 0.0 for c in hetero],
              color=[colours[_name(c.fig)] for c in hetero])
    for i, c in enumerate(hetero):
        runs = [r.seconds_to_target for r in c.ok if r.seconds_to_target is not None]
        reach.scatter([i] * len(runs), runs, color="black", s=10, zorder=3)
        if c.fig.seconds_to_target is None:
            reach.text(i, 0, "not reached", rotation=90, ha="center", va="bottom", fontsize=7)
    reach.set(ylabel="seconds to the target (median; dots: runs)", title=f"time to the target {metric}")
    period.bar([_name(c.fig) for c in measured], [(c.fig.wall_step_seconds_median or 0.0) * 1e3 for c in measured],
               color=list(colours.values()))
    if (oracle := figs.oracle_step_seconds) is not None:
        period.axhline(oracle * 1e3, color="green", linestyle="--", linewidth=1.2, label=f"oracle {oracle * 1e3:.0f} ms"
                       + (" (no bound: the control ran slower)" if figs.oracle_is_bound is False else ""))
        period.axhline(oracle * 1.15e3, color="green", linestyle=":", linewidth=1, label="oracle + 15%")
        period.legend(fontsize=7)
    period.set(ylabel="step time, wall period (median, ms)", title="step time against the oracle")
    for ax in (reach, period):
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.suptitle(f"{setup.devices} gloo ranks, slow-downs {fleet_label(setup.slowdowns)}, global batch "
                 f"{setup.global_batch}, {setup.repeats} round{'s' if setup.repeats > 1 else ''}", fontsize=9)
    return fig


def realdata_targets(result: RealdataResult) -> list[Target]:
    """The dataset workload's targets: time to the target against the best other policy and static, the oracle."""
    t = realdata_figures(result)
    ett_s = t.ett_stream.seconds_to_target if t.ett_stream else None
    speed = (f"static {_s(t.static.seconds_to_target if t.static else None, 'not reached')} / ett-stream "
             f"{_s(ett_s, 'not reached')}" + ("" if t.speedup_vs_static is None
                                              else f" = {t.speedup_vs_static:.2f}{TIMES}"))
    if t.oracle_speedup_vs_static is not None:
        speed += (f"; a perfect split from step 0 would take {_s(t.oracle_seconds_to_target, 'not reached')} = "
                  f"{t.oracle_speedup_vs_static:.2f}{TIMES} (the control's pace to its target {TIMES} n / Σ 1/s_i, "
                  f"in static's steps), ett-stream's pace to the target {figure(t.pace_over_oracle, '.2f')}{TIMES} "
                  "that")
    best, control = t.best_other, t.control.wall_step_seconds_median if t.control else None
    over, bound = t.over_oracle, t.oracle_is_bound
    return [
        Target(f"`ett-stream` reaches the target {result.setup.held_out_metric} no later than the best other policy "
               "(medians)", f"ett-stream {_s(ett_s, 'not reached')}, best other "
               + (f"{best.policy} {_s(best.seconds_to_target, 'not reached')}" if best else "none reached it"),
               t.no_later_than_best),
        Target(f"`ett-stream` reaches it ≥ 2{TIMES} sooner than `static`", speed,
               None if t.speedup_vs_static is None else t.speedup_vs_static >= 2.0),
        Target(f"`ett-stream`'s median step time (wall period) within 15% of the oracle (control {TIMES} n / Σ 1/s_i)",
               f"{figure(t.ett_stream.wall_step_seconds_median if t.ett_stream else None, '.0f', 1e3)} ms against "
               f"{figure(t.oracle_step_seconds, '.0f', 1e3)} ms (control {figure(control, '.0f', 1e3)} ms) = "
               f"{figure(over, '.2f')}{TIMES}" + (" — the control ran slower than the heterogeneous fleet, so this "
                                                  "oracle bounds nothing; not judged" if bound is False else ""),
               None if over is None or not bound else over <= 1.15),
    ]


def render_realdata(result: RealdataResult) -> str:
    """The `realdata` section of BENCHMARKS.md: setup, targets, the per-policy table."""
    setup = result.setup
    rows = []
    for c in combine(result.runs):
        failed = len(c.runs) - len(c.ok)
        finals = [r.accuracy[-1].accuracy for r in c.ok if r.accuracy]
        rows.append([_name(c.fig), str(len(c.ok)) + (f" ({failed} failed)" if failed else ""),
                     figure(c.fig.seconds_to_target, ".1f"),
                     " / ".join(figure(r.seconds_to_target, ".1f", missing="never") for r in c.ok),
                     figure(c.fig.steps_to_target, ".0f"), figure(c.fig.wall_step_seconds_median, ".0f", 1e3),
                     figure(c.fig.step_seconds_median, ".0f", 1e3), figure(c.fig.straggler_effect_median, ".3f"),
                     " / ".join(figure(v, ".0f") for v in c.fig.rank_samples_median.values()),
                     figure(median(finals), ".3f"), "—" if c.fig.error else str(c.fig.samples_unaccounted)])
    return "\n\n".join([
        f"Setup: {setup.dataset} replayed from a backlog of {setup.backlog_per_device:,} samples per device "
        f"(each device's {setup.settings.get('producer.dataset.sharding', 'stratified')} shard in shuffled passes; no "
        f"device runs dry in the window), {setup.devices} gloo ranks on the CPU at slow-downs "
        f"{fleet_label(setup.slowdowns)} (each rank computes {setup.time_scale:g}{TIMES} its training thread's CPU "
        f"time {TIMES} its factor), global batch {setup.global_batch}, held-out {setup.held_out_metric} on the test "
        f"split every {setup.eval_every} steps, {setup.warmup_steps} warm-up + {setup.steps} measured steps per run, "
        f"{setup.repeats} rounds with the order of the cells rotated each round. Target {setup.held_out_metric} "
        + ("—" if result.target is None else f"{result.target:.3f}") + f" ({result.target_rule}). Run time "
        f"{result.seconds / 60:.1f} min. Settings of every run: "
        + ", ".join(f"`{k}={v}`" for k, v in setup.settings.items()) + ".",
        targets_table(realdata_targets(result)),
        table(["policy", "runs", "s to target (median)", "s to target, each run", "steps to target",
               "step ms (wall period)", "slowest rank's step ms", "SE (median)", "samples per step by device",
               f"final {setup.held_out_metric}", "unaccounted"], rows),
    ])
