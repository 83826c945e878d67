"""`ClusterBed`: the multi-host test bed on one machine, its processes, and the faults done to it.

A bed is a directory (`cluster.json`: the run, its hosts and every service's command line and pid;
`logs/<service>.log`; each Kafka node's data; the trainers' shared checkpoints) and a `Network` of
namespaces. Each host runs one service, started as `ip netns exec <host> <command>` in a session of
its own; the bed records its pid, so a later `streamtrain cluster ...` in another process can stop,
kill or restart it. Faults are what they would be on machines: SIGKILL of every process on a host,
its cable pulled (`cut`) and plugged back (`restore`), a clean stop and start.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from streamtrain.broker import new_cluster_id
from streamtrain.config import ENV_PREFIX, StreamtrainConfig

from .health import brokers_in_cluster, http_json, under_replicated, wait_until
from .netns import HostNet, Network, kill_namespace, namespace_pids, new_run_id, process_start_time, sweep
from .topology import (
    COORDINATOR_PORT,
    HOSTS,
    KAFKA_HOSTS,
    KAFKA_PORT,
    RANK_METRICS_PORT,
    TRAINER_HOSTS,
    ClusterSpec,
    Topology,
)

__all__ = ["BedError", "ClusterBed", "ServiceState"]

logger = logging.getLogger(__name__)

STATE_FILE = "cluster.json"


class BedError(RuntimeError):
    """The bed is not in the state asked for (no such bed, a service that would not start); the message says why."""


@dataclass
class ServiceState:
    """One host's service: its command line, what it adds to the environment, and its current process."""

    host: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    pid: int | None = None
    pid_start: int | None = None
    starts: int = 0
    stopped: bool = False
    """Stopped on purpose (`stop`), as opposed to not started yet or killed."""


