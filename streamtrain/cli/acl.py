"""`streamtrain acl apply|show`: the roles' least-privilege ACLs (and SCRAM users, topics) on any Kafka cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from streamtrain.runtime.commands import config_from, console, die

if TYPE_CHECKING:
    from streamtrain.config import StreamtrainConfig
    from streamtrain.kafka import KafkaAdmin

app = typer.Typer(
    help=(
        "Least-privilege ACLs for streamtrain's roles on a Kafka cluster whose authorizer is on: producers write "
        "only their device topics; trainers read the device topics and plans and write feedback and dead "
        "letters; only the coordinator writes plans and deletes records; the admin sets up topics, users and "
        "ACLs; the bridge (when bridge.sources names topics) reads its sources and writes device topics and dead "
        "letters in its transactions; serve reads requests and versions and writes predictions; an application "
        "asking serve (the client role) writes requests and reads predictions. Principals are acl.admin, "
        "acl.coordinator, acl.trainer, acl.producer, acl.bridge, acl.serve and acl.client. The command runs as "
        "kafka.sasl_username (a super user, or the admin role once it has its ACLs)."
    ),
    no_args_is_help=True,
)

Devices = Annotated[str | None, typer.Option(help="Comma-separated device ids whose topics the roles may use "
                                             "(default acl.devices, else coordinator.devices).")]
AsBroker = Annotated[Path | None, typer.Option(
    "--as-broker", metavar="DATA_DIR",
    help="Log in as the embedded broker of DATA_DIR itself (its super user) instead of kafka.sasl_username: how "
         "the first ACLs of a fresh embedded broker are made, since nobody else may grant them.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _setup(ctx: typer.Context, devices: str | None, as_broker: Path | None,
           ) -> tuple[StreamtrainConfig, KafkaAdmin, list[str]]:
    from streamtrain.broker import BrokerError, EmbeddedBroker
    from streamtrain.kafka import make_admin

    cfg = config_from(ctx)
    listed = [d.strip() for d in devices.split(",") if d.strip()] if devices else list(
        cfg.acl.devices or cfg.coordinator.devices)
    kafka = cfg.kafka
    if as_broker is not None:
        try:
            kafka = EmbeddedBroker(cfg.broker.model_copy(update={"data_dir": as_broker})).own_identity(kafka)
        except BrokerError as exc:
            die(str(exc))
    return cfg, make_admin(kafka), listed


def _table(rows: list[dict[str, str]], title: str) -> None:
    from rich.table import Table

    table = Table(title=title)
    for column in ("status", "role", "principal", "may", "resource"):
        table.add_column(column)
    styles = {"created": "green", "removed": "yellow", "extra": "yellow", "missing": "red", "foreign": "red"}
    for row in rows:
        kind = "cluster" if row["resource_type"] == "BROKER" else row["resource_type"].lower()
        pattern = "*" if row["pattern"] == "PREFIXED" else ""
        style = styles.get(row["status"], "")
        may = row["operation"] if row["permission"] == "ALLOW" else f"{row['permission']} {row['operation']}"
        table.add_row(f"[{style}]{row['status']}[/]" if style else row["status"], row["role"] or "-",
                      row["principal"], may, f"{kind} {row['resource']}{pattern}")
    console.print(table)


@app.command("apply")
def apply(
    ctx: typer.Context,
    devices: Devices = None,
    users: Annotated[bool, typer.Option(help="Also create or update the SCRAM user of every role principal with "
                                        "a password in acl.passwords.")] = False,
    topics: Annotated[bool, typer.Option(help="Also create the job's topics (device topics, feedback, assignments, "
                                         "dead-letter) that do not exist yet.")] = False,
    prune: Annotated[bool, typer.Option(help="Also delete ACLs of the role principals on this job's topics and "
                                        "group that no role needs.")] = False,
    dry_run: Annotated[bool, typer.Option(help="Change nothing; say what would change.")] = False,
    as_json: AsJson = False,
    as_broker: AsBroker = None,
) -> None:
    """Create the roles' ACLs that are missing; a second run changes nothing and says so.

    Other principals' ACLs are left alone. With --users the SCRAM users are written first, with --topics the
    topics are created last (by the client's principal: the admin role may create them).
    """
    from confluent_kafka import KafkaException

    from streamtrain.acl import apply_acls, apply_users, create_topics

    cfg, admin, listed = _setup(ctx, devices, as_broker)
    try:
        written = apply_users(admin, cfg, listed) if users and not dry_run else []
        plan = apply_acls(admin, cfg, listed, prune=prune, dry_run=dry_run)
        created_topics = create_topics(admin, cfg, listed) if topics and not dry_run else []
    except (KafkaException, ValueError) as exc:
        die(str(exc))
    rows = [{"status": status, **acl.to_dict()} for status, acl in plan.rows()]
    if as_json:
        console.print_json(json.dumps({"changed": plan.changed or bool(written or created_topics),
                                       "dry_run": dry_run, "acls": rows, "users": written,
                                       "topics_created": created_topics}))
        return
    _table(rows, f"ACLs of streamtrain's roles ({'dry run' if dry_run else 'applied'})")
    verb = "would create" if dry_run else "created"
    if written:
        console.print(f"SCRAM users written: {', '.join(written)}", highlight=False)
    if created_topics:
        console.print(f"topics created: {', '.join(created_topics)}", highlight=False)
    if not plan.create and not plan.removed:
        console.print(f"nothing to change: all {len(plan.present)} ACLs already present", highlight=False)
    else:
        console.print(f"{verb} {len(plan.create)} ACLs, {len(plan.present)} already present"
                      + (f", {'would remove' if dry_run else 'removed'} {len(plan.removed)}" if plan.removed else ""),
                      highlight=False)
    if plan.extra and not plan.removed:
        console.print(f"{len(plan.extra)} extra ACLs of these principals on this job's resources (--prune removes "
                      "them)", highlight=False)


@app.command("show")
def show(ctx: typer.Context, devices: Devices = None, as_json: AsJson = False, as_broker: AsBroker = None) -> None:
    """List the ACLs that concern this job: the roles' own (present or missing) and any other principal's on its
    topics and group (status foreign: a right streamtrain did not grant)."""
    from confluent_kafka import KafkaException

    from streamtrain.acl import concerns_job, describe_acls, role_acls

    cfg, admin, listed = _setup(ctx, devices, as_broker)
    try:
        existing = describe_acls(admin)
        wanted = {a: a for a in role_acls(cfg, listed)} if listed else {}
    except (KafkaException, ValueError) as exc:
        die(str(exc))
    principals = {a.principal: a.role for a in wanted}
    prefix = f"{cfg.kafka.topic_prefix}."
    group = cfg.trainer_group_id
    rows = []
    for acl in existing:
        on_job = concerns_job(acl, cfg)
        if acl in wanted:
            rows.append({"status": "ok", **wanted[acl].to_dict()})
        elif acl.principal in principals:
            rows.append({"status": "extra", **acl.to_dict(), "role": principals[acl.principal]})
        elif on_job:
            rows.append({"status": "foreign", **acl.to_dict()})
    present = set(existing)
    rows += [{"status": "missing", **a.to_dict()} for a in wanted if a not in present]
    if as_json:
        console.print_json(json.dumps(rows))
        return
    _table(rows, f"ACLs concerning {prefix}* and group {group}")
    if not listed:
        console.print("no devices given (--devices, acl.devices or coordinator.devices): the roles' own ACLs are "
                      "not checked", highlight=False)
