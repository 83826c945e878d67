"""The balance benchmark's plots and its two sections of BENCHMARKS.md (`balance`, `realdata`), and their
targets (`balance_targets`, `realdata_targets`: the same rows in the Markdown and on the console)."""

from __future__ import annotations

from pathlib import Path

from streamtrain.config.coordinator import POLICY_NAMES

from ..common import TIMES, RenderContext, Target, figure, pyplot, save_figure, table, targets_table
from .results import BalanceResult, CellResult, PolicyResult, RealdataResult
from .setup import fleet_label

__all__ = ["SPLIT_KEY", "backlog_text", "balance_targets", "plot_balance", "plot_realdata", "realdata_targets",
           "render_balance", "render_realdata", "split_text"]

#: The parts of the wall period `split_text` shows, in its order.
_SPLIT_SHOWN = ("compute", "communication", "plan_wait", "data_wait", "hold")
#: What `split_text`'s numbers are.
SPLIT_KEY = ("compute / communication / plan wait / data wait / hold, ms: medians over the window, each read from "
             "the rank with the largest compute (the critical path); the rest of the wall period is commits, "
             "feedback and scheduling")


def split_text(cell: CellResult, missing: str = "—") -> str:
    """The cell's wall-period split as `compute/comm/plan/data/hold` milliseconds."""
    split = cell.step_period_split_median
    if not split:
        return missing
    return "/".join(f"{split.get(part, 0.0) * 1e3:.{0 if part == 'compute' else 1}f}" for part in _SPLIT_SHOWN)


def backlog_text(cell: CellResult) -> str:
    """`held`, or the measured steps at which some device's buffer was empty."""
    if cell.backlog_held is None:
        return "—"
    if cell.backlog_held:
        return "held"
    return "drained at step " + ",".join(str(s) for s in cell.backlog_drained_steps or [])


def _ratios(values: list[float] | None) -> str:
    return " / ".join(f"{v:.2f}" for v in values or []) or "—"


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def balance_targets(result: BalanceResult) -> list[Target]:
    """The synthetic workload's targets: plan wait, speed-up over static, the oracle, the target loss, SE, work."""
    t = result.targets

    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value * 1e3:.1f} ms"

    def where(cells: list[str], kind: str = "not") -> str:
        return "every cell" if not cells else f"{kind} in " + "; ".join(cells)

    ett, static = result.find("ett-stream", t.slowdowns, t.dif), result.find("static", t.slowdowns, t.dif)
    at = {id(p): f"slow-downs {fleet_label(p.slowdowns)} DIF {p.dif:g}" for p in t.per_cell}
    control = next((c for c in result.cells if len(set(c.slowdowns)) == 1 and c.straggler_effect_median is not None
                    and c.policy == "static"), None)
    floor = control.straggler_effect_median if control else None
    wall = t.wall_speedup_vs_static
    return [
        Target("median plan wait on the critical path ≤ 2 ms in every cell (under a backlog)",
               f"at most {ms(t.plan_wait_max_seconds)}", t.plan_wait_met, "—"),
        Target(f"`ett-stream` ≥ 2.5{TIMES} faster than `static` (median wall period)",
               "—" if wall is None else
               f"{ms(static.wall_step_seconds_median if static else None)} → "
               f"{ms(ett.wall_step_seconds_median if ett else None)} = {wall:.2f}{TIMES}"
               + ("" if t.speedup_vs_static is None else f"; per step (slowest rank) {t.speedup_vs_static:.2f}{TIMES}")
               + ("" if t.work_ratio is None
                  else f" (ett-stream's step holds {t.work_ratio:.2f}{TIMES} static's work)"),
               t.speedup_met,
               f"LBB Table 2: 392.9 → 104.9 ms (3.75{TIMES}); CHRONICA Table IV: 578 → 247 s (2.34{TIMES})"),
        Target("`ett-stream`'s wall period within 5% of the oracle at DIF 0, 10% with varying sizes, in every cell",
               where([f"{at[id(p)]}: {p.over_oracle:.3f}{TIMES}" for p in t.per_cell
                      if p.within_oracle is False and p.over_oracle is not None])
               + f" (oracle: the control's {ms(t.control_wall_seconds)} {TIMES} n / Σ 1/s_i)", t.oracle_met, "—"),
        Target("`ett-stream` reaches the target loss no later than `chronica` in every cell (medians)",
               where([f"{at[id(p)]}: {_seconds(p.ett_stream_seconds_to_target)} vs "
                      f"{_seconds(p.chronica_seconds_to_target)}" for p in t.per_cell
                      if p.target_no_later_than_chronica is False]), t.target_loss_met, "—"),
        Target("median straggler effect ≤ 0.10 (per step: (max - min) / mean of the ranks' compute)",
               "—" if t.straggler_effect_median is None else f"{t.straggler_effect_median:.3f}"
               + (f" (noise floor: {floor:.3f}, the control's identical ranks on identical batches)"
                  if floor is not None else ""),
               t.straggler_effect_met, "LBB Table 2 reports averages, not per-step SE"),
        Target("(for the paper's figure) SE of the ranks' median compute over the window",
               figure(t.straggler_effect_of_medians, ".3f"), None,
               "LBB Table 2: per-worker compute 103.5-104.9 ms after balancing, SE ≈ 0.013"),
        Target("`ett-stream` best or within 5% of the best policy (work rate: sample size trained per second) in "
               "every cell", where([f"{at[id(p)]}: best {p.best_policy} {p.best_over_ett_stream:.2f}{TIMES} "
                                    "ett-stream's work rate" for p in t.per_cell if not p.within_5_percent]),
               t.best_or_within_5_percent_met, "—"),
        Target("every measured window ends before any device's backlog drains (buffer depth > 0 after every step)",
               where([f"{c.policy} slow-downs {fleet_label(c.slowdowns)} DIF {c.dif:g}" for c in result.cells
                      if c.backlog_held is False], "drained"), t.backlog_held, "—"),
    ]


