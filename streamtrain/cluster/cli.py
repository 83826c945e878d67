"""`streamtrain cluster up|status|down|fault|sweep`: the multi-host test bed, by hand."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from .bed import ClusterBed

__all__ = ["register"]

cluster_app = typer.Typer(
    help=(
        "A multi-host test bed on this machine (needs root: Linux network namespaces). Seven hosts on a private "
        "bridge, each with its own address and processes: three KRaft Kafka nodes (replication factor 3, "
        "min.insync.replicas 2), a producer, a coordinator and two trainer nodes of two ranks each, joined by "
        "torchrun's c10d rendezvous (elastic, 1-2 nodes). Every service runs the command a multi-node production "
        "run uses; `streamtrain cluster status` shows the hosts, `fault` breaks them, `down` removes everything."
    ),
    no_args_is_help=True,
)
fault_app = typer.Typer(help="Break a host of the bed as a machine breaks: SIGKILL, a pulled cable, restarts.",
                        no_args_is_help=True)
cluster_app.add_typer(fault_app, name="fault")

StateDir = Annotated[Path, typer.Option("--dir", "-d", help="The bed's directory (state, logs, Kafka data).")]
Host = Annotated[str, typer.Argument(help="kafka-1|kafka-2|kafka-3|producer|coordinator|trainer-1|trainer-2.")]
DEFAULT_DIR = Path(".streamtrain/cluster")


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add `streamtrain cluster ...` to the root CLI (no benchmarks of its own)."""
    del bench
    app.add_typer(cluster_app, name="cluster")


def _load(state_dir: Path) -> ClusterBed:
    # The bed's modules are imported here, not at the top: `streamtrain --help` stays fast.
    from streamtrain.runtime.commands import die

    from .bed import BedError, ClusterBed

    try:
        return ClusterBed.load(state_dir)
    except BedError as exc:
        die(str(exc))


def _need_namespaces() -> None:
    from streamtrain.runtime.commands import die

    from .netns import netns_unavailable

    reason = netns_unavailable()
    if reason is not None:
        die(f"cannot make the test bed's hosts: {reason}")


@cluster_app.command()
def up(
    ctx: typer.Context,
    state_dir: StateDir = DEFAULT_DIR,
    rate: Annotated[float, typer.Option(help="Samples/s per device of the producer host.")] = 10.0,
    max_samples: Annotated[int | None, typer.Option(help="Samples per device, then the producer stops.")] = None,
    collective_timeout: Annotated[
        float, typer.Option(help="Seconds a trainer node may be away before the other goes on without it.")
    ] = 45.0,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each kind of service to come up.")] = 240.0,
) -> None:
    """Make the hosts and start every service: Kafka nodes, coordinator, trainer nodes, producer.

    Settings given with --set (policy, model, ...) reach every service; the bed sets the addresses, ports,
    bootstrap list, replication and the trainers' rendezvous. Returns once the ranks answer; the bed runs on
    until `streamtrain cluster down`.
    """
    from streamtrain.runtime.commands import config_from, console, die

    from .bed import BedError, ClusterBed
    from .health import wait_until
    from .topology import KAFKA_HOSTS, TRAINER_HOSTS, ClusterSpec

    _need_namespaces()
    cfg = config_from(ctx)
    spec = ClusterSpec(rate=rate, max_samples=max_samples, collective_timeout_seconds=collective_timeout)
    try:
        bed = ClusterBed.create(state_dir, spec, cfg, owner_pid=None)
    except BedError as exc:
        die(str(exc))
    began = time.monotonic()
    try:
        with console.status("starting three Kafka nodes ...", spinner="dots"):
            for host in KAFKA_HOSTS:
                bed.start(host)
            bed.wait_brokers(timeout)
        with console.status("starting the coordinator and two trainer nodes ...", spinner="dots"):
            bed.start("coordinator")
            bed.wait_coordinator(timeout)
            for host in TRAINER_HOSTS:
                bed.start(host)
            wait_until(lambda: all(bed.ranks_answering(h) == 2 for h in TRAINER_HOSTS), timeout,
                       "every rank's /metrics")
        bed.start("producer")
    except (TimeoutError, BedError) as exc:
        die(f"{exc}; the bed is left running for a look at {state_dir / 'logs'} (`streamtrain cluster down`)")
    console.print(f"test bed up in {time.monotonic() - began:.0f} s")
    _print_status(bed.status())


