"""The settings every service shares: Kafka, the embedded broker, metrics, logging."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..wire.topics import TopicNames, validate_name_part
from .coordinator import CoordinatorConfig
from .producer import ProducerConfig
from .trainer import TrainerConfig

__all__ = ["BrokerConfig", "KafkaConfig", "MetricsConfig", "StreamtrainConfig"]

_SECRET_KEYS = ("sasl.password", "ssl.key.password", "ssl.keystore.password", "sasl.oauthbearer.client.secret")


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

    retention_ms: int = Field(default=7 * 24 * 3600 * 1000, ge=-1)
    """Retention of created topics in milliseconds (-1 keeps records forever)."""

    client: dict[str, str] = Field(default_factory=dict)
    """Extra librdkafka settings for every client, by dotted key: security.protocol, sasl.mechanism,
    sasl.username, sasl.password, ssl.ca.location, ... (passwords never appear in logs)."""

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

    @property
    def topics(self) -> TopicNames:
        """Topic names under this configuration's prefix."""
        return TopicNames(self.topic_prefix)

    def redacted_client(self) -> dict[str, str]:
        """`client` with secrets masked, for logs and status pages."""
        return {k: ("***" if k in _SECRET_KEYS or "password" in k else v) for k, v in self.client.items()}


class BrokerConfig(_Section):
    """The embedded single-node KRaft broker (`streamtrain broker ...`)."""

    data_dir: Path = Path(".streamtrain/broker")
    """Directory holding the broker's logs, metadata, generated configuration and state file."""

    host: str = "127.0.0.1"
    """Address the broker listens on and advertises."""

    port: int = Field(default=0, ge=0, le=65535)
    """Client port; 0 picks a free one (and keeps it across restarts of the same data directory)."""

    controller_port: int = Field(default=0, ge=0, le=65535)
    """KRaft controller port; 0 picks a free one."""

    heap: str = Field(default="768m", pattern=r"^[0-9]+[kmgKMG]$")
    """Java heap size (-Xmx), e.g. 768m or 2g."""

    log_file: Path | None = None
    """Broker log file; default <data_dir>/broker.log."""

    libs_dir: Path | None = None
    """Directory of the Kafka jars; default kafka/libs in the source tree (filled by `make kafka`)."""

    start_timeout_s: float = Field(default=90.0, gt=0)
    """Seconds `broker start` waits for the broker to answer before giving up."""

    stop_timeout_s: float = Field(default=60.0, gt=0)
    """Seconds `broker stop` waits for a clean shutdown before killing the process."""

    properties: dict[str, str] = Field(default_factory=dict)
    """Extra server.properties entries, overriding streamtrain's defaults."""


class MetricsConfig(_Section):
    """Prometheus and HTTP endpoints."""

    bind_address: str = "127.0.0.1"
    """Address HTTP and /metrics endpoints bind to; loopback by default (set 0.0.0.0 in containers)."""

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

    @field_validator("job")
    @classmethod
    def _job_is_legal(cls, value: str) -> str:
        return validate_name_part("job", value)

    @property
    def trainer_group_id(self) -> str:
        """The trainers' consumer group (whose committed offsets are the lag the coordinator reads)."""
        return self.trainer.group_id or f"{self.job}.trainers"