def plot_balance(result: BalanceResult, path: Path) -> Path:
    """Wall period (with the fleet's oracle) and straggler effect (log scale) per policy vs DIF, one column per
    heterogeneous slow-down set; a control row (every factor equal) is drawn as the machine's noise floor."""
    cells = [c for c in result.cells if c.step_seconds_median is not None]
    if not cells:
        raise ValueError("no measured cells to plot")
    controls = [c for c in cells if len(set(c.slowdowns)) == 1]
    slows = sorted({c.slowdowns for c in cells if c not in controls}, key=lambda s: -max(s)) or \
        sorted({c.slowdowns for c in cells})
    policies = [p for p in POLICY_NAMES if any(c.policy == p for c in cells)]
    fig, axes = pyplot().subplots(2, len(slows), figsize=(6.0 * len(slows), 6.4), squeeze=False)
    for col, slow in enumerate(slows):
        for policy in policies:
            pts = sorted((c.dif, (c.wall_step_seconds_median or c.step_seconds_median or 0.0) * 1e3,
                          c.straggler_effect_median) for c in cells if c.policy == policy and c.slowdowns == slow)
            style = {"linewidth": 2.5, "color": "black"} if policy == "ett-stream" else {"alpha": 0.8}
            axes[0][col].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=policy, **style)
            axes[1][col].plot([p[0] for p in pts], [p[2] for p in pts], marker="o", **style)
        oracle = [p.oracle_wall_seconds for p in result.targets.per_cell
                  if p.slowdowns == slow and p.oracle_wall_seconds]
        if oracle:
            axes[0][col].axhline(oracle[0] * 1e3, color="green", linestyle=":", linewidth=1,
                                 label=f"oracle (control {TIMES} n / Σ 1/s_i)")
        axes[0][col].set(title=f"slow-downs {fleet_label(slow)}", ylabel="wall period, median (ms)", ylim=(0, None))
        axes[1][col].axhline(0.10, color="green", linestyle=":", linewidth=1, label="SE 0.10 target")
        for control in controls if slow not in {c.slowdowns for c in controls} else ():
            axes[1][col].axhline(control.straggler_effect_median, color="grey", linestyle="--", linewidth=1,
                                 label=f"noise floor ({control.policy}, equal ranks, DIF {control.dif:g})")
        axes[1][col].set(xlabel="DIF (std of sample sizes)", ylabel="straggler effect, median (log)", yscale="log")
        difs = sorted({c.dif for c in cells if c.slowdowns == slow})
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xticks(difs)
            if len(difs) == 1:
                ax.set_xlim(difs[0] - 10, difs[0] + 10)
        axes[1][col].legend(fontsize=7, loc="center right")
    axes[0][0].legend(fontsize=7, loc="center right")
    setup = result.setup
    fig.suptitle(f"{setup.devices} gloo ranks, global batch {setup.global_batch}, "
                 f"{setup.steps} measured steps after {setup.warmup_steps} warm-up", fontsize=9)
    return save_figure(fig, path)


