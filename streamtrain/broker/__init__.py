"""The embedded Apache Kafka broker: real KRaft Kafka from Maven Central jars on local Java."""

from .embedded import BrokerError, BrokerState, BrokerStatus, EmbeddedBroker, find_kafka_libs, kafka_version

__all__ = ["BrokerError", "BrokerState", "BrokerStatus", "EmbeddedBroker", "find_kafka_libs", "kafka_version"]
