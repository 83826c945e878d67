"""The balance benchmark's sections of BENCHMARKS.md (`balance`, `realdata`): targets, tables and plots."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from streamtrain.config.coordinator import POLICY_NAMES
from streamtrain.coordinator.balance import straggler_effect
from streamtrain.report.figures import median

from ..common import TIMES, Target, figure, pyplot, table, targets_table
from .figures import BalanceResult, CellRuns, RealdataResult, combine, comparisons, control_cell, oracle_wall, ratio
from .setup import FleetSetup, Run, fleet_label, oracle_factor

__all__ = ["balance_targets", "plot_balance", "plot_realdata", "realdata_targets", "render_balance",
           "render_realdata", "target_cells"]

_SPLIT_SHOWN = ("compute", "communication", "plan_wait", "data_wait", "hold")


def split_text(run: Run) -> str:
    split = run.step_period_split_median
    return "/".join(f"{split.get(p, 0.0) * 1e3:.{0 if p == 'compute' else 1}f}" for p in _SPLIT_SHOWN) if split else "—"


def backlog_text(run: Run) -> str:
    """`held`, or the measured steps at which some device's buffer was empty."""
    if run.backlog_held is None:
        return "—"
    return "held" if run.backlog_held else "drained at step " + ",".join(str(s) for s in run.backlog_drained_steps)


#: The balance section's table of every cell: (header, text of the cell's figures) per column.
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


def _every(goal: str, items: Sequence[Any], flag: Callable[[Any], bool | None], miss: Callable[[Any], str],
           note: str = "", kind: str = "not") -> Target:
    """A target met in every cell (flag True; None: unknown); `miss` says how a cell failed it."""
    misses = [f"slow-downs {fleet_label(i.slowdowns)} DIF {i.dif:g}: {miss(i)}" for i in items if flag(i) is False]
    known = [f for i in items if (f := flag(i)) is not None]
    return Target(goal, ("every cell" if not misses else f"{kind} in " + "; ".join(misses)) + note,
                  all(known) if known else None, "—")


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
    cells, per_cell = [c.fig for c in combine(result.runs)], comparisons(result.runs, result.setup)
    _, _, ett, static = target_cells(result)
    control = control_cell(combine(result.runs))
    floor = control.straggler_effect_median if control else None
    medians = [v for v in (ett.rank_compute_seconds_median.values() if ett else []) if v]
    waits = [w for c in cells if (w := c.plan_wait_seconds_median) is not None]
    se = ett.straggler_effect_median if ett else None
    wall = ratio(static.wall_step_seconds_median, ett.wall_step_seconds_median) if ett and static else None
    step = ratio(static.step_seconds_median, ett.step_seconds_median) if ett and static else None
    work = ratio(ett.step_size_median, static.step_size_median) if ett and static else None
    judged = wall if wall is not None else step
    speedup = "—" if wall is None or not ett or not static else (
        f"{_ms(static.wall_step_seconds_median)} → {_ms(ett.wall_step_seconds_median)} = {wall:.2f}{TIMES}"
        + ("" if step is None else f"; slowest rank's step {step:.2f}{TIMES}")
        + ("" if work is None else f"; work per step {work:.2f}{TIMES} static's"))
    return [
        Target("median plan wait on the critical path ≤ 2 ms in every cell", f"at most {_ms(max(waits, default=None))}",
               max(waits) <= 0.002 if waits else None, "—"),
        Target(f"`ett-stream` ≥ 2.5{TIMES} faster than `static` (median wall period)", speedup,
               None if judged is None else judged >= 2.5,
               f"LBB Table 2: 392.9 → 104.9 ms (3.75{TIMES}); CHRONICA Table IV: 578 → 247 s (2.34{TIMES})"),
        _every("`ett-stream`'s wall period within 5% of the oracle at DIF 0, 10% otherwise, in every cell", per_cell,
               lambda p: p.within_oracle, lambda p: f"{p.over_oracle:.3f}{TIMES}",
               f" (oracle: the control's {_ms(control.wall_step_seconds_median if control else None)} {TIMES} n / "
               "Σ 1/s_i)"),
        _every("`ett-stream` reaches the target loss no later than `chronica` in every cell", per_cell,
               lambda p: p.target_no_later_than_chronica,
               lambda p: f"{_s(p.ett_stream_seconds_to_target)} vs {_s(p.chronica_seconds_to_target)}"),
        Target("median straggler effect ≤ 0.10", "—" if se is None else f"{se:.3f}"
               + ("" if floor is None else f" (the control's noise floor {floor:.3f})"),
               None if se is None else se <= 0.10, "LBB Table 2 reports averages, not per-step SE"),
        Target("(for the paper's figure) SE of the ranks' median compute",
               figure(straggler_effect(medians) if len(medians) > 1 else None, ".3f"), None,
               "LBB Table 2: per-worker compute 103.5-104.9 ms after balancing, SE ≈ 0.013"),
        _every("`ett-stream` within 5% of the best work rate (size trained per second) in every cell", per_cell,
               lambda p: p.best_over_ett_stream <= 1.05,
               lambda p: f"best {p.best_policy} {p.best_over_ett_stream:.2f}{TIMES}"),
        _every("no device's backlog drains in a measured window", [c for c in cells if not c.error],
               lambda c: c.backlog_held, lambda c: c.policy, kind="drained"),
    ]