def _comparisons(result: BalanceResult) -> str:
    """ett-stream per (fleet, DIF) cell against the oracle, static and chronica."""
    return table(["slow-downs", "DIF", "ett-stream wall ms", "oracle ms", "over oracle", "each run vs its own",
                  "tolerance",
                  f"{TIMES} static (wall)", "s to target: ett-stream", "chronica", "backlog"], [
        [fleet_label(p.slowdowns), f"{p.dif:g}", figure(p.ett_stream_wall_seconds, ".1f", 1e3),
         figure(p.oracle_wall_seconds, ".1f", 1e3), figure(p.over_oracle, ".3f"), _ratios(p.over_oracle_runs),
         figure(p.oracle_tolerance, ".0%"),
         figure(p.wall_speedup_vs_static, ".2f"), _seconds(p.ett_stream_seconds_to_target),
         _seconds(p.chronica_seconds_to_target),
         "—" if p.backlog_held is None else ("held" if p.backlog_held else "drained")]
        for p in result.targets.per_cell])


def _row(c: CellResult, repeated: bool) -> list[str]:
    lost = "error" if c.error else ("—" if c.samples_lost is None else str(c.samples_lost))
    return [c.policy, fleet_label(c.slowdowns), f"{c.dif:g}", figure(c.step_seconds_median, ".1f", 1e3),
            figure(c.wall_step_seconds_median, ".1f", 1e3), figure(c.plan_wait_seconds_median, ".2f", 1e3),
            split_text(c), figure(c.straggler_effect_median, ".3f"),
            figure(c.samples_per_s, ".0f"), figure(c.size_per_s, ".0f"), figure(c.trained_size_mean, ".1f"),
            figure(c.seconds_to_target_loss, ".1f"), lost, backlog_text(c),
            *([" / ".join(figure(r.step_seconds_median, ".0f", 1e3) for r in c.runs or [])] if repeated else [])]


def render_balance(result: BalanceResult, ctx: RenderContext) -> str:
    """The `balance` section of BENCHMARKS.md: targets, the full table and the plot."""
    png = plot_balance(result, ctx.plot_path("balance.png"))
    setup = result.setup
    repeated = setup.repeats > 1
    return "\n\n".join([
        f"Setup: {setup.devices} gloo ranks on the CPU, each computing {setup.time_scale:g}{TIMES} its "
        f"training thread's CPU time {TIMES} its slow-down factor, global batch {setup.global_batch}, "
        f"{setup.warmup_steps} warm-up + {setup.steps} measured steps per cell"
        + (f", the whole matrix run {setup.repeats} times one after another (each figure: the median over "
           "a cell's runs)" if repeated else "") + ", sizes mean "
        f"{setup.size_mean:g} with std = DIF (normal; lognormal where a normal ≥ 1 cannot reach the DIF), "
        f"a pre-produced backlog of {setup.backlog_per_device:,} samples per device (same seed in every cell). "
        "Target loss " + ", ".join(f"DIF {d}: {v:.4f}" for d, v in result.target_loss.items())
        + f" ({result.target_loss_rule}). Run time "
        f"{result.seconds / 60:.1f} min. Settings of every cell: "
        + ", ".join(f"`{k}={v}`" for k, v in setup.settings.items())
        + " (scadles cells also `coordinator.b_min` = global batch / devices).",
        targets_table(balance_targets(result), f"target (speed-up and SE at slow-downs "
                      f"{fleet_label(result.targets.slowdowns)}, DIF {result.targets.dif:g})"),
        _comparisons(result),
        table(["policy", "slow-downs", "DIF", "step ms (median)", "wall step ms", "plan wait ms", "split ms",
               "SE (median)", "samples/s", "work/s (size)", "mean size trained", "s to target loss", "lost samples",
               "backlog",
               *(["step ms of each run"] if repeated else [])], [_row(c, repeated) for c in result.cells]),
        f"Split ms: {SPLIT_KEY}. Backlog: whether every device still had samples waiting after every measured "
        "step.",
        f"![balance]({ctx.link(png)})",
    ])


