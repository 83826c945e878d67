"""The embedded Apache Kafka broker: real KRaft Kafka from Maven Central jars on local Java, one node or several."""

from .embedded import (
    BrokerError,
    BrokerState,
    BrokerStatus,
    EmbeddedBroker,
    find_kafka_libs,
    kafka_version,
    new_cluster_id,
    replication_properties,
)

__all__ = [
    "BrokerError",
    "BrokerState",
    "BrokerStatus",
    "EmbeddedBroker",
    "find_kafka_libs",
    "kafka_version",
    "new_cluster_id",
    "replication_properties",
]
