"""The test bed's hosts and the command each one runs: the commands a multi-node production run uses.

Seven hosts on one /24: three Kafka nodes (KRaft broker + controller each, replication factor 3,
min.insync.replicas 2), a producer host, a coordinator host and two trainer nodes with two ranks
each. Every client gets the three-broker bootstrap list. The trainer nodes run torchrun with a c10d
rendezvous hosted by trainer-1's agent (`--nnodes 1:2`, elastic), each rank training a device of its
own node (`--node-devices`). A node cut off waits for the rendezvous (a long store timeout) and rejoins
the group when its cable is back; the node hosting the rendezvous carries on without it meanwhile.

Each host is a network namespace of its own, so its services use the ports production uses (Kafka
9092 and 9093 as in the compose files, 29400 for the rendezvous) without meeting anything else on
the machine. Two things differ from separate machines: every namespace shares the machine's host
name, so torchrun is told each node's address (`--local-addr`) and gloo its interface
(GLOO_SOCKET_IFNAME); and trainer-1 is told it hosts the rendezvous (`is_host=1`), which torchrun
otherwise works out from the host name.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from streamtrain.config import StreamtrainConfig, config_environment
from streamtrain.runtime.commands import CLI_MODULE, module_command

__all__ = [
    "COORDINATOR_PORT",
    "HOSTS",
    "KAFKA_HOSTS",
    "KAFKA_PORT",
    "RANK_METRICS_PORT",
    "TRAINER_HOSTS",
    "ClusterSpec",
    "Topology",
]

KAFKA_HOSTS = ("kafka-1", "kafka-2", "kafka-3")
TRAINER_HOSTS = ("trainer-1", "trainer-2")
#: Host name -> last octet of its address in the bed's /24 (.1 is the machine itself, on the bridge).
HOSTS: dict[str, int] = {"kafka-1": 11, "kafka-2": 12, "kafka-3": 13, "producer": 21, "coordinator": 31,
                         "trainer-1": 41, "trainer-2": 42}
KAFKA_PORT = 9092
CONTROLLER_PORT = 9093
PRODUCER_METRICS_PORT = 9200
COORDINATOR_PORT = 9300
RANK_METRICS_PORT = 9400  # rank r of a node serves on 9400 + r
RENDEZVOUS_PORT = 29400
KEEP_ALIVE_SECONDS = 5  # torchrun's rendezvous heartbeat interval (its default)
INTERFACE = "eth0"


@dataclass(frozen=True)
class ClusterSpec:
    """What the bed runs besides its fixed hosts: devices, how trainer nodes fail and come back, the stream."""

    devices: tuple[str, ...] = ("0", "1", "2", "3")
    """Device streams; trainer-1 trains the first half, trainer-2 the second (one rank each)."""

    collective_timeout_seconds: float = 45.0
    """trainer.collective_timeout_seconds: a trainer node away for less only pauses the group (TCP resends once
    its cable is back); away for longer, the other node restarts its ranks without it."""

    @property
    def keep_alive_attempts(self) -> int:
        """Rendezvous heartbeats a node may miss before it counts as gone: as long as the collective timeout, so
        a node away for less only pauses the group. With torchrun's default (3 missed beats of 5 s) a node cut
        off for 20 s was dropped from the rendezvous, and its return restarted the other node's ranks."""
        return max(3, math.ceil(self.collective_timeout_seconds / KEEP_ALIVE_SECONDS))

    last_call_seconds: int = 5
    """Rendezvous: once a round has its minimum of nodes, how long it waits for more (torchrun's default is 30)."""

    rendezvous_timeout_seconds: int = 3600
    """Rendezvous store timeout (torchrun's read_timeout, default 60): how long a node cut off from the
    rendezvous waits for it to answer again. Its agent then rejoins at the next rendezvous; an agent that gives
    up instead exits with an error, and torchrun then closes the rendezvous, ending the job on every node."""

    max_restarts: int = 20
    """torchrun --max-restarts: group restarts after failures a node's agent makes before it gives up."""

    checkpoint_every: int = 1
    """trainer.checkpoint_every: a restarted group retrains at most this many steps' batches."""

    rank_threads: int = 1
    """trainer.torch_threads of each rank: the bed's hosts share the machine's cores."""

    broker_heap: str = "384m"
    """Java heap of each Kafka node."""

    rate: float = 10.0
    """Samples/s per device of the bed's producer."""

    max_samples: int | None = None
    """Samples per device after which the producer stops (None: until stopped)."""

    sample_size: int = 32
    """Size (frames) of every sample the producer sends."""

    trainer_env: dict[str, str] = field(default_factory=dict)
    """Extra environment of the trainer nodes' commands (plug-ins on PYTHONPATH, a test's seq log)."""

    def node_devices(self, node: int) -> tuple[str, ...]:
        """Devices of trainer node `node` (0-based)."""
        half = (len(self.devices) + 1) // 2
        return self.devices[:half] if node == 0 else self.devices[half:]

    def to_dict(self) -> dict[str, object]:
        """The spec as JSON-ready data (the bed's state file)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> ClusterSpec:
        """The spec `to_dict` wrote."""
        values: dict[str, Any] = dict(data)
        values["devices"] = tuple(values["devices"])
        return cls(**values)


@dataclass(frozen=True)
class Topology:
    """The command lines of every host of one bed.

    Args:
        addresses: host name -> its address.
        spec: the bed's settings.
        config: the job's configuration; every service gets it, the host-specific settings on top.
        state_dir: where data, checkpoints and logs live.
        cluster_id: the Kafka cluster's id.
    """

    addresses: Mapping[str, str]
    spec: ClusterSpec
    config: StreamtrainConfig
    state_dir: Path
    cluster_id: str

    @property
    def bootstrap(self) -> str:
        """The three-broker bootstrap list every client gets."""
        return ",".join(f"{self.addresses[h]}:{KAFKA_PORT}" for h in KAFKA_HOSTS)

    @property
    def quorum_voters(self) -> str:
        """The KRaft controller quorum, `id@address:9093` of each Kafka node."""
        return ",".join(f"{i}@{self.addresses[h]}:{CONTROLLER_PORT}" for i, h in enumerate(KAFKA_HOSTS, start=1))

    @property
    def rendezvous(self) -> str:
        """torchrun's c10d rendezvous endpoint, on trainer-1."""
        return f"{self.addresses[TRAINER_HOSTS[0]]}:{RENDEZVOUS_PORT}"

    def environment(self, host: str) -> dict[str, str]:
        """What a host's command adds to the environment: the job's configuration, and gloo's interface."""
        env = config_environment(self.config)
        if host in TRAINER_HOSTS:
            # A store per group (not the agents' shared one): the nodes of an elastic group count their
            # restarts apart, so nothing keyed by a restart count would be common to all of them.
            env |= {"GLOO_SOCKET_IFNAME": INTERFACE, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                    **self.spec.trainer_env}
        return env

    def _sets(self, host: str, **settings: object) -> dict[str, object]:
        """What every service of `host` is told on its command line, on top of the job's configuration."""
        return {"kafka.bootstrap_servers": self.bootstrap, "kafka.replication_factor": 3,
                "metrics.bind_address": self.addresses[host], **settings}

    def command(self, host: str) -> list[str]:
        """The command line host `host` runs."""
        if host in KAFKA_HOSTS:
            return self.broker(KAFKA_HOSTS.index(host) + 1)
        if host == "coordinator":
            return self.coordinator()
        if host == "producer":
            return self.producer()
        return self.trainer(TRAINER_HOSTS.index(host))

    def broker(self, node: int) -> list[str]:
        """Kafka node `node` (1-3): `broker run` on its own address, one of the three quorum voters."""
        host = KAFKA_HOSTS[node - 1]
        return list(module_command(CLI_MODULE, "broker", "run", "--data-dir", str(self.state_dir / host),
                                   "--host", self.addresses[host], "--port", str(KAFKA_PORT), "--node-id", str(node),
                                   "--quorum-voters", self.quorum_voters, "--cluster-id", self.cluster_id,
                                   sets=self._sets(host, **{"broker.heap": self.spec.broker_heap})))

    def coordinator(self) -> list[str]:
        """The coordinator, planning for every device of the bed; /status and /metrics on its address."""
        return list(module_command("streamtrain.coordinator", "coordinate", "--port", str(COORDINATOR_PORT),
                                   sets=self._sets("coordinator", **{"coordinator.devices": list(self.spec.devices)})))

    def producer(self, per_device: int | None = None, rate: float | None = None) -> list[str]:
        """`produce` of every device's stream (`per_device` samples each, at `rate` samples/s)."""
        count = per_device if per_device is not None else self.spec.max_samples
        args = ["produce", "--devices", str(len(self.spec.devices)), "--rate",
                str(rate if rate is not None else self.spec.rate), "--rate-kind", "constant", "--size-kind", "fixed",
                "--size", str(self.spec.sample_size), "--no-progress"]
        if count:
            args += ["--max-samples", str(count)]
        return list(module_command("streamtrain.producers", *args, sets=self._sets("producer", **{
            "producer.device_ids": list(self.spec.devices), "producer.metrics_port": PRODUCER_METRICS_PORT})))

    def trainer(self, node: int) -> list[str]:
        """Trainer node `node` (0-based): torchrun, elastic over 1-2 nodes, rendezvous hosted by trainer-1."""
        host = TRAINER_HOSTS[node]
        devices = self.spec.node_devices(node)
        sets = self._sets(host, **{
            "metrics.port": RANK_METRICS_PORT, "trainer.device": "cpu", "trainer.backend": "gloo",
            "trainer.checkpoint_dir": str(self.state_dir / "checkpoints" / self.config.job),
            "trainer.checkpoint_every": self.spec.checkpoint_every, "trainer.torch_threads": self.spec.rank_threads,
            "trainer.collective_timeout_seconds": self.spec.collective_timeout_seconds,
        })
        is_host = int(node == 0)
        rank = module_command("streamtrain.trainer", "train", "--node-devices", ",".join(devices), sets=sets)
        # torchrun runs `python -m streamtrain.trainer ...` itself: the rank's command without the interpreter.
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", f"1:{len(TRAINER_HOSTS)}",
                "--nproc-per-node", str(len(devices)), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", self.rendezvous, "--rdzv-id", self.config.job,
                "--rdzv-conf", f"is_host={is_host},last_call_timeout={self.spec.last_call_seconds},"
                               f"read_timeout={self.spec.rendezvous_timeout_seconds},"
                               f"keep_alive_interval={KEEP_ALIVE_SECONDS},"
                               f"keep_alive_max_attempt={self.spec.keep_alive_attempts}",
                "--local-addr", self.addresses[host], "--max-restarts", str(self.spec.max_restarts),
                "--monitor-interval", "1", *rank[1:]]
