"""`bench truncation`'s plot and its section of BENCHMARKS.md."""

from __future__ import annotations

from pathlib import Path

from ..common import TIMES, RenderContext, num, pyplot, save_figure, table, verdict
from .results import TruncationResult

__all__ = ["plot_truncation", "render_truncation"]


def plot_truncation(result: TruncationResult, png: Path) -> Path:
    """Records retained on the broker, trainer buffer depth and loss over steps, one line per policy."""
    fig, axes = pyplot().subplots(1, 3, figsize=(12, 3.4))
    for policy, curve in result.series.items():
        steps = curve.step
        axes[0].plot(steps, [max(1, r) for r in curve.retained_records], label=policy)
        axes[1].plot(steps, curve.buffer_depth, label=policy)
        pts = [(s, v) for s, v in zip(steps, curve.loss, strict=True) if v is not None]
        axes[2].plot([p[0] for p in pts], [p[1] for p in pts], label=policy)
    axes[0].set_yscale("log")
    axes[0].set(xlabel="step", ylabel="records retained on the broker", title="broker log (all device topics)")
    axes[1].set(xlabel="step", ylabel="samples buffered", title="trainer buffers (all ranks)")
    axes[2].set(xlabel="step", ylabel="training loss (mean over ranks)", title="loss")
    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    setup = result.setup
    fig.suptitle(f"{setup.devices} devices at ScaDLES {setup.rate_preset} rates "
                 f"({', '.join(f'{r:g}' for r in setup.rates)} samples/s), b_max {setup.b_max}", fontsize=9)
    return save_figure(fig, png)


def _targets(result: TruncationResult) -> str:
    persist = result.cell("persist")
    lo, hi = result.paper_ratio_range
    rows = []
    for name in ("truncate", "bounded"):
        c = result.cell(name)
        if c is None or persist is None:
            continue
        rows.append([f"`{name}` keeps retained records flat (second-half growth < 5% of `persist`'s); ratio to "
                     f"`persist` after {result.steps} steps",
                     f"{num(c.retained_records_final)} vs {num(persist.retained_records_final)} records = "
                     f"{num(c.retained_ratio_to_persist, 1)}{TIMES} (peak {num(c.retained_records_max)}; growth "
                     f"{num(c.retained_slope_per_step_second_half, 1)} vs "
                     f"{num(persist.retained_slope_per_step_second_half, 1)} records/step)",
                     f"ScaDLES Table IV: {lo:,}{TIMES}-{hi:,}{TIMES} after their (much longer) runs",
                     verdict(c.flat)])
    if persist is not None and persist.accuracy is not None:
        worst = min((c.accuracy for c in result.cells if c.policy != "persist" and c.accuracy is not None),
                    default=None)
        rows.append(["accuracy under truncation within 2 points of persistence",
                     ", ".join(f"{c.policy} {num(c.accuracy, 3)}" for c in result.cells),
                     "ScaDLES: truncation reached the same 95% / 84% targets as persistence",
                     verdict(None if worst is None else worst >= persist.accuracy - 0.02)])
    return table(["target", "measured", "paper", "verdict"], rows)


def _notes(result: TruncationResult) -> list[str]:
    notes = []
    persist, truncate, bounded = result.cell("persist"), result.cell("truncate"), result.cell("bounded")
    if persist is not None and truncate is not None:
        notes.append(
            f"Persistence retains every record produced (rate {TIMES} run time: {persist.seconds:.0f} s for "
            f"{result.steps} steps here), truncation about one step's worth plus what arrives between two "
            "DeleteRecords rounds, so the ratio grows linearly with the length of the run; ScaDLES measured theirs "
            "after training to target accuracy (hours of streams), which is why its ratios are larger than ours "
            f"after {result.steps} steps. Truncation trained {num(truncate.trained_samples)} samples against "
            f"persistence's {num(persist.trained_samples)}: it keeps arrival rate {TIMES} the last step's "
            "cycle (the time between a rank's feedback records), and arrivals jitter around that rate, so a step "
            "sometimes drops a sample a longer one would have trained.")
    if bounded is not None:
        over = [d for d, n in bounded.retained_records_per_device.items() if n > 2 * result.setup.max_lag_samples]
        if over:
            notes.append(
                f"`bounded` falls short on device(s) {', '.join(over)}: their trainers kept up with their streams, so "
                "the backlog never exceeded the bound and nothing was truncated there; the coordinator's "
                "DeleteRecords only removes truncated records (never past a truncate-before offset), so trained "
                "records stay on the broker as under persistence.")
    return notes


def render_truncation(result: TruncationResult, ctx: RenderContext) -> str:
    """The `truncation` section of BENCHMARKS.md: targets with the paper's figures, the cells, the plot."""
    png = plot_truncation(result, ctx.plot_path("truncation.png"))
    setup = result.setup
    cells = table(["policy", "retained records", f"ratio persist{TIMES}/policy", "peak retained", "deleted",
                   "buffer depth", "truncated", "trained", "final loss", "held-out accuracy"],
                  [[c.policy, c.retained_records_final, num(c.retained_ratio_to_persist, 1), c.retained_records_max,
                    c.deleted_records, c.buffer_depth_final, c.truncated, c.trained_samples, num(c.final_loss, 3),
                    num(c.accuracy, 3)] for c in result.cells])
    return "\n\n".join([
        f"Setup: {setup.devices} devices, one gloo rank each, rates drawn from ScaDLES {setup.rate_preset} "
        f"({', '.join(f'{r:g}' for r in setup.rates)} samples/s, seed {setup.seed}); planner "
        f"`{setup.planner}` with at most {setup.b_max} samples per device per step, so the streams outrun "
        f"training; `bounded` keeps at most {setup.max_lag_samples} samples per device; DeleteRecords on for "
        f"`truncate` and `bounded`. N = {result.steps} steps per policy from the moment the producers start "
        f"(run time {result.seconds:.0f} s for all three).",
        _targets(result),
        cells,
        *_notes(result),
        f"![truncation]({ctx.link(png)})",
    ])
