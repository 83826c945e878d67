"""`bench balance`'s plot and its section of BENCHMARKS.md."""

from __future__ import annotations

from pathlib import Path

from streamtrain.config.coordinator import POLICY_NAMES

from ..common import TIMES, RenderContext, pyplot, save_figure, table, verdict
from .results import BalanceResult, CellResult
from .setup import fleet_label

__all__ = ["SPLIT_KEY", "backlog_text", "figure", "plot_balance", "render_balance", "split_text", "target_lines"]

#: The parts of the wall period `split_text` shows, in its order.
_SPLIT_SHOWN = ("compute", "communication", "plan_wait", "data_wait", "hold")
#: What `split_text`'s numbers are.
SPLIT_KEY = ("compute / communication / plan wait / data wait / hold, ms: medians over the window, each read from "
             "the rank with the largest compute (the critical path); the rest of the wall period is commits, "
             "feedback and scheduling")


def figure(value: float | None, spec: str, scale: float = 1.0, missing: str = "—") -> str:
    """`value` x `scale` formatted with `spec`, or `missing`."""
    return missing if value is None else format(value * scale, spec)


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


def target_lines(result: BalanceResult) -> list[str]:
    """The targets in plain words, one line each: what the command prints under its table."""
    t = result.targets
    losses = ", ".join(f"DIF {d}: {v:.4f}" for d, v in result.target_loss.items())
    lines = [f"target loss {losses} ({result.target_loss_rule})",
             f"plan wait on the critical path (median per cell): at most "
             f"{figure(t.plan_wait_max_seconds, '.2f', 1e3, '-')} ms (target <= 2 ms: {t.plan_wait_met})",
             f"at slow-downs {fleet_label(t.slowdowns)}, DIF {t.dif:g}: ett-stream "
             f"{figure(t.wall_speedup_vs_static, '.2f', missing='-')}x faster per wall period than static, "
             f"{figure(t.speedup_vs_static, '.2f', missing='-')}x per step (target >= 2.5: {t.speedup_met}); median "
             f"SE {figure(t.straggler_effect_median, '.3f', missing='-')} (target <= 0.10: {t.straggler_effect_met})",
             f"oracle base: the control's wall period {figure(t.control_wall_seconds, '.1f', 1e3, '-')} ms"]
    for p in t.per_cell:
        lines.append(
            f"  slow-downs {fleet_label(p.slowdowns)} DIF {p.dif:g}: ett-stream wall "
            f"{figure(p.ett_stream_wall_seconds, '.1f', 1e3, '-')} ms vs oracle "
            f"{figure(p.oracle_wall_seconds, '.1f', 1e3, '-')} ms = {figure(p.over_oracle, '.3f', missing='-')}"
            + (f" (runs against their own: {_ratios(p.over_oracle_runs)})" if p.over_oracle_runs else "") + " "
            f"(within {figure(p.oracle_tolerance, '.0%', missing='-')}: {p.within_oracle}); "
            f"{figure(p.wall_speedup_vs_static, '.2f', missing='-')}x static; target loss in "
            f"{_seconds(p.ett_stream_seconds_to_target)} vs chronica {_seconds(p.chronica_seconds_to_target)} "
            f"(no later: {p.target_no_later_than_chronica}); best work rate {p.best_policy} "
            f"{p.best_over_ett_stream:.2f}x; backlog held: {p.backlog_held}")
    lines.append(f"ett-stream within the oracle's tolerance in every cell: {t.oracle_met}; reaches the target loss no "
                 f"later than chronica in every cell: {t.target_loss_met}; best work rate or within 5% of it in every "
                 f"cell: {t.best_or_within_5_percent_met}; every window ended before a backlog drained: "
                 f"{t.backlog_held}")
    return lines


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


