"""`streamtrain audit`: the accounting `up` does at the end of a run, for a deployment it did not start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from streamtrain.runtime.commands import config_from, console, die

__all__ = ["audit", "register"]


def register(app: typer.Typer) -> None:
    app.command("audit")(audit)


def audit(
    ctx: typer.Context,
    devices: Annotated[str | None, typer.Option(
        help="Comma-separated device ids whose topics to account (default coordinator.devices).")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds each topic may take to deliver its records.")] = 60.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    out: Annotated[Path | None, typer.Option(help="Also write the audit as JSON to this file.")] = None,
) -> None:
    """Account for every record of every device topic of a running or stopped deployment (docker compose, hosts of
    your own): trained, truncated, dead-lettered, pending (not processed yet: resumable from the committed offset)
    or unaccounted (processed past with no record of its fate), read back from Kafka alone: the device topics, the
    trainers' committed offsets, the feedback and dead-letter topics, and the models topic for the newest version's
    lineage. Connect as a principal that may read every topic under the prefix and describe the trainers' group
    (the admin role, acl.admin). Exit status 1 when a record is unaccounted for, or the topics hold records and none
    was trained: the rule of `streamtrain up`.
    """
    from streamtrain.report.audit import audit_deployment
    from streamtrain.report.ledger import ReadInterrupted

    cfg = config_from(ctx)
    listed = [d.strip() for d in devices.split(",") if d.strip()] if devices else list(cfg.coordinator.devices)
    if not listed:
        die("no devices to audit: give --devices (the DEVICE_IDS of the deployment)", code=2)
    try:
        result = audit_deployment(cfg, listed, timeout)
    except (ReadInterrupted, TimeoutError) as exc:
        die(f"could not read the deployment back from {cfg.kafka.bootstrap_servers}: {exc}")
    summary = result.summary()
    if out is not None:
        out.write_text(json.dumps(summary, indent=2) + "\n")
    if as_json:
        console.print_json(json.dumps(summary))
    else:
        _table(summary)
    if result.failures():
        raise typer.Exit(1)


def _table(summary: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"audit of job {summary['job']}")
    columns = ("device", "records", "trained", "truncated", "dead_lettered", "pending", "unaccounted", "retrained",
               "in_newest_version")
    for column in columns:
        table.add_column(column.replace("_", " "), justify="left" if column == "device" else "right")
    for row in summary["devices"]:
        table.add_row(*(f"{row[c]:,}" if isinstance(row[c], int) else str(row[c] if row[c] is not None else "-")
                        for c in columns))
    console.print(table)
    newest = summary["newest_version"]
    versions = f"{summary['versions']} versions announced" + (
        f", the newest v{newest['version']} at step {newest['step']}" if isinstance(newest, dict) else "")
    console.print(f"{summary['records']:,} records: {summary['trained']:,} trained, {summary['unaccounted']:,} "
                  f"unaccounted; {versions}", highlight=False)
    for failure in summary["failures"]:
        console.print(f"[bold red]failure:[/] {failure}", highlight=False)