def plot_balance(result: BalanceResult) -> Any:
    """Wall period per policy vs DIF, and the oracle, a panel per heterogeneous fleet."""
    cells = [c.fig for c in combine(result.runs) if c.fig.step_seconds_median is not None]
    if not cells:
        raise ValueError("no measured cells to plot")
    slows = (sorted({c.slowdowns for c in cells if not c.control}, key=lambda s: -max(s))
             or sorted({c.slowdowns for c in cells}))
    oracles = {p.slowdowns: p.oracle_wall_seconds for p in comparisons(result.runs, result.setup)}
    fig, axes = pyplot().subplots(1, len(slows), figsize=(6.0 * len(slows), 3.8), squeeze=False)
    for ax, slow in zip(axes[0], slows, strict=True):
        for policy in [p for p in POLICY_NAMES if any(c.policy == p for c in cells)]:
            pts = sorted((c.dif or 0.0, (c.wall_step_seconds_median or c.step_seconds_median or 0.0) * 1e3)
                         for c in cells if c.policy == policy and c.slowdowns == slow)
            style = {"linewidth": 2.5, "color": "black"} if policy == "ett-stream" else {"alpha": 0.8}
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=policy, **style)
        if oracle := oracles.get(slow):
            ax.axhline(oracle * 1e3, color="green", linestyle=":", linewidth=1,
                       label=f"oracle (control {TIMES} n / Σ 1/s_i)")
        difs = sorted({c.dif or 0.0 for c in cells if c.slowdowns == slow})
        ax.set(title=f"slow-downs {fleet_label(slow)}", xlabel="DIF (std of sample sizes)",
               ylabel="wall period, median (ms)", ylim=(0, None), xticks=difs)
        if len(difs) == 1:
            ax.set_xlim(difs[0] - 10, difs[0] + 10)
    axes[0][0].legend(fontsize=7, loc="center right")
    fig.suptitle(f"{result.setup.devices} gloo ranks, global batch {result.setup.global_batch}, {result.setup.steps} "
                 f"measured steps after {result.setup.warmup_steps} warm-up", fontsize=9)
    return fig


def _setup_line(setup: FleetSetup, seconds: float, fleet: str, target: str) -> str:
    """A section's setup: the fleet, the window, the rounds and the target, then every setting."""
    return (f"Setup: {fleet}, time scale {setup.time_scale:g}, global batch {setup.global_batch}, {setup.warmup_steps} "
            f"warm-up + {setup.steps} measured steps, {setup.repeats} round{'s' if setup.repeats > 1 else ''} "
            f"(medians), backlog {setup.backlog_per_device:,} per device, run time {seconds / 60:.1f} min. {target}. "
            "Settings: " + ", ".join(f"`{k}={v}`" for k, v in setup.settings.items()) + ".")