def _name(p: PolicyResult) -> str:
    return f"{p.policy} (control, {fleet_label(p.slowdowns)})" if p.control else p.policy


def plot_realdata(result: RealdataResult, path: Path) -> Path:
    """Held-out accuracy over training time for every run, each policy's median time to the target, and its median
    step time (wall period) against the oracle."""
    measured = [p for p in result.policies if not p.error]
    if not measured:
        raise ValueError("no measured runs to plot")
    plt = pyplot()
    colours = {p.policy + ("/c" if p.control else ""): f"C{i}" for i, p in enumerate(measured)}
    fig, (acc, reach, period) = plt.subplots(1, 3, figsize=(15.0, 4.6), gridspec_kw={"width_ratios": [1.6, 1, 1]})
    labelled: set[str] = set()
    for run in result.runs:
        key = run.policy + ("/c" if run.control else "")
        if run.error or not run.accuracy or key not in colours:
            continue
        style = {"linewidth": 2.2} if run.policy == "ett-stream" and not run.control else {"linewidth": 1.1}
        acc.plot([p.seconds for p in run.accuracy], [p.smoothed for p in run.accuracy], color=colours[key],
                 alpha=0.85, linestyle="--" if run.control else "-", label=None if key in labelled else key.replace(
                     "/c", " (control)"), **style)
        labelled.add(key)
    t = result.targets
    if t.target_accuracy is not None:
        acc.axhline(t.target_accuracy, color="black", linestyle=":", linewidth=1,
                    label=f"target {t.target_accuracy:.3f}")
    acc.set(xlabel="training seconds (evaluation pauses left out)", ylabel="held-out accuracy (smoothed)",
            title=f"{result.setup.dataset}: held-out accuracy, every run")
    acc.legend(fontsize=7, loc="lower right")
    names = [_name(p) for p in measured]
    hetero = [p for p in measured if not p.control]
    reach.bar([_name(p) for p in hetero], [p.seconds_to_target or 0.0 for p in hetero],
              color=[colours[p.policy] for p in hetero])
    for i, p in enumerate(hetero):
        runs = [s for s in p.seconds_to_target_runs if s is not None]
        reach.scatter([i] * len(runs), runs, color="black", s=10, zorder=3)
        if p.seconds_to_target is None:
            reach.text(i, 0, "not reached", rotation=90, ha="center", va="bottom", fontsize=7)
    reach.set(ylabel="seconds to the target (median; dots: runs)", title="time to the target accuracy")
    period.bar(names, [(p.wall_period_seconds_median or 0.0) * 1e3 for p in measured],
               color=[colours[p.policy + ("/c" if p.control else "")] for p in measured])
    if t.oracle_step_seconds is not None:
        period.axhline(t.oracle_step_seconds * 1e3, color="green", linestyle="--", linewidth=1.2,
                       label=f"oracle {t.oracle_step_seconds * 1e3:.0f} ms"
                       + (" (no bound: the control ran slower)" if t.oracle_is_bound is False else ""))
        period.axhline(t.oracle_step_seconds * 1.15e3, color="green", linestyle=":", linewidth=1,
                       label="oracle + 15%")
        period.legend(fontsize=7)
    period.set(ylabel="step time, wall period (median, ms)", title="step time against the oracle")
    for ax in (reach, period):
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    setup = result.setup
    fig.suptitle(f"{setup.devices} gloo ranks, slow-downs {fleet_label(setup.slowdowns)}, global batch "
                 f"{setup.global_batch}, {setup.repeats} round{'s' if setup.repeats > 1 else ''}", fontsize=9)
    return save_figure(fig, path)


