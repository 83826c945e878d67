"""What a broker is made of on disk: its recorded state, its `server.properties`, its cluster id, its jars.

Pure functions of the broker's settings (no process is started here), so the properties of one node of a
multi-node cluster can be checked without a JVM.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from streamtrain import scram

from ..config import BrokerConfig

__all__ = ["BrokerError", "BrokerState", "BrokerStatus", "find_kafka_libs", "kafka_version", "new_cluster_id",
           "replication_properties", "server_properties"]

_SOURCE_LIBS = Path(__file__).resolve().parents[2] / "kafka" / "libs"


class BrokerError(RuntimeError):
    """The broker could not be started, reached or stopped; the message says why and what to do."""


@dataclass
class BrokerState:
    """What `broker.json` records about the broker of one data directory."""

    host: str
    port: int
    controller_port: int
    cluster_id: str
    pid: int | None = None
    started_at: float | None = None
    version: str | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class BrokerStatus:
    """Health of a broker as `broker status` reports it."""

    data_dir: str
    running: bool
    healthy: bool
    pid: int | None
    bootstrap: str | None
    version: str | None
    uptime_s: float | None
    topics: int | None
    detail: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def find_kafka_libs(configured: Path | None = None) -> Path:
    """The directory of Kafka jars: configured, else $STREAMTRAIN_KAFKA_LIBS, else the source tree's."""
    candidates = [configured, os.environ.get("STREAMTRAIN_KAFKA_LIBS"), _SOURCE_LIBS]
    for cand in candidates:
        if cand and any(Path(cand).glob("kafka_2.13-*.jar")):
            return Path(cand)
    raise BrokerError(
        f"Kafka jars not found (looked in {', '.join(str(c) for c in candidates if c)}); "
        "run `make kafka` to resolve them from Maven Central, or set broker.libs_dir"
    )


def kafka_version(libs: Path) -> str:
    """The Kafka version of the jars in `libs` (from kafka_2.13-<version>.jar)."""
    jar = next(libs.glob("kafka_2.13-*.jar"))
    return jar.stem.removeprefix("kafka_2.13-")


def server_properties(cfg: BrokerConfig, state: BrokerState, log_dir: Path, secret: str | None = None) -> str:
    """The server.properties of the broker of `cfg` at the addresses of `state`.

    Args:
        cfg: the broker's settings.
        state: host, ports and cluster id chosen by `prepare`.
        log_dir: its KRaft log directory.
        secret: the broker's own SCRAM password on a SASL listener (None: no SASL).

    Returns:
        The file's text, `broker.properties` applied last.
    """
    client = cfg.security_protocol  # the client listener's name is its protocol
    voters = cfg.quorum_voters or f"{cfg.node_id}@{state.host}:{state.controller_port}"
    props = {
        "process.roles": "broker,controller",
        "node.id": str(cfg.node_id),
        "controller.quorum.voters": voters,
        "listeners": f"{client}://{state.host}:{state.port},CONTROLLER://{state.host}:{state.controller_port}",
        "advertised.listeners": f"{client}://{state.host}:{state.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": client,
        "listener.security.protocol.map": f"CONTROLLER:PLAINTEXT,{client}:{client}",
        "log.dirs": str(log_dir),
        "num.partitions": "1",
        # Topics come from one place (TopicNames + ensure_topics); a typo must fail, not create a topic.
        "auto.create.topics.enable": "false",
        "offsets.topic.num.partitions": "8",
        **replication_properties(len(cfg.voters)),
        "group.initial.rebalance.delay.ms": "0",
        "log.retention.check.interval.ms": "30000",
    }
    if secret is not None:
        mechanism = cfg.inter_broker_mechanism
        props |= {"sasl.enabled.mechanisms": ",".join(scram.MECHANISMS),
                  "sasl.mechanism.inter.broker.protocol": mechanism}
        for each in scram.MECHANISMS:  # the listener needs a login module per enabled mechanism
            props[f"listener.name.{client.lower()}.{each.lower()}.sasl.jaas.config"] = scram.jaas_config(
                scram.BROKER_USER, secret)
        # The controller listener authenticates too: PLAIN with a user defined in its own JAAS entry, because
        # SCRAM credentials live in the metadata the controller serves. Left open, anyone on the host could
        # reach the controller as a super user once the authorizer is on.
        props |= {"listener.security.protocol.map": f"CONTROLLER:SASL_PLAINTEXT,{client}:{client}",
                  "sasl.mechanism.controller.protocol": "PLAIN",
                  "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
                  "listener.name.controller.plain.sasl.jaas.config": scram.plain_jaas_config(
                      scram.CONTROLLER_USER, secret)}
        if cfg.acls:
            props |= {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                      "super.users": f"User:{scram.BROKER_USER};User:{scram.CONTROLLER_USER}",
                      "allow.everyone.if.no.acl.found": "false"}
    props |= cfg.properties
    return "".join(f"{k}={v}\n" for k, v in props.items())



def replication_properties(nodes: int) -> dict[str, str]:
    """Replication settings of a KRaft cluster of `nodes` brokers: three replicas and two in sync at most.

    With three nodes these are docker-compose.multi-broker.yml's (one node can be lost, acks=all keeps every
    acknowledged record); a single node gets 1 and 1.
    """
    replicas, in_sync = str(min(3, nodes)), str(min(2, nodes))
    return {
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": in_sync,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": in_sync,
        "default.replication.factor": replicas,
        "min.insync.replicas": in_sync,
    }


def new_cluster_id() -> str:
    """A new KRaft cluster id, as `kafka-storage random-uuid` makes one."""
    # Kafka's cluster ids are 16 random bytes in URL-safe base64 without padding (22 characters).
    # One in 64 starts with "-", which the storage tool's parser takes for an option; Kafka's own
    # Uuid.randomUuid() draws again in that case, and so do we.
    while True:
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster.startswith("-"):
            return cluster
