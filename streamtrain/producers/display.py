"""The live progress table and the exit summary of `streamtrain produce` (rich renderables)."""

from __future__ import annotations

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from .service import ProducerSnapshot, ProducerSummary

__all__ = ["progress_view", "summary_view"]

_MAX_ROWS = 16


def _rate(value: float) -> str:
    return "max" if not np.isfinite(value) else f"{value:,.1f}"


def _device_table(snap: ProducerSnapshot, achieved: np.ndarray, title: str) -> Table:
    table = Table(title=title, title_justify="left", expand=False)
    for name in ("device", "target/s", "achieved/s", "sent", "failed", "injected", "MB"):
        table.add_column(name, justify="left" if name == "device" else "right")
    n = len(snap.devices)
    shown = range(n) if n <= _MAX_ROWS else range(_MAX_ROWS - 1)
    for d in shown:
        failed = int(snap.failed[d])
        table.add_row(
            snap.devices[d], _rate(float(snap.target_rates[d])), f"{achieved[d]:,.1f}", f"{int(snap.sent[d]):,}",
            Text(f"{failed:,}", style="bold red" if failed else ""), f"{int(snap.injected[d]):,}",
            f"{snap.bytes_sent[d] / 1e6:,.1f}",
        )
    if n > _MAX_ROWS:
        table.add_row(f"... {n - len(shown)} more", "", "", "", "", "", "")
    targets = snap.target_rates[np.isfinite(snap.target_rates)]
    table.add_section()
    table.add_row(
        "all", _rate(float(targets.sum())) if len(targets) == n else "max", f"{achieved.sum():,.1f}",
        f"{int(snap.sent.sum()):,}", Text(f"{int(snap.failed.sum()):,}", style="bold red" if snap.failed.sum() else ""),
        f"{int(snap.injected.sum()):,}", f"{snap.bytes_sent.sum() / 1e6:,.1f}",
    )
    return table


def progress_view(snap: ProducerSnapshot) -> Group:
    """What the live display shows: per-device rates and counters, queue and broker state."""
    broker = Text("broker up", style="green") if snap.broker_up else Text("broker DOWN: retrying", style="bold red")
    status = Text.assemble(
        f"{snap.elapsed_s:7.1f} s  queue {snap.queued:,}  waits {snap.backpressure_waits:,}  ", broker
    )
    return Group(status, _device_table(snap, snap.achieved_rates, "device streams (achieved: last 5 s)"))


def summary_view(summary: ProducerSummary) -> Group:
    """The exit summary: per-device mean rates over the run, failures and skipped files."""
    snap = summary.final
    parts: list[Table | Text] = [
        Text(f"stopped by {summary.stopped_by} after {snap.elapsed_s:.1f} s; "
             f"{int(snap.sent.sum()):,} records delivered, {int(snap.failed.sum()):,} failed"),
        _device_table(snap, summary.mean_rates, "device streams (achieved: mean over the run)"),
    ]
    if summary.given_up.sum():
        parts.append(Text(f"{int(summary.given_up.sum()):,} samples of stream given up after stalls "
                          "longer than rate.catch_up_seconds (the producer could not keep up)", style="yellow"))
    for failure in summary.failures[:10]:
        parts.append(Text(f"failed: device {failure.device} seq {failure.seq}: {failure.error}", style="red"))
    if len(summary.failures) > 10:
        parts.append(Text(f"... and {int(snap.failed.sum()) - 10:,} more failed deliveries", style="red"))
    for skipped in summary.skipped_files:
        parts.append(Text(f"skipped dataset file {skipped.path}: {skipped.reason}", style="yellow"))
    return Group(*parts)