def realdata_targets(result: RealdataResult) -> list[Target]:
    """The dataset workload's targets: time to the target against the best other policy and static, the oracle."""
    t = result.targets

    def s(value: float | None) -> str:
        return "not reached" if value is None else f"{value:.1f} s"

    static = result.find("static")
    speed = (f"static {s(static.seconds_to_target if static else None)} / ett-stream "
             f"{s(t.ett_stream_seconds_to_target)}" + ("" if t.speedup_vs_static is None
                                                       else f" = {t.speedup_vs_static:.2f}{TIMES}"))
    if t.oracle_speedup_vs_static is not None:
        speed += (f"; a perfect split from step 0 would take {s(t.oracle_seconds_to_target)} = "
                  f"{t.oracle_speedup_vs_static:.2f}{TIMES} (the control's pace to its target {TIMES} n / Σ 1/s_i, "
                  f"in static's steps), ett-stream's pace to the target "
                  f"{figure(t.ett_stream_over_oracle_to_target, '.2f')}{TIMES} that")
    return [
        Target("`ett-stream` reaches the target accuracy no later than the best other policy (medians)",
               f"ett-stream {s(t.ett_stream_seconds_to_target)}, best other "
               + (f"{t.best_other_policy} {s(t.best_other_seconds_to_target)}" if t.best_other_policy
                  else "none reached it"), t.no_later_than_best_met),
        Target(f"`ett-stream` reaches it ≥ 2{TIMES} sooner than `static`", speed, t.speedup_met),
        Target(f"`ett-stream`'s median step time (wall period) within 15% of the oracle (control {TIMES} n / Σ 1/s_i)",
               f"{figure(t.ett_stream_wall_period_seconds, '.0f', 1e3)} ms against "
               f"{figure(t.oracle_step_seconds, '.0f', 1e3)} ms (control "
               f"{figure(t.control_wall_period_seconds, '.0f', 1e3)} ms) = {figure(t.over_oracle, '.2f')}{TIMES}"
               + (" — the control ran slower than the heterogeneous fleet, so this oracle bounds nothing; not judged"
                  if t.oracle_is_bound is False else ""), None if t.oracle_is_bound is False else t.oracle_met),
    ]


def render_realdata(result: RealdataResult, ctx: RenderContext) -> str:
    """The `realdata` section of BENCHMARKS.md: setup, targets, the per-policy table and the plot."""
    png = plot_realdata(result, ctx.plot_path("realdata.png"))
    setup = result.setup
    t = result.targets
    rows = [[_name(p), str(p.runs - p.failed_runs) + (f" ({p.failed_runs} failed)" if p.failed_runs else ""),
             figure(p.seconds_to_target, ".1f"),
             " / ".join(figure(v, ".1f", missing="never") for v in p.seconds_to_target_runs),
             figure(p.steps_to_target, ".0f"), figure(p.wall_period_seconds_median, ".0f", 1e3),
             figure(p.step_seconds_median, ".0f", 1e3), figure(p.straggler_effect_median, ".3f"),
             " / ".join(figure(v, ".0f") for v in p.rank_samples_median.values()),
             figure(p.final_accuracy, ".3f"), "—" if p.samples_unaccounted is None else str(p.samples_unaccounted)]
            for p in result.policies]
    return "\n\n".join([
        f"Setup: {setup.dataset} replayed from a backlog of {setup.backlog_per_device:,} samples per device "
        f"(each device's stratified shard in shuffled passes; no device runs dry in the window), {setup.devices} "
        f"gloo ranks on the CPU at slow-downs {fleet_label(setup.slowdowns)} (each rank computes "
        f"{setup.time_scale:g}{TIMES} its training thread's CPU time {TIMES} its factor), global batch "
        f"{setup.global_batch}, held-out accuracy on the test split every {setup.eval_every} steps, "
        f"{setup.warmup_steps} warm-up + {setup.steps} measured steps per run, {setup.repeats} rounds with the "
        f"order of the cells rotated each round. Target accuracy "
        + ("—" if t.target_accuracy is None else f"{t.target_accuracy:.3f}") + f" ({t.target_rule}). Run time "
        f"{result.seconds / 60:.1f} min. Settings of every run: "
        + ", ".join(f"`{k}={v}`" for k, v in setup.settings.items()) + ".",
        targets_table(realdata_targets(result)),
        table(["policy", "runs", "s to target (median)", "s to target, each run", "steps to target",
               "step ms (wall period)", "slowest rank's step ms", "SE (median)", "samples per step by device",
               "final accuracy", "unaccounted"], rows),
        f"![realdata]({ctx.link(png)})",
    ])