def _targets(result: BalanceResult) -> str:
    t = result.targets

    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value * 1e3:.1f} ms"

    ett = result.find("ett-stream", t.slowdowns, t.dif)
    static = result.find("static", t.slowdowns, t.dif)
    missed = [f"slow-downs {fleet_label(p.slowdowns)} DIF {p.dif:g}: best {p.best_policy} "
              f"{p.best_over_ett_stream:.2f}{TIMES} ett-stream's work rate" for p in t.per_cell
              if not p.within_5_percent]
    oracle_missed = [f"slow-downs {fleet_label(p.slowdowns)} DIF {p.dif:g}: {p.over_oracle:.3f}{TIMES}"
                     for p in t.per_cell if p.within_oracle is False and p.over_oracle is not None]
    loss_missed = [f"slow-downs {fleet_label(p.slowdowns)} DIF {p.dif:g}: {_seconds(p.ett_stream_seconds_to_target)}"
                   f" vs {_seconds(p.chronica_seconds_to_target)}" for p in t.per_cell
                   if p.target_no_later_than_chronica is False]
    drained = [f"{c.policy} slow-downs {fleet_label(c.slowdowns)} DIF {c.dif:g}" for c in result.cells
               if c.backlog_held is False]
    wall = t.wall_speedup_vs_static
    control = next((c for c in result.cells if len(set(c.slowdowns)) == 1 and c.straggler_effect_median is not None
                    and c.policy == "static"), None)
    floor = control.straggler_effect_median if control else None
    return table([f"target (speed-up and SE at slow-downs {fleet_label(t.slowdowns)}, DIF {t.dif:g})", "measured",
                  "paper", "verdict"], [
        ["median plan wait on the critical path ≤ 2 ms in every cell (under a backlog)",
         f"at most {ms(t.plan_wait_max_seconds)}", "—", verdict(t.plan_wait_met)],
        [f"`ett-stream` ≥ 2.5{TIMES} faster than `static` (median wall period)",
         "—" if wall is None else
         f"{ms(static.wall_step_seconds_median if static else None)} → "
         f"{ms(ett.wall_step_seconds_median if ett else None)} = {wall:.2f}{TIMES}"
         + ("" if t.speedup_vs_static is None else f"; per step (slowest rank) {t.speedup_vs_static:.2f}{TIMES}")
         + ("" if t.work_ratio is None else f" (ett-stream's step holds {t.work_ratio:.2f}{TIMES} static's work)"),
         f"LBB Table 2: 392.9 → 104.9 ms (3.75{TIMES}); CHRONICA Table IV: 578 → 247 s (2.34{TIMES})",
         verdict(t.speedup_met)],
        ["`ett-stream`'s wall period within 5% of the oracle at DIF 0, 10% with varying sizes, in every cell",
         ("every cell" if not oracle_missed else "missed in " + "; ".join(oracle_missed))
         + f" (oracle: the control's {ms(t.control_wall_seconds)} {TIMES} n / Σ 1/s_i)", "—", verdict(t.oracle_met)],
        ["`ett-stream` reaches the target loss no later than `chronica` in every cell (medians)",
         "every cell" if not loss_missed else "missed in " + "; ".join(loss_missed), "—",
         verdict(t.target_loss_met)],
        ["median straggler effect ≤ 0.10 (per step: (max - min) / mean of the ranks' compute)",
         "—" if t.straggler_effect_median is None else f"{t.straggler_effect_median:.3f}"
         + (f" (noise floor: {floor:.3f}, the control's identical ranks on identical batches)" if floor is not None
            else ""),
         "LBB Table 2 reports averages, not per-step SE", verdict(t.straggler_effect_met)],
        ["(for the paper's figure) SE of the ranks' median compute over the window",
         figure(t.straggler_effect_of_medians, ".3f"),
         "LBB Table 2: per-worker compute 103.5-104.9 ms after balancing, SE ≈ 0.013", "—"],
        ["`ett-stream` best or within 5% of the best policy (work rate: sample size trained per second) in every "
         "cell",
         "every cell" if not missed else "missed in " + "; ".join(missed), "—",
         verdict(t.best_or_within_5_percent_met)],
        ["every measured window ends before any device's backlog drains (buffer depth > 0 after every step)",
         "every cell" if not drained else "drained in " + "; ".join(drained), "—", verdict(t.backlog_held)],
    ])


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
        _targets(result),
        _comparisons(result),
        table(["policy", "slow-downs", "DIF", "step ms (median)", "wall step ms", "plan wait ms", "split ms",
               "SE (median)", "samples/s", "work/s (size)", "mean size trained", "s to target loss", "lost samples",
               "backlog",
               *(["step ms of each run"] if repeated else [])], [_row(c, repeated) for c in result.cells]),
        f"Split ms: {SPLIT_KEY}. Backlog: whether every device still had samples waiting after every measured "
        "step.",
        f"![balance]({ctx.link(png)})",
    ])