def render_balance(result: BalanceResult) -> str:
    """The `balance` section of BENCHMARKS.md: setup, targets, every cell (its wall period over its fleet's oracle)."""
    setup = result.setup
    repeated = setup.repeats > 1
    fleet, dif, _, _ = target_cells(result)
    cells = combine(result.runs)
    control = control_cell(cells)
    rows = [[text(c.fig) for _, text in _CELL_COLUMNS]
            + [figure(ratio(c.fig.wall_step_seconds_median, oracle_wall(control, c.fig.slowdowns)), ".3f")]
            + ([" / ".join(figure(r.step_seconds_median, ".0f", 1e3) for r in c.runs)] if repeated else [])
            for c in cells]
    return "\n\n".join([
        _setup_line(setup, result.seconds, f"{setup.devices} ranks, sizes mean {setup.size_mean:g} with std = DIF",
                    "Target loss " + ", ".join(f"DIF {d}: {v:.4f}" for d, v in result.target_loss.items())
                    + f" ({result.target_loss_rule})"),
        targets_table(balance_targets(result), f"target (speed-up and SE at {fleet_label(fleet)}, DIF {dif:g})"),
        table([header for header, _ in _CELL_COLUMNS] + ["wall over oracle"]
              + (["step ms of each run"] if repeated else []), rows),
        "Split ms: compute / communication / plan wait / data wait / hold on the critical path.",
    ])


def _name(run: Run) -> str:
    return f"{run.policy} (control, {fleet_label(run.slowdowns)})" if run.control else run.policy


def plot_realdata(result: RealdataResult) -> Any:
    """Every run's held-out metric over training time (evaluation pauses left out), and the target."""
    measured = [c for c in combine(result.runs) if not c.fig.error]
    if not measured:
        raise ValueError("no measured runs to plot")
    setup, metric = result.setup, result.setup.held_out_metric
    fig, ax = pyplot().subplots(figsize=(9.0, 4.6))
    for i, c in enumerate(measured):
        for j, run in enumerate(c.ok):
            ax.plot([p.seconds for p in run.accuracy], [p.smoothed for p in run.accuracy], color=f"C{i}", alpha=0.85,
                    linestyle="--" if c.fig.control else "-", label=None if j else _name(c.fig),
                    linewidth=2.2 if run.policy == "ett-stream" and not c.fig.control else 1.1)
    if result.target is not None:
        ax.axhline(result.target, color="black", linestyle=":", linewidth=1, label=f"target {result.target:.3f}")
    ax.set(xlabel="training seconds (evaluation pauses left out)", ylabel=f"held-out {metric} (smoothed)",
           title=f"{setup.dataset}: held-out {metric}, every run")
    ax.legend(fontsize=7, loc="upper right" if setup.lower_is_better else "lower right")
    fig.suptitle(f"{setup.devices} gloo ranks, slow-downs {fleet_label(setup.slowdowns)}, global batch "
                 f"{setup.global_batch}, {setup.repeats} round{'s' if setup.repeats > 1 else ''}", fontsize=9)
    return fig


def _pace(cell: CellRuns | None) -> float | None:
    """A cell's median seconds per step to the target."""
    return median([r.seconds_to_target / r.steps_to_target for r in cell.ok
                   if r.seconds_to_target is not None and r.steps_to_target]) if cell else None


def _oracle_target(ett: Run | None, control: Run | None, slowdowns: Sequence[float]) -> Target:
    """ett-stream's wall period against the oracle of `slowdowns` (a control slower than it bounds nothing)."""
    ett_wall = ett.wall_step_seconds_median if ett else None
    control_wall = control.wall_step_seconds_median if control else None
    oracle = oracle_wall(control, slowdowns)
    over = ratio(ett_wall, oracle)
    bound = None if not control_wall or ett_wall is None else control_wall <= ett_wall
    return Target("`ett-stream`'s median wall period within 15% of the oracle",
                  f"{figure(ett_wall, '.0f', 1e3)} ms against {figure(oracle, '.0f', 1e3)} ms (control "
                  f"{figure(control_wall, '.0f', 1e3)} ms) = {figure(over, '.2f')}{TIMES}"
                  + (" — the control ran slower: this oracle bounds nothing" if bound is False else ""),
                  None if over is None or not bound else over <= 1.15)


