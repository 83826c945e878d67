"""The settings every service shares: Kafka, the embedded broker, metrics, logging."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from ..wire.topics import TopicNames, validate_name_part
from .acl import RESERVED_USERS, AclConfig
from .bridge import BridgeConfig
from .cluster import ClusterConfig
from .coordinator import CoordinatorConfig
from .producer import ProducerConfig
from .renames import Renamed, milliseconds_to_seconds, seconds_renamed
from .serve import ServeConfig
from .trainer import TrainerConfig
from .versions import VersionsConfig

__all__ = ["BrokerConfig", "KafkaConfig", "MetricsConfig", "StreamtrainConfig", "parse_quorum_voters"]

ScramMechanism = Literal["SCRAM-SHA-256", "SCRAM-SHA-512"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class KafkaConfig(ClusterConfig):
    """How every client reaches Kafka (`ClusterConfig`: address, security) and names its topics."""

    topic_prefix: str = "streamtrain"
    """Prefix of every topic: <prefix>.device.<id>, <prefix>.feedback, <prefix>.assignments, <prefix>.dead-letter."""

    partitions: int = Field(default=1, ge=1, le=1024)
    """Partitions per topic when streamtrain creates it (one per device topic keeps per-device order)."""

    replication_factor: int = Field(default=1, ge=1, le=32)
    """Replicas per topic when streamtrain creates it (1 on the embedded single-node broker)."""

    retention_seconds: float = Field(default=7 * 24 * 3600.0, ge=-1)
    """Retention of created topics in seconds (-1 keeps records forever); Kafka's retention.ms."""

    renamed_settings: ClassVar[dict[str, Renamed]] = {
        "retention_ms": Renamed("retention_seconds", milliseconds_to_seconds)}

    @field_validator("retention_seconds")
    @classmethod
    def _retention_is_positive_or_forever(cls, value: float) -> float:
        if value != -1 and value < 0.001:
            raise ValueError("must be -1 (forever) or at least 0.001 (one millisecond)")
        return value

    @property
    def kafka_retention_ms(self) -> int:
        """`retention_seconds` as Kafka's `retention.ms` (-1: forever)."""
        return -1 if self.retention_seconds == -1 else round(self.retention_seconds * 1000)

    @field_validator("topic_prefix")
    @classmethod
    def _prefix_is_legal(cls, value: str) -> str:
        return validate_name_part("topic prefix", value)

    @property
    def topics(self) -> TopicNames:
        """Topic names under this configuration's prefix."""
        return TopicNames(self.topic_prefix)


