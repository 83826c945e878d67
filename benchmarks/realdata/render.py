"""`bench realdata`'s plot and its section of BENCHMARKS.md."""

from __future__ import annotations

from pathlib import Path

from ..balance.render import figure
from ..balance.setup import fleet_label
from ..common import TIMES, RenderContext, pyplot, save_figure, table, verdict
from .results import PolicyResult, RealdataResult

__all__ = ["plot_realdata", "render_realdata"]


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


def _targets(result: RealdataResult) -> str:
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
    return table(["target", "measured", "verdict"], [
        ["`ett-stream` reaches the target accuracy no later than the best other policy (medians)",
         f"ett-stream {s(t.ett_stream_seconds_to_target)}, best other "
         + (f"{t.best_other_policy} {s(t.best_other_seconds_to_target)}" if t.best_other_policy else "none reached it"),
         verdict(t.no_later_than_best_met)],
        [f"`ett-stream` reaches it ≥ 2{TIMES} sooner than `static`", speed, verdict(t.speedup_met)],
        [f"`ett-stream`'s median step time (wall period) within 15% of the oracle (control "
         f"{TIMES} n / Σ 1/s_i)",
         f"{figure(t.ett_stream_wall_period_seconds, '.0f', 1e3)} ms against "
         f"{figure(t.oracle_step_seconds, '.0f', 1e3)} ms (control {figure(t.control_wall_period_seconds, '.0f', 1e3)}"
         f" ms) = {figure(t.over_oracle, '.2f')}{TIMES}"
         + (" — the control ran slower than the heterogeneous fleet, so this oracle bounds nothing"
            if t.oracle_is_bound is False else ""),
         "not judged" if t.oracle_is_bound is False else verdict(t.oracle_met)],
    ])


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
        _targets(result),
        table(["policy", "runs", "s to target (median)", "s to target, each run", "steps to target",
               "step ms (wall period)", "slowest rank's step ms", "SE (median)", "samples per step by device",
               "final accuracy", "unaccounted"], rows),
        f"![realdata]({ctx.link(png)})",
    ])