def realdata_targets(result: RealdataResult) -> list[Target]:
    """ett-stream's time to the target against the best other policy and static (and the oracle's: the control's pace
    to its own x n / sum(1 / s_i), in static's steps); its wall period against the oracle. Cell medians throughout."""
    cells = combine(result.runs)
    hetero = {c.fig.policy: c for c in cells if not c.fig.control}
    control = next((c for c in cells if c.fig.control), None)
    ett, static = hetero.get("ett-stream"), hetero.get("static")
    ett_t = ett.fig.seconds_to_target if ett else None
    static_t = static.fig.seconds_to_target if static else None
    others = [c.fig for name, c in hetero.items() if name != "ett-stream" and c.fig.seconds_to_target is not None]
    best = min(others, key=lambda r: r.seconds_to_target or 0.0, default=None)
    factor, speedup = oracle_factor(result.setup.slowdowns), ratio(static_t, ett_t)
    oracle_pace = pace * factor if (pace := _pace(control)) else None
    static_steps = static.fig.steps_to_target if static else None
    oracle_t = oracle_pace * static_steps if oracle_pace and static_steps else None
    speed = f"static {_s(static_t, 'not reached')} / ett-stream {_s(ett_t, 'not reached')}" + (
        "" if speedup is None else f" = {speedup:.2f}{TIMES}")
    if (oracle_speedup := ratio(static_t, oracle_t)) is not None:
        speed += (f"; a perfect split from step 0 would take {_s(oracle_t)} = {oracle_speedup:.2f}{TIMES}; "
                  f"ett-stream's pace to it {figure(ratio(_pace(ett), oracle_pace), '.2f')}{TIMES} the oracle's")
    return [
        Target(f"`ett-stream` reaches the target {result.setup.held_out_metric} no later than the best other policy",
               f"ett-stream {_s(ett_t, 'not reached')}, best other "
               + (f"{best.policy} {_s(best.seconds_to_target)}" if best else "none reached it"),
               None if ett is None or len(hetero) < 2 else ett_t is not None and (best is None or ett_t <= (
                   best.seconds_to_target or 0.0))),
        Target(f"`ett-stream` reaches it ≥ 2{TIMES} sooner than `static`", speed,
               None if speedup is None else speedup >= 2.0),
        _oracle_target(ett.fig if ett else None, control.fig if control else None, result.setup.slowdowns),
    ]


def render_realdata(result: RealdataResult) -> str:
    """The `realdata` section of BENCHMARKS.md: setup, targets, the per-policy table."""
    setup = result.setup
    rows = [[_name(c.fig), str(len(c.ok)) + (f" ({failed} failed)" if (failed := len(c.runs) - len(c.ok)) else ""),
             figure(c.fig.seconds_to_target, ".1f"),
             " / ".join(figure(r.seconds_to_target, ".1f", missing="never") for r in c.ok),
             figure(c.fig.steps_to_target, ".0f"), figure(c.fig.wall_step_seconds_median, ".0f", 1e3),
             figure(c.fig.step_seconds_median, ".0f", 1e3), figure(c.fig.straggler_effect_median, ".3f"),
             " / ".join(figure(v, ".0f") for v in c.fig.rank_samples_median.values()),
             figure(median([r.accuracy[-1].accuracy for r in c.ok if r.accuracy]), ".3f"),
             "—" if c.fig.error else str(c.fig.samples_unaccounted)] for c in combine(result.runs)]
    return "\n\n".join([
        _setup_line(setup, result.seconds, f"{setup.dataset}, {setup.devices} ranks at slow-downs "
                    f"{fleet_label(setup.slowdowns)}, held-out {setup.held_out_metric} every {setup.eval_every} steps",
                    f"Target {setup.held_out_metric} {figure(result.target, '.3f')} ({result.target_rule})"),
        targets_table(realdata_targets(result)),
        table(["policy", "runs", "s to target (median)", "s to target, each run", "steps to target",
               "step ms (wall period)", "slowest rank's step ms", "SE (median)", "samples per step by device",
               f"final {setup.held_out_metric}", "unaccounted"], rows),
    ])