class ClusterBed:
    """One bed: its network, its services and their state directory.

    Args:
        state_dir: the bed's directory.
        network: its namespaces and bridge.
        cluster_id: the Kafka cluster's id.
        spec: the bed's settings.
        services: host name -> its service (commands set by `configure`).
        job: the job the services run.
    """

    def __init__(self, state_dir: Path, network: Network, cluster_id: str, spec: ClusterSpec,
                 services: dict[str, ServiceState] | None = None, job: str = "") -> None:
        self.state_dir = state_dir.resolve()
        self.network = network
        self.cluster_id = cluster_id
        self.spec = spec
        self.services = services or {}
        self.job = job
        self._procs: dict[str, subprocess.Popen[bytes]] = {}  # children of this process, reaped here

    # ---- making and finding a bed -------------------------------------------------------------------

    @classmethod
    def create(cls, state_dir: Path, spec: ClusterSpec, config: StreamtrainConfig,
               owner_pid: int | None) -> ClusterBed:
        """Sweep stale beds, make the network, write the bed's state; nothing runs yet.

        Args:
            state_dir: the bed's directory (created; must not hold a live bed).
            spec: the bed's settings.
            config: the job's configuration.
            owner_pid: the process whose end ends the bed (a test session), or None to keep it until `down`.
        """
        if (state_dir / STATE_FILE).exists():
            raise BedError(f"{state_dir} already holds a test bed: `streamtrain cluster down` it first")
        sweep()
        state_dir.mkdir(parents=True, exist_ok=True)
        (state_dir / "logs").mkdir(exist_ok=True)
        network = Network(new_run_id())
        network.create(HOSTS, owner_pid, state_dir)
        bed = cls(state_dir, network, new_cluster_id(), spec)
        bed.configure(config, spec)
        return bed

    @classmethod
    def load(cls, state_dir: Path) -> ClusterBed:
        """The bed recorded in `state_dir`.

        Raises:
            BedError: there is none.
        """
        try:
            state = json.loads((state_dir / STATE_FILE).read_text())
        except FileNotFoundError:
            raise BedError(f"no test bed in {state_dir} (`streamtrain cluster up` makes one)") from None
        network = Network(state["run_id"], state["subnet"])
        network.hosts = {n: HostNet(**h) for n, h in state["hosts"].items()}
        services = {n: ServiceState(**s) for n, s in state["services"].items()}
        return cls(state_dir, network, state["cluster_id"], ClusterSpec.from_dict(state["spec"]), services,
                   state["job"])

    def save(self) -> None:
        """Write the bed's state (readable by its owner only: the services' environment may hold secrets)."""
        state = {"run_id": self.network.run_id, "subnet": str(self.network.subnet), "cluster_id": self.cluster_id,
                 "job": self.job, "spec": self.spec.to_dict(),
                 "hosts": {n: asdict(h) for n, h in self.network.hosts.items()},
                 "services": {n: asdict(s) for n, s in self.services.items()}}
        path = self.state_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(state, fh, indent=2)
        tmp.replace(path)

    def configure(self, config: StreamtrainConfig, spec: ClusterSpec | None = None) -> Topology:
        """Set every host's command for `config`'s job (the brokers' stay those of the cluster); returns the topology.

        A new job on the same Kafka cluster: the coordinator, trainer and producer hosts must not be running.
        """
        self.spec = spec or self.spec
        topology = self.topology(config)
        for host in HOSTS:
            if host in KAFKA_HOSTS and host in self.services:
                continue
            if host not in KAFKA_HOSTS and self.alive(host):
                raise BedError(f"{host} still runs job {self.job}: stop it before configuring another job")
            self.services[host] = ServiceState(host, topology.command(host), topology.environment(host))
        self.job = config.job
        self.save()
        return topology

    def topology(self, config: StreamtrainConfig) -> Topology:
        """The command lines of this bed's hosts for `config`."""
        addresses = {n: h.address for n, h in self.network.hosts.items()}
        return Topology(addresses, self.spec, config, self.state_dir, self.cluster_id)

    def address(self, host: str) -> str:
        """`host`'s address on the bed's /24."""
        return self.network.hosts[host].address

    @property
    def bootstrap(self) -> str:
        """The three-broker bootstrap list, reachable from this machine too."""
        return ",".join(f"{self.address(h)}:{KAFKA_PORT}" for h in KAFKA_HOSTS)

    @property
    def coordinator_url(self) -> str:
        """Where the coordinator serves /status and /metrics."""
        return f"http://{self.address('coordinator')}:{COORDINATOR_PORT}"

    # ---- processes ---------------------------------------------------------------------------------

    def alive(self, host: str) -> bool:
        """Whether `host`'s service process (the one the bed started last) still runs."""
        svc = self.services.get(host)
        if svc is None or svc.pid is None:
            return False
        proc = self._procs.get(host)
        if proc is not None and proc.poll() is not None:
            return False
        return process_start_time(svc.pid) == svc.pid_start

    def start(self, host: str, argv: list[str] | None = None) -> int:
        """Start `host`'s service (or `argv` as its service from now on); returns its pid.

        Raises:
            BedError: it already runs.
        """
        svc = self.services[host]
        if self.alive(host):
            raise BedError(f"{host} already runs its service (pid {svc.pid})")
        if argv is not None:
            svc.argv = list(argv)
        env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}  # the job's config comes in full
        env |= {**svc.env, "PYTHONUNBUFFERED": "1"}
        svc.starts += 1
        svc.stopped = False
        with self.log_path(host).open("ab") as log:
            log.write(f"\n===== start {svc.starts} of {host} at {time.strftime('%H:%M:%S')} =====\n".encode())
            log.flush()
            proc = subprocess.Popen(["ip", "netns", "exec", self.network.hosts[host].namespace, *svc.argv],
                                    env=env, cwd=self.state_dir, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self._procs[host] = proc
        svc.pid, svc.pid_start = proc.pid, process_start_time(proc.pid)
        self.save()
        logger.info("started %s (pid %d)", host, proc.pid)
        return proc.pid

    def log_path(self, host: str) -> Path:
        """The log of `host`'s service (every start appended, each under a header)."""
        return self.state_dir / "logs" / f"{host}.log"

    def signal(self, host: str, sig: signal.Signals) -> None:
        """Send `sig` to `host`'s service process (if it runs)."""
        svc = self.services[host]
        if self.alive(host) and svc.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(svc.pid, sig)

    def stop(self, host: str, timeout: float = 60.0) -> int | None:
        """SIGTERM `host`'s service and wait; SIGKILL everything on the host after `timeout`.

        Returns:
            Its exit status when this process started it, else None.
        """
        if self.alive(host):
            self.signal(host, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.alive(host) and time.monotonic() < deadline:
                time.sleep(0.1)
            if self.alive(host):
                logger.warning("%s did not stop within %.0f s of SIGTERM; killing it", host, timeout)
        kill_namespace(self.network.hosts[host].namespace)  # stragglers (a rank its agent left behind)
        self.services[host].stopped = True
        self.save()
        return self._reap(host)

    def kill_host(self, host: str) -> int:
        """SIGKILL every process on `host`, as a crash of the machine would; returns how many there were."""
        killed = kill_namespace(self.network.hosts[host].namespace)
        self._reap(host)
        logger.info("killed %d processes on %s", killed, host)
        return killed

    def _reap(self, host: str) -> int | None:
        proc = self._procs.pop(host, None)
        if proc is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.wait(10)
        return None

    def processes(self, host: str) -> int:
        """How many processes run on `host`."""
        return len(namespace_pids(self.network.hosts[host].namespace))

    # ---- the network -------------------------------------------------------------------------------

    def cut(self, host: str) -> None:
        """Pull `host`'s cable: its processes run on, nothing reaches them and they reach nothing."""
        self.network.set_link(host, up=False)
        logger.info("cut %s off the network", host)

    def restore(self, host: str) -> None:
        """Plug `host`'s cable back in."""
        self.network.set_link(host, up=True)
        logger.info("%s is back on the network", host)

    # ---- health ------------------------------------------------------------------------------------

    def broker_ids(self) -> set[int]:
        """Node ids of the brokers in the cluster's metadata now."""
        return brokers_in_cluster(self.bootstrap)

    def wait_brokers(self, timeout: float = 180.0) -> float:
        """Wait until all three brokers are in the cluster and every partition has all its replicas in sync."""
        took = wait_until(lambda: self.broker_ids() == {1, 2, 3}, timeout, "three brokers in the cluster")
        return took + wait_until(lambda: under_replicated(self.bootstrap) == [], timeout, "replicas in sync")

    def wait_coordinator(self, timeout: float = 90.0) -> float:
        """Wait until the coordinator's /status answers."""
        return wait_until(lambda: http_json(f"{self.coordinator_url}/status") is not None, timeout,
                          "the coordinator's /status")

    def coordinator_status(self) -> dict[str, Any] | None:
        """The coordinator's /status, or None when it does not answer."""
        status = http_json(f"{self.coordinator_url}/status")
        return status if isinstance(status, dict) else None

    def restart_broker(self, host: str, timeout: float = 180.0) -> dict[str, float]:
        """Stop `host`'s broker cleanly (controlled shutdown), start it again, wait until it is back in sync.

        Returns:
            Seconds to stop, to rejoin the cluster, and for every replica to be back in sync.
        """
        node = KAFKA_HOSTS.index(host) + 1
        began = time.monotonic()
        self.stop(host, timeout=120)
        stopped = time.monotonic()
        self.start(host)
        rejoined = wait_until(lambda: node in self.broker_ids(), timeout, f"{host} back in the cluster")
        in_sync = wait_until(lambda: under_replicated(self.bootstrap) == [], timeout, "replicas in sync")
        return {"stop_seconds": stopped - began, "rejoin_seconds": rejoined, "in_sync_seconds": rejoined + in_sync}

    def status(self) -> dict[str, Any]:
        """Hosts (address, cable, processes, service), Kafka (brokers, replicas out of sync), coordinator, ranks."""
        hosts = []
        for name, host in self.network.hosts.items():
            svc = self.services.get(name)
            hosts.append({"name": name, "address": host.address, "namespace": host.namespace,
                          "link_up": self.network.link_up(name), "processes": self.processes(name),
                          "service_alive": self.alive(name), "pid": svc.pid if svc else None,
                          "starts": svc.starts if svc else 0, "stopped": svc.stopped if svc else False})
        coord = self.coordinator_status()
        return {
            "run_id": self.network.run_id, "subnet": str(self.network.subnet), "state_dir": str(self.state_dir),
            "job": self.job, "bootstrap": self.bootstrap, "hosts": hosts,
            "kafka": {"brokers": sorted(self.broker_ids()), "under_replicated": under_replicated(self.bootstrap)},
            "coordinator": None if coord is None else {
                k: coord.get(k) for k in ("next_plan_step", "expected_devices", "absent_devices")},
            "ranks_answering": {h: self.ranks_answering(h) for h in TRAINER_HOSTS},
        }

    def ranks_answering(self, host: str) -> int:
        """How many of a trainer node's ranks serve /metrics now."""
        return sum(_answers(url) for url in self.rank_metrics(host))

    def rank_metrics(self, host: str) -> list[str]:
        """The /metrics URLs of a trainer node's ranks (rank r of a node serves on its port + r)."""
        n = len(self.spec.node_devices(TRAINER_HOSTS.index(host)))
        return [f"http://{self.address(host)}:{RANK_METRICS_PORT + r}/metrics" for r in range(n)]

    # ---- the end -----------------------------------------------------------------------------------

    def stop_job(self, timeout: float = 90.0) -> dict[str, int | None]:
        """Stop the producer, both trainer nodes (together: each finishes its step), then the coordinator."""
        codes: dict[str, int | None] = {"producer": self.stop("producer", timeout)}
        for host in TRAINER_HOSTS:
            self.signal(host, signal.SIGTERM)
        for host in TRAINER_HOSTS:
            codes[host] = self.stop(host, timeout)
        codes["coordinator"] = self.stop("coordinator", timeout)
        return codes

    def down(self) -> None:
        """Stop every service in order (brokers last, cleanly), then remove the namespaces, links and registry entry."""
        try:
            self.stop_job(60)
            # All at once: a broker stopped last could not finish its controlled shutdown without a quorum.
            for host in KAFKA_HOSTS:
                self.signal(host, signal.SIGTERM)
            for host in KAFKA_HOSTS:
                self.stop(host, 30)
        finally:
            self.network.destroy()
            with contextlib.suppress(FileNotFoundError):
                (self.state_dir / STATE_FILE).unlink()
        logger.info("test bed %s is down; logs kept in %s", self.network.run_id, self.state_dir / "logs")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False
