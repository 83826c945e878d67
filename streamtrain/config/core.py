"""The settings every service shares: Kafka, the embedded broker, metrics, logging."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from ..wire.topics import TopicNames, validate_name_part
from .acl import RESERVED_USERS, AclConfig
from .bridge import BridgeConfig
from .coordinator import CoordinatorConfig
from .producer import ProducerConfig
from .renames import Renamed, milliseconds_to_seconds, seconds_renamed
from .serve import ServeConfig
from .trainer import TrainerConfig
from .versions import VersionsConfig

__all__ = ["BrokerConfig", "KafkaConfig", "MetricsConfig", "StreamtrainConfig", "parse_quorum_voters"]

_SECRET_KEYS = ("sasl.password", "ssl.key.password", "ssl.keystore.password", "sasl.oauthbearer.client.secret")

#: librdkafka key of each typed security field of `KafkaConfig` (the field name is the key with _ for . and -).
SECURITY_KEYS: dict[str, str] = {
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_username": "sasl.username",
    "sasl_password": "sasl.password",
    "ssl_ca_location": "ssl.ca.location",
    "ssl_certificate_location": "ssl.certificate.location",
    "ssl_key_location": "ssl.key.location",
    "ssl_key_password": "ssl.key.password",
    "ssl_endpoint_identification_algorithm": "ssl.endpoint.identification.algorithm",
}
_SECRET_FIELDS = ("sasl_password", "ssl_key_password")
_PATH_FIELDS = ("ssl_ca_location", "ssl_certificate_location", "ssl_key_location")
ScramMechanism = Literal["SCRAM-SHA-256", "SCRAM-SHA-512"]


def _is_secret_key(key: str) -> bool:
    return key in _SECRET_KEYS or "password" in key or "secret" in key


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class KafkaConfig(_Section):
    """How every client reaches Kafka and names its topics."""

    bootstrap_servers: str = "127.0.0.1:9092"
    """Comma-separated host:port list of brokers (`streamtrain broker start` prints one)."""

    topic_prefix: str = "streamtrain"
    """Prefix of every topic: <prefix>.device.<id>, <prefix>.feedback, <prefix>.assignments, <prefix>.dead-letter."""

    partitions: int = Field(default=1, ge=1, le=1024)
    """Partitions per topic when streamtrain creates it (one per device topic keeps per-device order)."""

    replication_factor: int = Field(default=1, ge=1, le=32)
    """Replicas per topic when streamtrain creates it (1 on the embedded single-node broker)."""

    retention_seconds: float = Field(default=7 * 24 * 3600.0, ge=-1)
    """Retention of created topics in seconds (-1 keeps records forever); Kafka's retention.ms."""

    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] | None = None
    """How clients talk to the brokers (librdkafka security.protocol); None leaves librdkafka's PLAINTEXT."""

    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI"] | None = None
    """SASL mechanism (sasl.mechanism) when security_protocol is SASL_*; SCRAM-SHA-512 for the embedded broker."""

    sasl_username: str | None = None
    """SASL user name (sasl.username)."""

    sasl_password: SecretStr | None = None
    """SASL password (sasl.password); masked in `config show`, logs, metrics and /status. Prefer the environment
    (STREAMTRAIN_KAFKA__SASL_PASSWORD) or a TOML file readable only by the service user."""

    ssl_ca_location: Path | None = None
    """PEM file of the CA that signed the brokers' certificates (ssl.ca.location)."""

    ssl_certificate_location: Path | None = None
    """Client certificate (PEM) for mutual TLS (ssl.certificate.location)."""

    ssl_key_location: Path | None = None
    """Client private key (PEM) for mutual TLS (ssl.key.location)."""

    ssl_key_password: SecretStr | None = None
    """Password of the client private key (ssl.key.password); masked like sasl_password."""

    ssl_endpoint_identification_algorithm: Literal["https", "none"] | None = None
    """Check the broker's host name against its certificate (https, librdkafka's default) or not (none)."""

    client: dict[str, str] = Field(default_factory=dict)
    """Extra librdkafka settings for every client, by dotted key (socket.timeout.ms, ...). Secret-looking keys
    (*password*, *secret*) are moved to `client_secrets`, and the security keys above to their typed fields."""

    client_secrets: dict[str, SecretStr] = Field(default_factory=dict)
    """Other secret librdkafka settings (ssl.keystore.password, sasl.oauthbearer.client.secret), always masked."""

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

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers_are_host_ports(cls, value: str) -> str:
        for server in value.split(","):
            host, sep, port = server.strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{server.strip()!r} is not host:port (port 1-65535)")
        return value

    @model_validator(mode="before")
    @classmethod
    def _lift_client_secrets(cls, data: object) -> object:
        """Move secrets given in `client` to masked fields, so no repr or dump of the config shows them."""
        if not isinstance(data, dict) or not isinstance(data.get("client"), dict):
            return data
        data, client = dict(data), dict(data["client"])
        secrets = dict(data.get("client_secrets") or {})
        for key in [k for k in client if _is_secret_key(k)]:
            value = client.pop(key)
            typed = next((n for n in _SECRET_FIELDS if SECURITY_KEYS[n] == key), None)
            if typed is not None and data.get(typed) is None:
                data[typed] = value
            else:
                secrets[key] = value
        data["client"], data["client_secrets"] = client, secrets
        return data

    @model_validator(mode="after")
    def _security_is_consistent(self) -> KafkaConfig:
        for name, key in SECURITY_KEYS.items():
            if getattr(self, name) is not None and (key in self.client or key in self.client_secrets):
                raise ValueError(f"{key} is set twice, as kafka.{name} and in kafka.client; keep one")
        protocol = self.security_protocol or self.client.get("security.protocol", "PLAINTEXT")
        mechanism = self.sasl_mechanism or self.client.get("sasl.mechanism")
        if protocol.upper().startswith("SASL") and mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and (
                not (self.sasl_username or self.client.get("sasl.username")) or self.sasl_password is None):
            raise ValueError(f"kafka.sasl_mechanism={mechanism} needs kafka.sasl_username and kafka.sasl_password")
        for name in _PATH_FIELDS:
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"kafka.{name}: {path} is not a readable file")
        return self

    @property
    def topics(self) -> TopicNames:
        """Topic names under this configuration's prefix."""
        return TopicNames(self.topic_prefix)

    def security_settings(self) -> dict[str, str]:
        """The librdkafka security settings in force, secrets revealed: for client factories only, never to print."""
        settings: dict[str, str] = {}
        for name, key in SECURITY_KEYS.items():
            value = getattr(self, name)
            if value is not None:
                settings[key] = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
        settings.update({k: v.get_secret_value() for k, v in self.client_secrets.items()})
        return settings

    def redacted_client(self) -> dict[str, str]:
        """Every extra librdkafka setting clients get (security included), secrets masked: for logs and status."""
        merged = {**self.client, **self.security_settings()}
        secret = {SECURITY_KEYS[n] for n in _SECRET_FIELDS} | set(self.client_secrets)
        return {k: ("***" if k in secret or _is_secret_key(k) else v) for k, v in sorted(merged.items())}


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
            if source.topic in own or topics.device_of(source.topic) is not None:
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
