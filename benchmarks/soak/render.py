"""`bench soak`'s plot and its section of BENCHMARKS.md."""

from __future__ import annotations

from pathlib import Path

from ..common import RenderContext, num, pyplot, save_figure, table, verdict
from .results import SoakResult

__all__ = ["plot_soak", "render_soak"]


def plot_soak(result: SoakResult, png: Path) -> Path:
    """RSS of every process, records retained and lag over time, phases shaded."""
    series = result.series
    t = [v / 60.0 for v in series.t]
    fig, axes = pyplot().subplots(1, 3, figsize=(13, 3.6))
    for name, values in sorted(series.rss_mb.items()):
        pts = [(x, v) for x, v in zip(t, values, strict=True) if v is not None]
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], label=name, lw=1)
    axes[1].plot(t, series.retained_total, label="all 32 topics" if result.devices == 32 else "all topics")
    axes[1].plot(t, series.retained_max_topic, label="largest topic")
    axes[2].plot(t, series.lag_total, label="total")
    axes[2].plot(t, series.lag_max, label="largest device")
    for ax in axes:
        for phase in result.phases:
            if phase.truncation == "bounded":
                ax.axvspan(phase.start_s / 60.0, phase.end_s / 60.0, color="grey", alpha=0.12)
        ax.set_xlabel("minutes (grey: bounded; white: truncate)")
        ax.grid(alpha=0.3)
    axes[0].set(ylabel="RSS (MiB)", title="resident memory per process")
    axes[0].legend(fontsize=6, ncol=2)
    axes[1].set(ylabel="records", title="records retained on the broker")
    axes[1].legend(fontsize=8)
    axes[2].set(ylabel="records", title="lag (high watermark - committed)")
    axes[2].legend(fontsize=8)
    fig.suptitle(f"soak: {result.devices} streams at ScaDLES {result.setup.rate_preset} "
                 f"(~{result.setup.arrival_rate_total:,.0f} samples/s), {result.ranks} ranks, "
                 f"{result.minutes:g} min", fontsize=9)
    return save_figure(fig, png)


def _targets(result: SoakResult) -> str:
    procs, bounded, phases = result.processes, result.bounded, result.phases
    peak_total = sum(p.peak_rss_mb for p in procs.values())
    return table(["target", "measured", "paper", "verdict"], [
        ["memory of every process bounded (RSS slope over the second half)",
         f"peak RSS {num(max((p.peak_rss_mb for p in procs.values()), default=None), 0)} MiB "
         f"(largest process), {num(peak_total, 0)} MiB all processes",
         "not reported (ScaDLES reports buffer sizes, not process memory)", verdict(bounded.memory)],
        ["retained records bounded under truncate and bounded",
         "; ".join(f"{p.truncation}: peak {num(p.retained_records_peak)}, slope "
                   f"{num(p.retained_slope_records_per_min_second_half, 0)}/min" for p in phases),
         "ScaDLES Table IV: truncation keeps buffers 848x-9,429x smaller than persistence",
         verdict(bounded.retained_records)],
        ["no device topic keeps growing", "; ".join(
            f"{p.truncation}: " + (", ".join(f"device {d} +{num(v, 0)}/min"
                                             for d, v in p.growing_topics_records_per_min.items()) or "none")
            for p in phases), "-", verdict(not any(p.growing_topics_records_per_min for p in phases))],
        ["lag bounded", "; ".join(f"{p.truncation}: peak {num(p.lag_records_peak)}, slope "
                                  f"{num(p.lag_slope_records_per_min_second_half, 0)}/min" for p in phases),
         "—", verdict(bounded.lag)],
    ])


def _notes(result: SoakResult) -> list[str]:
    notes = []
    growing = sorted({d for p in result.phases for d in p.growing_topics_records_per_min}, key=int)
    if growing:
        notes.append(f"Device topic(s) {', '.join(growing)} kept growing: their rank kept up with the stream, so "
                     "the backlog stayed under the bound, nothing was truncated there, and the coordinator's "
                     "DeleteRecords - which only removes truncated records, never past a truncate-before offset - "
                     "deleted nothing: the topic keeps every trained record, as under persistence.")
    grew = sorted(n for n, p in result.processes.items() if not p.bounded)
    if grew:
        notes.append(f"Memory still rising in the second half: {', '.join(grew)}. A run of {result.minutes:g} "
                     "minutes includes warm-up (the broker's JVM heap grows towards -Xmx, the ranks' allocator "
                     "pools fill after the coordinator restart); `--minutes 30` is the run that decides.")
    if len(result.phases) > 1:
        notes.append("The spike at the phase change is the coordinator restart: no plans, truncation or "
                     "DeleteRecords until the new coordinator has started and rebuilt its state from Kafka.")
    return notes


def render_soak(result: SoakResult, ctx: RenderContext) -> str:
    """The `soak` section of BENCHMARKS.md: targets, every process's memory, notes, the plot."""
    png = plot_soak(result, ctx.plot_path("soak.png"))
    setup = result.setup
    rows = [[name, p.peak_rss_mb, p.final_rss_mb, num(p.slope_mb_per_min_second_half), p.samples]
            for name, p in sorted(result.processes.items())]
    return "\n\n".join([
        f"Setup: {result.devices} device streams at ScaDLES {setup.rate_preset} rates (about "
        f"{setup.arrival_rate_total:,.0f} samples/s in all; achieved {num(result.achieved_rate_total, 0)}) from "
        f"{setup.producer_procs} producer processes; {result.ranks} gloo ranks train devices 0-{result.ranks - 1}, "
        f"the other {result.devices - result.ranks} streams are consumed by truncation alone (the benchmark "
        f"commits the coordinator's truncate-before offsets for them); `truncate` then `bounded` "
        f"(max {setup.max_lag_samples} samples) for {result.minutes:g} minutes in all, DeleteRecords on. "
        f"Criteria: {result.bounded.criteria}.",
        _targets(result),
        table(["process", "peak RSS MiB", "final RSS MiB", "slope MiB/min (2nd half)", "samples"], rows),
        *_notes(result),
        f"![soak]({ctx.link(png)})",
    ])