class BrokerConfig(_Section):
    """The embedded KRaft broker (`streamtrain broker ...`): a single node, or one node of a cluster."""

    data_dir: Path = Path(".streamtrain/broker")
    """Directory holding the broker's logs, metadata, generated configuration and state file."""

    host: str = "127.0.0.1"
    """Address the broker listens on and advertises."""

    port: int = Field(default=0, ge=0, le=65535)
    """Client port, of `streamtrain broker` and of the broker `streamtrain up` starts for its run; 0 picks a free
    one (and keeps it across restarts of the same data directory; `up --external-devices` takes Kafka's usual
    9092 when it is free)."""

    controller_port: int = Field(default=0, ge=0, le=65535)
    """KRaft controller port; 0 picks a free one (on a multi-node cluster: this node's port in quorum_voters)."""

    node_id: int = Field(default=1, ge=1, le=2**31 - 1)
    """KRaft node id of this broker, unique in its cluster (a single node is node 1)."""

    quorum_voters: str | None = None
    """The controller quorum of a multi-node KRaft cluster, `id@host:port,...`: every node is broker and
    controller, every node gets the same list, and this node's entry is `node_id@host:controller_port`. Internal
    topics then get min(3, nodes) replicas, and topics a minimum of min(2, nodes) in-sync replicas, as in
    docker-compose.multi-broker.yml. None: a single-node cluster of this broker alone."""

    cluster_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_-]{21}$")
    """KRaft cluster id the data directory is formatted with (22 URL-safe base64 characters, e.g. from
    `streamtrain broker cluster-id`); every node of a multi-node cluster needs the same one. None: a new id
    at the first start of the data directory (single node)."""

    heap: str = Field(default="768m", pattern=r"^[0-9]+[kmgKMG]$")
    """Java heap size (-Xmx), e.g. 768m or 2g."""

    @property
    def heap_mb(self) -> float:
        """`heap` in MiB."""
        return float(self.heap[:-1]) * {"k": 1 / 1024, "m": 1.0, "g": 1024.0}[self.heap[-1].lower()]

    log_file: Path | None = None
    """Broker log file; default <data_dir>/broker.log."""

    libs_dir: Path | None = None
    """Directory of the Kafka jars; default kafka/libs in the source tree (filled by `make kafka`)."""

    start_timeout_seconds: float = Field(default=90.0, gt=0)
    """Seconds `broker start` waits for the broker to answer before giving up."""

    stop_timeout_seconds: float = Field(default=60.0, gt=0)
    """Seconds `broker stop` waits for a clean shutdown before killing the process."""

    properties: dict[str, str] = Field(default_factory=dict)
    """Extra server.properties entries, overriding streamtrain's defaults."""

    security_protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT"] = "PLAINTEXT"
    """Client listener: PLAINTEXT, or SASL_PLAINTEXT with SCRAM (clients then need kafka.security_protocol,
    kafka.sasl_mechanism, kafka.sasl_username and kafka.sasl_password). The controller listener stays
    PLAINTEXT on broker.host (loopback by default)."""

    scram_users: dict[str, SecretStr] = Field(default_factory=dict)
    """SCRAM users (name -> password) created with SCRAM-SHA-256 and -512 credentials when the data directory is
    formatted, and upserted at every later start; passwords are masked everywhere streamtrain prints them."""

    inter_broker_mechanism: ScramMechanism = "SCRAM-SHA-512"
    """SCRAM mechanism the broker authenticates to itself with (its own generated user, kept in the data dir)."""

    renamed_settings: ClassVar[dict[str, Renamed]] = seconds_renamed("start_timeout_s", "stop_timeout_s")
    acls: bool = True
    """With SASL on, run Kafka's own authorizer (StandardAuthorizer): a client may do only what an ACL allows
    it (`streamtrain acl apply` creates each role's), and the only super users are the broker and its
    controller themselves. Off: every authenticated user may do anything (not for a shared cluster)."""

    @field_validator("scram_users")
    @classmethod
    def _scram_names_are_plain(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, password in value.items():
            # The broker's and the controller's own names are super users: nobody else may log in as them.
            if not name or any(c in name for c in ",=[]\"\\ ") or name.startswith(RESERVED_USERS):
                raise ValueError(f"SCRAM user name {name!r} must be non-empty, without , = [ ] quotes or spaces, "
                                 "and not streamtrain-broker* or streamtrain-controller*")
            if len(password.get_secret_value()) < 8:
                raise ValueError(f"password of SCRAM user {name!r} is shorter than 8 characters")
        return value

    @model_validator(mode="after")
    def _sasl_has_users(self) -> BrokerConfig:
        if self.security_protocol == "SASL_PLAINTEXT" and not self.scram_users:
            raise ValueError("broker.security_protocol=SASL_PLAINTEXT needs at least one user in broker.scram_users")
        return self

    @model_validator(mode="after")
    def _quorum_names_this_node(self) -> BrokerConfig:
        if self.quorum_voters is None:
            return self
        voters = parse_quorum_voters(self.quorum_voters)
        own = voters.get(self.node_id)
        if own is None:
            raise ValueError(f"broker.node_id {self.node_id} is not in broker.quorum_voters ({self.quorum_voters})")
        host, port = own
        if host != self.host:
            raise ValueError(f"broker.quorum_voters names node {self.node_id} at {host}, but broker.host is "
                             f"{self.host}: the controller listens where the quorum reaches it")
        if self.controller_port not in (0, port):
            raise ValueError(f"broker.controller_port {self.controller_port} differs from node {self.node_id}'s "
                             f"port {port} in broker.quorum_voters")
        if self.cluster_id is None:
            raise ValueError("broker.quorum_voters needs broker.cluster_id: every node is formatted with the same "
                             "id (`streamtrain broker cluster-id` makes one)")
        if self.security_protocol != "PLAINTEXT":
            raise ValueError("broker.security_protocol=SASL_PLAINTEXT is single-node only (each node's inter-broker "
                             "user lives in its own data directory); leave broker.quorum_voters unset")
        return self

    @property
    def voters(self) -> dict[int, tuple[str, int]]:
        """The controller quorum by node id: this node alone (on controller_port) unless quorum_voters is set."""
        if self.quorum_voters is None:
            return {self.node_id: (self.host, self.controller_port)}
        return parse_quorum_voters(self.quorum_voters)


def parse_quorum_voters(value: str) -> dict[int, tuple[str, int]]:
    """`1@host:9093,2@host2:9093` as {1: ("host", 9093), 2: ("host2", 9093)}.

    Raises:
        ValueError: an entry is not id@host:port, or an id appears twice.
    """
    voters: dict[int, tuple[str, int]] = {}
    for entry in value.split(","):
        node, at, address = entry.strip().partition("@")
        host, colon, port = address.rpartition(":")
        if not (at and colon and host and node.isdigit() and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"quorum voter {entry.strip()!r} is not id@host:port")
        if int(node) in voters:
            raise ValueError(f"node {node} appears twice in the quorum voters {value!r}")
        voters[int(node)] = (host, int(port))
    return voters


class MetricsConfig(_Section):
    """Prometheus and HTTP endpoints."""

    bind_address: str = "127.0.0.1"
    """Address HTTP and /metrics endpoints bind to; loopback by default (set 0.0.0.0 in containers)."""

    @field_validator("bind_address")
    @classmethod
    def _bind_address_is_an_ip(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address (127.0.0.1 for local only, 0.0.0.0 for all)") from None
        return value

    port: int = Field(default=0, ge=0, le=65535)
    """Base port of the metrics endpoint; 0 picks a free one."""


class StreamtrainConfig(_Section):
    """Everything streamtrain can be told, from TOML, environment and flags (lowest precedence first)."""

    job: str = "streamtrain"
    """Training job name, carried in feedback and assignments."""

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Log level of every service."""

    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    broker: BrokerConfig = Field(default_factory=BrokerConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    producer: ProducerConfig = Field(default_factory=ProducerConfig)
    coordinator: CoordinatorConfig = Field(default_factory=CoordinatorConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    versions: VersionsConfig = Field(default_factory=VersionsConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    acl: AclConfig = Field(default_factory=AclConfig)
    bridge: BridgeConfig = Field(default_factory=BridgeConfig)

    @field_validator("job")
    @classmethod
    def _job_is_legal(cls, value: str) -> str:
        return validate_name_part("job", value)

    @model_validator(mode="after")
    def _bridge_reads_no_topic_of_ours(self) -> StreamtrainConfig:
        topics = self.kafka.topics
        own = {topics.feedback, topics.assignments, topics.dead_letter, topics.evaluations}
        for i, source in enumerate(self.bridge.sources):
            if self.bridge.source_cluster is not None:  # another cluster's topic; its progress is kept under ours
                try:
                    topics.bridge_offsets(source.topic)
                except ValueError as exc:
                    raise ValueError(f"bridge.sources.{i}.topic: the bridge keeps its progress in {source.topic} "
                                     f"under a topic of the stack's cluster, and {exc}") from None
            elif source.topic in own or topics.device_of(source.topic) is not None:
                raise ValueError(f"bridge.sources.{i}.topic: {source.topic} is one of this job's own topics "
                                 f"(kafka.topic_prefix {self.kafka.topic_prefix}); the bridge reads a user's topics")
        return self

    @property
    def bridge_devices(self) -> tuple[str, ...]:
        """The devices the bridge writes: bridge.devices, else coordinator.devices."""
        return self.bridge.devices or self.coordinator.devices

    @property
    def trainer_group_id(self) -> str:
        """The trainers' consumer group (whose committed offsets are the lag the coordinator reads)."""
        return self.trainer.group_id or f"{self.job}.trainers"

    @property
    def serve_group_id(self) -> str:
        """The consumer group `serve` commits the request offsets it answered under."""
        return self.serve.group_id or f"{self.job}.serve"
