"""PNG plots of a run over time, drawn from `series.json` (see `streamtrain.report.figures.build_series`)."""

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


def _per_device(ax: Any, series: dict[str, Any], key: str, label: str, step: bool = False) -> None:
    for device, s in series["devices"].items():
        values = [np.nan if v is None else v for v in s[key]]
        if step:
            ax.step(s["t"], values, where="post", label=f"device {device}")
        else:
            ax.plot(s["t"], values, label=f"device {device}", lw=1)
    ax.set_ylabel(label)


def _batch_and_step(axes: Any, series: dict[str, Any]) -> None:
    _per_device(axes[0], series, "batch", "batch (samples)")
    _per_device(axes[1], series, "step_seconds", "step time (s)")
    axes[0].set_title("per-device batch and step time")


def _straggler(axes: Any, series: dict[str, Any]) -> None:
    ps = series["per_step"]
    axes[0].plot(ps["t"], [np.nan if v is None else v for v in ps["straggler_effect"]], lw=1, label="SE")
    axes[0].set(ylabel="SE = (max T - min T) / mean T", title="straggler effect per step (compute seconds)")


def _lag_buffer(axes: Any, series: dict[str, Any]) -> None:
    _per_device(axes[0], series, "lag", "lag (records)")
    _per_device(axes[1], series, "buffer_depth", "buffer (samples)")
    axes[0].set_title("lag (appended - lowest unprocessed) and trainer buffer")


def _truncation(axes: Any, series: dict[str, Any]) -> None:
    _per_device(axes[0], series, "truncated_cumulative", "samples truncated (cumulative)", step=True)
    axes[0].set_title("truncation")


def _loss(axes: Any, series: dict[str, Any]) -> None:
    ps = series["per_step"]
    t = np.asarray(ps["t"], dtype=float)
    values = np.asarray([np.nan if v is None else v for v in ps["loss"]], dtype=float)
    known = ~np.isnan(values)
    axes[0].plot(t[known], values[known], lw=0.6, alpha=0.5, label="per step")
    axes[0].plot(t[known], _smooth(list(values[known]), 10), lw=1.5, label="10-step mean")
    axes[0].set(ylabel="training loss (sample-weighted)", title="loss")


def _throughput(axes: Any, series: dict[str, Any]) -> None:
    rates = series["rates"]
    t = rates["t"]
    for device, r in rates["devices"].items():
        line = axes[0].plot(t, _smooth(r["produced_per_s"], 5), lw=1, ls="--")[0]
        axes[0].plot(t, _smooth(r["trained_per_s"], 5), lw=1.2, color=line.get_color(), label=f"device {device}")
    total_p = np.sum([r["produced_per_s"] for r in rates["devices"].values()], axis=0)
    total_t = np.sum([r["trained_per_s"] for r in rates["devices"].values()], axis=0)
    axes[1].plot(t, _smooth(list(total_p), 5), ls="--", label="produced")
    axes[1].plot(t, _smooth(list(total_t), 5), label="trained")
    axes[0].set(ylabel="samples/s (5 s mean)", title="per device: trained (solid) vs produced (dashed)")
    axes[1].set_ylabel("fleet samples/s")


def _heldout(axes: Any, series: dict[str, Any]) -> None:
    points = series.get("heldout") or []
    t = [p["t"] for p in points]
    axes[0].plot(t, [np.nan if p.get("accuracy") is None else p["accuracy"] for p in points], marker="o", lw=1.2,
                 label="accuracy")
    axes[0].set(ylabel="held-out accuracy", ylim=(0.0, 1.0), title="held-out evaluation (the dataset's test split)")
    axes[1].plot(t, [p["loss"] for p in points], marker="o", lw=1.2, color="tab:red", label="loss")
    axes[1].set_ylabel("held-out loss")


def _nan(values: list[float | None]) -> list[float]:
    return [np.nan if v is None else v for v in values]


def _prequential(axes: Any, series: dict[str, Any]) -> None:
    pq = series["prequential"]
    metric, baseline, t = pq["headline"], pq.get("baseline"), pq["t"]
    axes[0].plot(t, _nan(pq[f"{metric}_recent"]), lw=1.5, label=f"last {pq['window_steps']} steps")
    axes[0].plot(t, _nan(pq[f"{metric}_running"]), lw=1, ls="--", label="run")
    if baseline:
        axes[0].plot(t, _nan(pq[f"{baseline}_recent"]), lw=1, color="grey", label="baseline")
    held = [(p["t"], p[metric]) for p in series.get("heldout_metrics") or [] if p.get(metric) is not None]
    if held:
        axes[0].plot(*zip(*held, strict=True), marker="o", lw=0, color="tab:red", label="held-out")
    axes[0].set(ylabel=metric, title=f"test-then-train {metric}: every sample scored before the step that trained it")
    axes[1].plot(t, _nan(pq["loss_recent"]), lw=1.2, label="loss")
    axes[1].set_ylabel(f"test-then-train loss (last {pq['window_steps']} steps)")


#: Every plot of a run: its file name, its rows, what draws it.
_FIGURES: tuple[tuple[str, int, Callable[[Any, dict[str, Any]], None]], ...] = (
    ("batch_and_step_time", 2, _batch_and_step), ("straggler_effect", 1, _straggler),
    ("lag_and_buffer", 2, _lag_buffer), ("truncation", 1, _truncation), ("loss", 1, _loss),
    ("samples_per_second", 2, _throughput), ("heldout", 2, _heldout), ("prequential", 2, _prequential))


def _drawn(name: str, series: dict[str, Any]) -> bool:
    """Whether the run has what plot `name` draws: held-out accuracy (other objectives' held-out points are on the
    test-then-train plot), test-then-train figures."""
    if name == "heldout":
        return any(p.get("accuracy") is not None for p in series.get("heldout") or [])
    if name == "prequential":
        return bool((series.get("prequential") or {}).get("t"))
    return True


def plot_series(series: dict[str, Any], out: Path, title: str = "") -> list[Path]:
    """Write the run's plots under `out` (the held-out and test-then-train ones when the run has their figures);
    returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, rows, draw in _FIGURES:
        if not _drawn(name, series):
            continue
        fig, axes = plt.subplots(rows, 1, figsize=(9, 3.2 * rows), sharex=True, squeeze=False)
        draw(axes[:, 0], series)
        axes[-1, 0].set_xlabel("seconds since start")
        for ax in axes[:, 0]:
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8, loc="upper right")
        if title:
            fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        written.append(out / f"{name}.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written
