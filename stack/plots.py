"""PNG plots of a run over time, drawn from `series.json` (see `stack.report.build_series`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_series"]


def _smooth(values: list[float], width: int) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    if width <= 1 or len(v) < width:
        return v
    return np.convolve(v, np.ones(width) / width, mode="same")


def plot_series(series: dict[str, Any], out: Path, title: str = "") -> list[Path]:
    """Write the run's plots under `out`; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    devices: dict[str, dict[str, list[Any]]] = series["devices"]
    written: list[Path] = []

    def figure(name: str, rows: int, draw: Callable[[Any], None]) -> None:
        fig, axes = plt.subplots(rows, 1, figsize=(9, 3.2 * rows), sharex=True, squeeze=False)
        draw(axes[:, 0])
        axes[-1, 0].set_xlabel("seconds since start")
        for ax in axes[:, 0]:
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8, loc="upper right")
        if title:
            fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    def per_device(ax: Any, key: str, label: str, step: bool = False) -> None:
        for device, s in devices.items():
            values = [np.nan if v is None else v for v in s[key]]
            if step:
                ax.step(s["t"], values, where="post", label=f"device {device}")
            else:
                ax.plot(s["t"], values, label=f"device {device}", lw=1)
        ax.set_ylabel(label)

    def batch_and_step(axes: Any) -> None:
        per_device(axes[0], "batch", "batch (samples)")
        per_device(axes[1], "step_seconds", "step time (s)")
        axes[0].set_title("per-device batch and step time")

    def straggler(axes: Any) -> None:
        ps = series["per_step"]
        axes[0].plot(ps["t"], [np.nan if v is None else v for v in ps["straggler_effect"]], lw=1, label="SE")
        axes[0].set_ylabel("SE = (max T - min T) / mean T")
        axes[0].set_title("straggler effect per step (compute seconds)")

    def lag_buffer(axes: Any) -> None:
        per_device(axes[0], "lag", "lag (records)")
        per_device(axes[1], "buffer_depth", "buffer (samples)")
        axes[0].set_title("lag (appended - lowest unprocessed) and trainer buffer")

    def truncation(axes: Any) -> None:
        per_device(axes[0], "truncated_cumulative", "samples truncated (cumulative)", step=True)
        axes[0].set_title("truncation")

    def loss(axes: Any) -> None:
        ps = series["per_step"]
        t = np.asarray(ps["t"], dtype=float)
        values = np.asarray([np.nan if v is None else v for v in ps["loss"]], dtype=float)
        known = ~np.isnan(values)
        axes[0].plot(t[known], values[known], lw=0.6, alpha=0.5, label="per step")
        axes[0].plot(t[known], _smooth(list(values[known]), 10), lw=1.5, label="10-step mean")
        axes[0].set_ylabel("training loss (sample-weighted)")
        axes[0].set_title("loss")

    def throughput(axes: Any) -> None:
        rates = series["rates"]
        t = rates["t"]
        for device, r in rates["devices"].items():
            line = axes[0].plot(t, _smooth(r["produced_per_s"], 5), lw=1, ls="--")[0]
            axes[0].plot(t, _smooth(r["trained_per_s"], 5), lw=1.2, color=line.get_color(), label=f"device {device}")
        total_p = np.sum([r["produced_per_s"] for r in rates["devices"].values()], axis=0)
        total_t = np.sum([r["trained_per_s"] for r in rates["devices"].values()], axis=0)
        axes[1].plot(t, _smooth(list(total_p), 5), ls="--", label="produced")
        axes[1].plot(t, _smooth(list(total_t), 5), label="trained")
        axes[0].set_ylabel("samples/s (5 s mean)")
        axes[0].set_title("per device: trained (solid) vs produced (dashed)")
        axes[1].set_ylabel("fleet samples/s")

    def heldout(axes: Any) -> None:
        points = series.get("heldout") or []
        t = [p["t"] for p in points]
        axes[0].plot(t, [np.nan if p.get("accuracy") is None else p["accuracy"] for p in points], marker="o", lw=1.2,
                     label="accuracy")
        axes[0].set_ylabel("held-out accuracy")
        axes[0].set_ylim(0.0, 1.0)
        axes[0].set_title("held-out evaluation (the dataset's test split)")
        axes[1].plot(t, [p["loss"] for p in points], marker="o", lw=1.2, color="tab:red", label="loss")
        axes[1].set_ylabel("held-out loss")

    def prequential(axes: Any) -> None:
        pq = series["prequential"]
        metric, baseline, t = pq["headline"], pq.get("baseline"), pq["t"]
        nan = [np.nan if v is None else v for v in pq[f"{metric}_recent"]]
        axes[0].plot(t, nan, lw=1.5, label=f"last {pq['window_steps']} steps")
        axes[0].plot(t, [np.nan if v is None else v for v in pq[f"{metric}_running"]], lw=1, ls="--", label="run")
        if baseline:
            axes[0].plot(t, [np.nan if v is None else v for v in pq[f"{baseline}_recent"]], lw=1, color="grey",
                         label="baseline")
        held = [(p["t"], p[metric]) for p in series.get("heldout_metrics") or [] if p.get(metric) is not None]
        if held:
            axes[0].plot(*zip(*held, strict=True), marker="o", lw=0, color="tab:red", label="held-out")
        axes[0].set_ylabel(metric)
        axes[0].set_title(f"test-then-train {metric}: every sample scored before the step that trained it")
        axes[1].plot(t, [np.nan if v is None else v for v in pq["loss_recent"]], lw=1.2, label="loss")
        axes[1].set_ylabel(f"test-then-train loss (last {pq['window_steps']} steps)")

    out.mkdir(parents=True, exist_ok=True)
    figure("batch_and_step_time", 2, batch_and_step)
    figure("straggler_effect", 1, straggler)
    figure("lag_and_buffer", 2, lag_buffer)
    figure("truncation", 1, truncation)
    figure("loss", 1, loss)
    figure("samples_per_second", 2, throughput)
    if any(p.get("accuracy") is not None for p in series.get("heldout") or []):  # other objectives: prequential.png
        figure("heldout", 2, heldout)
    if (series.get("prequential") or {}).get("t"):
        figure("prequential", 2, prequential)
    return written
