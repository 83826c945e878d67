"""Simulator output: one JSON file (runs with summaries and per-step series) and PNG plots."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .engine import SimResult

__all__ = ["plot_runs", "write_report"]

logger = logging.getLogger(__name__)


def write_report(path: Path, scenario: dict[str, Any], runs: Sequence[tuple[dict[str, Any], SimResult]],
                 series: bool = True) -> None:
    """Write `{"scenario": ..., "runs": [{"policy", **labels, "summary", "series"?}]}` to `path`."""
    payload = {
        "scenario": scenario,
        "runs": [
            {"policy": r.policy, **labels, "summary": r.summary, **({"series": r.series} if series else {})}
            for labels, r in runs
        ],
    }
    path.write_text(json.dumps(payload, indent=1, default=float) + "\n")


def plot_runs(out: Path, runs: Sequence[tuple[dict[str, Any], SimResult]]) -> list[Path]:
    """Per-step plots (step time, SE, backlog) and, for a DIF sweep, time per epoch against DIF."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    panels = (("step_seconds", "step time (s)"), ("straggler_effect", "straggler effect SE"),
              ("backlog", "pending samples (fleet)"), ("global_batch", "global batch (samples)"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.6 * len(panels)), sharex=True)
    for labels, run in runs:
        name = run.policy + "".join(f" {k}={v}" for k, v in labels.items())
        for ax, (key, _) in zip(axes, panels, strict=True):
            ax.plot(run.series[key], label=name, linewidth=0.9)
    for ax, (_, title) in zip(axes, panels, strict=True):
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
    axes[1].axhline(0.1, color="grey", linestyle=":", linewidth=0.8)
    axes[-1].set_xlabel("step")
    axes[0].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path = out / "steps.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    epochs = [(labels, run) for labels, run in runs if "epoch_seconds" in run.summary and "dif" in labels]
    if epochs:
        fig, ax = plt.subplots(figsize=(6, 4))
        for policy in dict.fromkeys(run.policy for _, run in epochs):
            pts = sorted((float(lab["dif"]), run.summary["epoch_seconds"]) for lab, run in epochs
                         if run.policy == policy)
            xs, ys = np.array(pts).T
            ax.plot(xs, ys, marker="o", label=policy)
        ax.set_xlabel("DIF (std of sample size)")
        ax.set_ylabel("time per epoch (s)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out / "epoch_vs_dif.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
