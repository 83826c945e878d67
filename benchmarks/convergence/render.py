"""The convergence benchmark's plot and its section of BENCHMARKS.md."""

from __future__ import annotations

from pathlib import Path

from ..common import TIMES, RenderContext, num, pyplot, save_figure, table, verdict
from .results import ConvergenceCell, ConvergenceResult, smoothed

__all__ = ["plot_convergence", "render_convergence"]

_STYLES = {"sgd": ("black", "-", 3.0), "weighted": ("tab:blue", "--", 1.6), "plain": ("tab:red", "-", 1.4)}
_LABELS = {"sgd": "single-process SGD", "weighted": "weighted (λ = samples)", "plain": "plain DDP average"}


def plot_convergence(result: ConvergenceResult, path: Path) -> Path:
    """Held-out accuracy and loss against samples trained, one line per cell, with the target."""
    setup = result.setup
    fig, (acc_ax, loss_ax) = pyplot().subplots(1, 2, figsize=(11, 4))
    for name, curve in result.curves.items():
        color, style, width = _STYLES.get(name, ("grey", "-", 1.0))
        label = _LABELS.get(name, name)
        acc_ax.plot(curve.samples, smoothed(curve.accuracy, setup.smooth_steps), style, color=color, lw=width,
                    label=label)
        loss_ax.plot(curve.samples, curve.loss, style, color=color, lw=width, label=label)
    target = result.target_accuracy
    acc_ax.axhline(target, color="grey", lw=0.8, ls=":")
    acc_ax.text(0, target, f" target {target:.2f}", va="bottom", color="grey", fontsize=8)
    acc_ax.set(xlabel="samples trained (global)", ylabel="held-out accuracy",
               title=f"accuracy (trailing mean of {setup.smooth_steps} steps)")
    loss_ax.set(xlabel="samples trained (global)", ylabel="held-out cross-entropy", title="loss")
    acc_ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"convergence with uneven batches: {setup.world} gloo ranks, shares {list(setup.shares)}, "
                 f"idle p={setup.idle_probability}, non-IID ({setup.labels_per_device} classes/device)",
                 fontsize=9)
    return save_figure(fig, path)


def _stay(cell: ConvergenceCell) -> str:
    samples = cell.samples_to_stay_at_target
    return "never settles at it within the run" if samples is None else f"stays at it from {samples:,} samples"


def render_convergence(result: ConvergenceResult, ctx: RenderContext) -> str:
    """The `convergence` section of BENCHMARKS.md: targets, the cells, the plot."""
    png = plot_convergence(result, ctx.plot_path("convergence.png"))
    setup, sched = result.setup, result.schedule
    rows = [[c.aggregation, c.samples_to_target, c.steps_to_target,
             "—" if c.ratio_to_sgd is None else f"{c.ratio_to_sgd:.3f}",
             "never" if c.samples_to_stay_at_target is None else c.samples_to_stay_at_target,
             f"{c.final_accuracy:.3f}", f"{c.final_heldout_loss:.3f}"] for c in result.cells]
    weighted, plain, sgd = result.cell("weighted"), result.cell("plain"), result.cell("sgd")
    ratio = weighted.ratio_to_sgd if weighted else None
    gap = None if plain is None or sgd is None else sgd.final_accuracy - plain.final_accuracy
    targets = table(["target", "measured", "paper", "verdict"], [
        ["weighted: samples to target within 5% of single-process SGD",
         "—" if ratio is None or weighted is None or sgd is None else
         f"{ratio:.3f}{TIMES} SGD ({weighted.samples_to_target:,} vs {sgd.samples_to_target:,} samples); "
         f"parameters differ by {result.weighted_vs_sgd_max_param_diff:.1e} after {setup.steps} steps",
         "LB-BSP §3.4: weighted aggregation gives \"identical statistical efficiency\" to BSP",
         verdict(None if ratio is None else abs(ratio - 1.0) <= 0.05)],
        ["plain averaging shows its bias",
         "—" if gap is None or plain is None or sgd is None else
         f"final accuracy {plain.final_accuracy:.3f} vs SGD {sgd.final_accuracy:.3f} "
         f"({gap * 100:.1f} points {'lower' if gap > 0 else 'higher'}), held-out loss "
         f"{plain.final_heldout_loss:.3f} vs {sgd.final_heldout_loss:.3f}; first reaches the target at "
         f"{num(plain.ratio_to_sgd, 3)}{TIMES} SGD's samples but {_stay(plain)} (SGD {_stay(sgd)})",
         "LB-BSP §3.4: naive averaging reached 43% training accuracy vs 59% for BSP (Inception-V3, 20 epochs)",
         verdict(None if gap is None else gap > 0)],
    ])
    return "\n\n".join([
        f"Setup: {setup.world} gloo ranks on the CPU, {setup.steps} steps, expected per-rank shares "
        f"{num(setup.shares)} of a global batch drawn in [{setup.batch_min}, {setup.batch_max}], each rank "
        f"idle with probability {setup.idle_probability} ({sched.idle_rank_steps} of {sched.rank_steps} "
        f"rank-steps idle, {sched.empty_steps} empty steps); non-IID ({setup.labels_per_device} of "
        f"{setup.classes} classes per device), sizes normal mean {setup.size_mean:g} DIF "
        f"{setup.size_dif:g}, signal {setup.signal:g}. Target: held-out accuracy "
        f"{result.target_accuracy:.2f} (trailing mean of {setup.smooth_steps} steps); held-out set of "
        f"{setup.heldout:,} samples from the same device streams in the same proportions. "
        f"Run time {result.seconds:.0f} s.",
        targets,
        table(["aggregation", "samples to target", "steps", "ratio to SGD", "samples to stay at target",
               "final accuracy", "final held-out loss"], rows),
        f"![convergence]({ctx.link(png)})",
    ])
