"""`streamtrain broker start|stop|status|run|cluster-id`: the embedded KRaft broker, one node or several."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from streamtrain.broker.embedded import BrokerError, EmbeddedBroker, new_cluster_id
from streamtrain.runtime.commands import config_from, console, die

app = typer.Typer(
    help=(
        "Run a real Apache Kafka broker (KRaft) from the jars in kafka/libs on local Java: a single node, or, "
        "with --node-id, --quorum-voters and --cluster-id, one node of a multi-node cluster. "
        "One broker per data directory; its state, logs and generated server.properties live there."
    ),
    no_args_is_help=True,
)

DataDir = Annotated[
    Path | None, typer.Option("--data-dir", "-d", help="Broker data directory (setting broker.data_dir).")
]
Port = Annotated[
    int | None, typer.Option(help="Client port; 0 = a free one, kept across restarts (setting broker.port).")
]
ControllerPort = Annotated[
    int | None, typer.Option(help="KRaft controller port; 0 = a free one (setting broker.controller_port).")
]
Host = Annotated[str | None, typer.Option(help="Listen and advertised address (setting broker.host).")]
Heap = Annotated[str | None, typer.Option(help="Java heap, e.g. 768m or 2g (setting broker.heap).")]
LogFile = Annotated[
    Path | None, typer.Option(help="Broker log file; default DATA_DIR/broker.log (setting broker.log_file).")
]
NodeId = Annotated[int | None, typer.Option(help="KRaft node id, unique in the cluster (setting broker.node_id).")]
QuorumVoters = Annotated[
    str | None,
    typer.Option(help="Controller quorum of a multi-node cluster, id@host:port,... the same on every node "
                      "(setting broker.quorum_voters)."),
]
ClusterId = Annotated[
    str | None,
    typer.Option(help="KRaft cluster id every node is formatted with (setting broker.cluster_id; "
                      "`streamtrain broker cluster-id` makes one)."),
]


def _broker(ctx: typer.Context, **flags: object) -> EmbeddedBroker:
    cfg = config_from(ctx, {f"broker.{k}": v for k, v in flags.items()})
    return EmbeddedBroker(cfg.broker)


@app.command()
def start(
    ctx: typer.Context,
    data_dir: DataDir = None,
    port: Port = None,
    controller_port: ControllerPort = None,
    host: Host = None,
    heap: Heap = None,
    log_file: LogFile = None,
    timeout: Annotated[
        float | None,
        typer.Option(help="Seconds to wait for the broker to answer (setting broker.start_timeout_seconds)."),
    ] = None,
    node_id: NodeId = None,
    quorum_voters: QuorumVoters = None,
    cluster_id: ClusterId = None,
) -> None:
    """Start the broker in the background; return once it answers and print its bootstrap address.

    Starting again on the same data directory keeps the topics and records (and the port, if free).
    Example: `export STREAMTRAIN_KAFKA__BOOTSTRAP_SERVERS=$(streamtrain broker start -d /tmp/kafka)`.
    """
    broker = _broker(ctx, data_dir=data_dir, port=port, controller_port=controller_port, host=host, heap=heap,
                     log_file=log_file, start_timeout_seconds=timeout, node_id=node_id, quorum_voters=quorum_voters,
                     cluster_id=cluster_id)
    began = time.monotonic()
    try:
        with console.status(f"starting Kafka broker in {broker.data_dir} ...", spinner="dots"):
            bootstrap = broker.start()
    except BrokerError as exc:
        die(str(exc))
    typer.echo(bootstrap)
    typer.echo(f"broker answering after {time.monotonic() - began:.1f} s; log: {broker.log_path}", err=True)


@app.command()
def stop(
    ctx: typer.Context,
    data_dir: DataDir = None,
    timeout: Annotated[
        float | None,
        typer.Option(help="Seconds to wait for a clean shutdown before SIGKILL (setting broker.stop_timeout_seconds)."),
    ] = None,
) -> None:
    """Shut the broker down cleanly (SIGTERM, controlled shutdown); kill it only after the timeout."""
    broker = _broker(ctx, data_dir=data_dir, stop_timeout_seconds=timeout)
    if broker.pid() is None:
        typer.echo(f"no broker running in {broker.data_dir}", err=True)
        return
    began = time.monotonic()
    with console.status("stopping Kafka broker ...", spinner="dots"):
        clean = broker.stop()
    how = "cleanly" if clean else "by SIGKILL after the timeout"
    typer.echo(f"broker stopped {how} in {time.monotonic() - began:.1f} s", err=True)


@app.command()
def status(
    ctx: typer.Context,
    data_dir: DataDir = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
) -> None:
    """Report whether the broker runs and answers. Exit status 0 when healthy, 1 otherwise."""
    report = _broker(ctx, data_dir=data_dir).status()
    if as_json:
        typer.echo(report.to_json())
    else:
        mark = "[green]healthy[/]" if report.healthy else "[red]not healthy[/]"
        console.print(f"{mark}: {report.detail}")
        for label, value in (("data dir", report.data_dir), ("bootstrap", report.bootstrap), ("pid", report.pid),
                             ("version", report.version), ("topics", report.topics),
                             ("uptime", f"{report.uptime_s:.0f} s" if report.uptime_s is not None else None)):
            if value is not None:
                console.print(f"  {label:<10} {value}", highlight=False)
    raise typer.Exit(0 if report.healthy else 1)


@app.command()
def run(
    ctx: typer.Context,
    data_dir: DataDir = None,
    port: Port = None,
    controller_port: ControllerPort = None,
    host: Host = None,
    heap: Heap = None,
    node_id: NodeId = None,
    quorum_voters: QuorumVoters = None,
    cluster_id: ClusterId = None,
) -> None:
    """Run the broker in the foreground (for containers and process supervisors); logs go to stdout.

    A node of a three-node cluster (run on each host with its own id and address, the same voters and id):
    `streamtrain broker run -d /data --host 10.0.0.11 --port 9092 --node-id 1 --cluster-id $ID
    --quorum-voters 1@10.0.0.11:9093,2@10.0.0.12:9093,3@10.0.0.13:9093`.
    """
    broker = _broker(ctx, data_dir=data_dir, port=port, controller_port=controller_port, host=host, heap=heap,
                     node_id=node_id, quorum_voters=quorum_voters, cluster_id=cluster_id)
    try:
        broker.exec_foreground()
    except BrokerError as exc:
        die(str(exc))


@app.command("cluster-id")
def cluster_id_command() -> None:
    """Print a new KRaft cluster id, for --cluster-id on every node of a new multi-node cluster."""
    typer.echo(new_cluster_id())