def _print_status(status: dict[str, Any]) -> None:
    from rich.table import Table

    from streamtrain.runtime.commands import console

    table = Table("host", "address", "cable", "processes", "service", "starts", title=f"test bed {status['run_id']} "
                  f"({status['subnet']}, job {status['job']})")
    for h in status["hosts"]:
        state = ("running" if h["service_alive"] else "stopped" if h["stopped"] else
                 "not started" if not h["starts"] else "[red]not running[/]")
        table.add_row(h["name"], h["address"], "up" if h["link_up"] else "[red]cut[/]", str(h["processes"]), state,
                      str(h["starts"]))
    console.print(table)
    kafka = status["kafka"]
    console.print(f"bootstrap  {status['bootstrap']}", highlight=False)
    console.print(f"kafka      brokers {kafka['brokers']}, partitions short of replicas: {kafka['under_replicated']}",
                  highlight=False)
    console.print(f"coordinator {status['coordinator']}", highlight=False)
    console.print(f"ranks answering {status['ranks_answering']}", highlight=False)
    console.print(f"logs       {status['state_dir']}/logs", highlight=False)


@cluster_app.command()
def status(
    state_dir: StateDir = DEFAULT_DIR,
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
) -> None:
    """Hosts (address, cable, processes), Kafka (brokers, partitions short of replicas), coordinator, ranks.

    Exit status 0 when every service started (and not stopped since) runs, every cable is in and every replica is
    in sync.
    """
    report = _load(state_dir).status()
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        _print_status(report)
    healthy = (all(h["link_up"] and (h["service_alive"] or h["stopped"] or not h["starts"]) for h in report["hosts"])
               and report["kafka"]["under_replicated"] == [])
    raise typer.Exit(0 if healthy else 1)


@cluster_app.command()
def down(state_dir: StateDir = DEFAULT_DIR) -> None:
    """Stop every service (producer first, brokers last, each cleanly), then remove the hosts and the bridge."""
    _load(state_dir).down()
    typer.echo(f"test bed down; logs in {state_dir / 'logs'}", err=True)


@cluster_app.command()
def sweep() -> None:
    """Remove beds whose owner is gone (a test run killed mid-way) and any stray stc* namespace or link."""
    from .netns import sweep as sweep_stale

    _need_namespaces()
    removed = sweep_stale()
    typer.echo(f"removed {len(removed)} stale test bed(s){': ' + ', '.join(removed) if removed else ''}", err=True)


@fault_app.command("kill")
def fault_kill(host: Host, state_dir: StateDir = DEFAULT_DIR) -> None:
    """SIGKILL every process on HOST, as a crash of the machine would (`fault start HOST` brings it back)."""
    killed = _load(state_dir).kill_host(host)
    typer.echo(f"killed {killed} processes on {host}", err=True)


@fault_app.command("start")
def fault_start(host: Host, state_dir: StateDir = DEFAULT_DIR) -> None:
    """Start HOST's service again with the command it ran before (the data of a Kafka node is kept)."""
    pid = _load(state_dir).start(host)
    typer.echo(f"started {host} (pid {pid})", err=True)


@fault_app.command("stop")
def fault_stop(host: Host, state_dir: StateDir = DEFAULT_DIR) -> None:
    """Stop HOST's service cleanly (SIGTERM: a broker's controlled shutdown, a trainer's last step and commit)."""
    code = _load(state_dir).stop(host)
    typer.echo(f"stopped {host}" + (f" (exit status {code})" if code is not None else ""), err=True)


@fault_app.command("cut")
def fault_cut(
    host: Host,
    state_dir: StateDir = DEFAULT_DIR,
    seconds: Annotated[float | None, typer.Option("--for", help="Plug the cable back in after this long.")] = None,
) -> None:
    """Pull HOST's cable: its processes run on, cut off from every other host."""
    bed = _load(state_dir)
    bed.cut(host)
    if seconds is None:
        typer.echo(f"{host} is cut off (`streamtrain cluster fault restore {host}`)", err=True)
        return
    time.sleep(seconds)
    bed.restore(host)
    typer.echo(f"{host} was cut off for {seconds:.0f} s and is back", err=True)


@fault_app.command("restore")
def fault_restore(host: Host, state_dir: StateDir = DEFAULT_DIR) -> None:
    """Plug HOST's cable back in."""
    _load(state_dir).restore(host)


@fault_app.command("restart-brokers")
def fault_restart_brokers(state_dir: StateDir = DEFAULT_DIR) -> None:
    """Rolling restart: each Kafka node in turn stopped cleanly, started, and waited for until in sync."""
    from .topology import KAFKA_HOSTS

    bed = _load(state_dir)
    for host in KAFKA_HOSTS:
        took = bed.restart_broker(host)
        typer.echo(f"{host}: stopped in {took['stop_seconds']:.1f} s, back in the cluster after "
                   f"{took['rejoin_seconds']:.1f} s, every replica in sync after {took['in_sync_seconds']:.1f} s",
                   err=True)
