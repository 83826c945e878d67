"""Kafka client factories and topic administration, built from the one `KafkaConfig`.

Every producer, consumer and admin client in streamtrain comes from here, so security settings
(`kafka.client`: SASL, TLS, ...) reach all of them and no service spells librdkafka keys itself.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ClusterMetadata, ConfigResource, NewTopic, TopicMetadata

from .authz import DeliveryCallback, GuardedProducer, raise_if_refused
from .config import ClusterConfig, KafkaConfig
from .kafka_errors import auth_failure_message, guard
from .wire.codec import HeaderList

__all__ = ["COORDINATOR_STARTING", "KafkaAdmin", "KafkaConsumer", "TopicSpec", "auth_failure_message",
           "client_settings", "committed_offsets", "config_of", "consume_available", "drop_reached", "ensure_topics",
           "java_client_properties", "list_topics", "make_admin", "make_consumer", "make_control_producer",
           "make_producer", "make_transactional_producer", "produce", "producer_settings", "read_to_end",
           "tail_positions", "topic_config", "topic_metadata", "transient", "watermarks"]

logger = logging.getLogger(__name__)


#: Errors of a group coordinator that is still starting (librdkafka does not flag them all retriable).
COORDINATOR_STARTING = frozenset({
    KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._WAIT_COORD,
})
_RDKAFKA_LOG = logging.getLogger("librdkafka")


def transient(err: KafkaError) -> bool:
    """Whether a group call may answer if asked again: a retriable error, or a coordinator still starting (or an
    answer held back, as offsets an open transaction holds)."""
    return bool(err.retriable()) or err.code() in COORDINATOR_STARTING


def client_settings(cfg: ClusterConfig, **overrides: Any) -> dict[str, Any]:
    """librdkafka settings shared by every client: bootstrap, security (secrets revealed), extras, then overrides.

    The result holds passwords in clear: hand it to a client, never to a log (`KafkaConfig.redacted_client`).
    """
    # librdkafka's own log lines go through Python logging instead of raw stderr.
    settings: dict[str, Any] = {"bootstrap.servers": cfg.bootstrap_servers, "logger": _RDKAFKA_LOG}
    settings.update(cfg.security_settings())
    settings.update(cfg.client)
    settings.update(overrides)
    settings["error_cb"] = guard(cfg, overrides.get("error_cb"))
    return settings


def java_client_properties(cfg: ClusterConfig) -> dict[str, str]:
    """The same connection and security settings for Kafka's Java clients and tools (`--producer.config` files).

    Holds the password in clear (in `sasl.jaas.config`): write it to a file only its owner can read, never to
    a command line.
    """
    props = {"bootstrap.servers": cfg.bootstrap_servers}
    if cfg.security_protocol:
        props["security.protocol"] = cfg.security_protocol
    if cfg.sasl_mechanism:
        props["sasl.mechanism"] = cfg.sasl_mechanism
    if cfg.sasl_mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN") and cfg.sasl_username and cfg.sasl_password:
        module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if cfg.sasl_mechanism == "PLAIN"
                  else "org.apache.kafka.common.security.scram.ScramLoginModule")
        props["sasl.jaas.config"] = (f'{module} required username="{_jaas_quote(cfg.sasl_username)}" '
                                     f'password="{_jaas_quote(cfg.sasl_password.get_secret_value())}";')
    if cfg.ssl_ca_location:  # Java reads PEM trust and key stores directly (KIP-651)
        props |= {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(cfg.ssl_ca_location)}
    if cfg.ssl_certificate_location or cfg.ssl_key_location:
        raise ValueError("Kafka's Java tools need a keystore for mutual TLS; kafka.ssl_certificate_location and "
                         "kafka.ssl_key_location are only passed to the Python clients")
    if cfg.ssl_endpoint_identification_algorithm:
        props["ssl.endpoint.identification.algorithm"] = (
            "" if cfg.ssl_endpoint_identification_algorithm == "none" else "https")
    return props


def _jaas_quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def producer_settings(cfg: ClusterConfig, **overrides: Any) -> dict[str, Any]:
    """librdkafka settings of an idempotent producer with `acks=all`: no duplicates from retries, nothing acked
    and then lost. Holds secrets in clear, like `client_settings`."""
    defaults: dict[str, Any] = {
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "lz4",
        # Retries with backoff while the broker is away; deliveries fail only after this long.
        "delivery.timeout.ms": 120_000,
        "retry.backoff.ms": 100,
        "retry.backoff.max.ms": 2_000,
    }
    return client_settings(cfg, **{**defaults, **overrides})


def make_producer(cfg: ClusterConfig, **overrides: Any) -> Producer:
    """An idempotent producer with `acks=all` (`producer_settings`).

    A write the broker's ACLs refuse raises `AuthorizationError` from the next poll or flush (`GuardedProducer`).
    """
    return GuardedProducer(cfg, producer_settings(cfg, **overrides))


def make_control_producer(cfg: ClusterConfig, **overrides: Any) -> Producer:
    """`make_producer` for the control plane (feedback, plans): every step waits for these records, so they are
    sent at once rather than lingering for a batch."""
    return make_producer(cfg, **{"linger.ms": 0, **overrides})


def make_transactional_producer(cfg: ClusterConfig, transactional_id: str, timeout_s: float,
                                **overrides: Any) -> Producer:
    """`make_producer` whose writes, and a consumer's offsets, commit or abort together (Kafka transactions).

    `transactional_id` stays the same across restarts (a new instance fences the old one, whose open transaction
    the broker aborts); the broker aborts a transaction left open `timeout_s` (no delivery may take longer).
    """
    timeout_ms = round(timeout_s * 1000)
    defaults = {"transactional.id": transactional_id, "transaction.timeout.ms": timeout_ms,
                "delivery.timeout.ms": timeout_ms}
    return make_producer(cfg, **{**defaults, **overrides})


def produce(producer: Producer, topic: str, value: bytes, headers: HeaderList | None = None,
            on_delivery: DeliveryCallback | None = None, key: bytes | None = None) -> None:
    """Produce one record, waiting for room when the local queue is full (backpressure, never a drop)."""
    while True:
        try:
            producer.produce(topic, value=value, key=key, headers=headers, on_delivery=on_delivery)
            break
        except BufferError:
            producer.poll(0.05)  # serve delivery callbacks until the queue has room again
    producer.poll(0)


class KafkaConsumer(Consumer):
    """A `Consumer` that remembers the settings it was made from (its principal names refusals)."""

    def __init__(self, cfg: ClusterConfig, settings: dict[str, Any]) -> None:
        super().__init__(settings)
        self.kafka = cfg


def make_consumer(cfg: ClusterConfig, group_id: str, **overrides: Any) -> KafkaConsumer:
    """A consumer that never auto-commits: offsets are committed only after the work they cover."""
    defaults: dict[str, Any] = {
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
    }
    return KafkaConsumer(cfg, client_settings(cfg, **{**defaults, **overrides}))


class KafkaAdmin(AdminClient):
    """An `AdminClient` that remembers the settings it was made from (its principal names refusals)."""

    def __init__(self, cfg: ClusterConfig, settings: dict[str, Any]) -> None:
        super().__init__(settings)
        self.kafka = cfg


def make_admin(cfg: ClusterConfig, **overrides: Any) -> KafkaAdmin:
    """An admin client (topics, lag, DeleteRecords, ACLs)."""
    return KafkaAdmin(cfg, client_settings(cfg, **overrides))


def config_of(client: object) -> ClusterConfig | None:
    """The settings a client of these factories was made from (None for any other client)."""
    return client.kafka if isinstance(client, (KafkaAdmin, KafkaConsumer, GuardedProducer)) else None


@dataclass(frozen=True)
class TopicSpec:
    """A topic streamtrain needs: name, partitions and topic-level configs (retention, ...)."""

    name: str
    partitions: int = 1
    replication_factor: int = 1
    config: Mapping[str, str] | None = None

    @classmethod
    def from_config(cls, cfg: KafkaConfig, name: str, **config: str) -> TopicSpec:
        """A spec with the configured partitions, replication and retention."""
        retention = {"retention.ms": str(cfg.kafka_retention_ms)}
        return cls(name, cfg.partitions, cfg.replication_factor, {**retention, **config})


def ensure_topics(admin: AdminClient, specs: Iterable[TopicSpec], timeout: float = 30.0) -> list[str]:
    """Create the topics that do not exist yet; leave existing ones alone. Idempotent.

    Returns:
        Names of the topics this call created.

    Raises:
        KafkaException: when creation fails for a reason other than "already exists".
    """
    specs = list(specs)
    if not specs:
        return []
    existing = set(list_topics(admin, timeout).topics)
    todo = [s for s in specs if s.name not in existing]
    for spec in specs:
        if spec.name in existing:
            _check_partitions(admin, spec, timeout)
    if not todo:
        return []
    futures = admin.create_topics(
        [NewTopic(s.name, s.partitions, s.replication_factor, config=dict(s.config or {})) for s in todo],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    created = []
    for name, fut in futures.items():
        try:
            fut.result(timeout=timeout)
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # lost a race with another service
                # With ACLs on, topics are created once at set-up by the admin role, not by every service.
                raise_if_refused(config_of(admin), exc.args[0], "CREATE", name, "topic")
                raise
    if created:
        _wait_visible(admin, created, timeout)
        logger.info("created topics %s", ", ".join(sorted(created)))
    return created


def _wait_visible(admin: AdminClient, names: list[str], timeout: float) -> None:
    """Wait until the broker's metadata shows each topic with a leader for every partition.

    CreateTopics returns once the controller has the topic; the broker that answers the next metadata or
    ListOffsets request may not have it yet, and a service reading it at once would fail with "unknown
    topic or partition".
    """
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending:
        topics = list_topics(admin, max(0.1, deadline - time.monotonic())).topics
        pending = {n for n in pending if n not in topics or not _has_leaders(topics[n])}
        if pending and time.monotonic() >= deadline:
            logger.warning("created topics %s are not visible in metadata after %.0f s", sorted(pending), timeout)
            return
        if pending:
            time.sleep(0.05)


def _has_leaders(meta: TopicMetadata) -> bool:
    """The topic is in the metadata with a leader for each of its partitions (usable, not just created)."""
    return meta.error is None and bool(meta.partitions) and all(p.leader >= 0 for p in meta.partitions.values())


def committed_offsets(consumer: Consumer, parts: list[TopicPartition], timeout: float = 30.0) -> list[TopicPartition]:
    """The consumer's group's committed offsets of `parts` (negative where none), retried (up to `timeout`) while
    the group coordinator is still starting: a fresh broker answers "not coordinator" until its offsets topic is
    up.

    Raises:
        KafkaException: another error, or still no answer after `timeout`.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            return list(consumer.committed(parts, timeout=max(0.1, deadline - time.monotonic())))
        except KafkaException as exc:
            err = exc.args[0]
            if not transient(err) or time.monotonic() > deadline:
                raise
            logger.info("committed offsets not available yet (%s); retrying", err.str())
            time.sleep(0.5)


def list_topics(client: AdminClient | Consumer, timeout: float = 30.0, topic: str | None = None) -> ClusterMetadata:
    """Cluster metadata, failing fast and clearly (not after `timeout`) when the broker refuses our login.

    `client` is an admin client or a consumer with nothing assigned yet (its poll must not eat records).
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            return client.list_topics(topic, timeout=max(0.1, min(1.0, deadline - time.monotonic())))
        except KafkaException:
            client.poll(0)  # serves the error callback: a refused login raises its own, clearer, error here
            if time.monotonic() >= deadline:
                raise


def topic_metadata(client: AdminClient | Consumer, topic: str, timeout: float = 30.0) -> TopicMetadata:
    """One topic's metadata, waiting (up to `timeout`) while the cluster does not show it yet.

    A topic created a moment ago is known to the controller first: a broker that has not caught up with
    the metadata log answers "unknown topic or partition", and a new partition's leader may take a moment to
    settle. Both are retried; a refused DESCRIBE fails at once with the ACL it needs.

    Raises:
        KafkaException: the topic is still not there (or has no leader) after `timeout`.
    """
    deadline = time.monotonic() + timeout
    while True:
        meta = list_topics(client, max(0.1, deadline - time.monotonic()), topic).topics[topic]
        if _has_leaders(meta):
            return meta
        raise_if_refused(config_of(client), meta.error, "DESCRIBE", topic, "topic")
        if time.monotonic() > deadline:
            raise KafkaException(meta.error or KafkaError(KafkaError.LEADER_NOT_AVAILABLE,
                                                          f"{topic}: a partition has no leader"))
        time.sleep(0.1)


def _check_partitions(admin: AdminClient, spec: TopicSpec, timeout: float) -> None:
    meta = admin.list_topics(spec.name, timeout=timeout).topics[spec.name]
    if len(meta.partitions) != spec.partitions:
        logger.warning(
            "topic %s has %d partitions, configuration asks for %d; keeping the existing topic as it is",
            spec.name, len(meta.partitions), spec.partitions,
        )


def topic_config(admin: AdminClient, topic: str, timeout: float = 30.0) -> dict[str, str]:
    """A topic's effective configuration (retention.ms, ...)."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(timeout=timeout)
    return {name: entry.value for name, entry in entries.items()}


def tail_positions(consumer: Consumer, topic: str, last: int | None, timeout: float) -> dict[int, tuple[int, int]]:
    """Per partition of `topic`: (offset of its last `last` records, or the log start when None; high watermark).

    A topic created a moment ago may not be in the metadata yet, and a new partition's leader may take
    a moment to settle: both are retried until `timeout`.
    """
    deadline = time.monotonic() + timeout
    meta = topic_metadata(consumer, topic, timeout)
    spans = {}
    for pid in meta.partitions:
        low, high = watermarks(consumer, TopicPartition(topic, pid), max(0.1, deadline - time.monotonic()))
        spans[pid] = (low if last is None else max(low, high - last), high)
    return spans


def watermarks(consumer: Consumer, partition: TopicPartition, timeout: float = 30.0) -> tuple[int, int]:
    """A partition's (low, high) watermarks, retried (up to `timeout`) while its leader does not know it yet.

    The metadata may already name a new partition's leader while that broker has not applied the partition's
    creation from the metadata log: it answers "unknown topic or partition" for a moment. A refused DESCRIBE
    fails at once with the ACL it needs.

    Raises:
        KafkaException: still not answered after `timeout`.
    """
    deadline = time.monotonic() + timeout
    where = f"{partition.topic}[{partition.partition}]"
    while True:
        try:
            marks = consumer.get_watermark_offsets(partition, timeout=max(0.1, deadline - time.monotonic()))
            if marks is not None:
                return int(marks[0]), int(marks[1])
            error = KafkaError(KafkaError._TIMED_OUT, f"watermarks of {where}: no answer")
        except KafkaException as exc:
            error = exc.args[0]
            raise_if_refused(config_of(consumer), error, "DESCRIBE", partition.topic, "topic")
        if time.monotonic() > deadline:
            raise KafkaException(error)
        logger.debug("watermarks of %s not yet available: %s", where, error)
        time.sleep(0.2)


def consume_available(consumer: Consumer, max_records: int, timeout: float) -> list[Message]:
    """Wait at most `timeout` for the first record, then take what else is already fetched (up to `max_records`).

    `Consumer.consume(n, timeout)` returns early only once n records have arrived: with fewer it waits out the
    whole timeout, so a loop polling in 50 ms slices for a plan or a few samples paid ~50 ms per step.
    """
    first = consumer.poll(timeout)
    if first is None:
        return []
    if max_records <= 1:
        return [first]
    return [first, *consumer.consume(num_messages=max_records - 1, timeout=0)]


def read_to_end(cfg: ClusterConfig, topics: Iterable[str], timeout: float = 60.0,  # noqa: C901  the confluent-kafka poll / check error / process loop with its end-of-partition and timeout cases
                last: int | None = None, stop: Callable[[], bool] | None = None) -> Iterator[Message]:
    """Every record now in `topics` (or each partition's `last` records), up to the high watermarks on entry.

    Reads by manual assignment with no committed offsets (nothing is left behind in any group), `read_committed`:
    of a topic written in transactions, the records of committed ones, up to the end an open transaction holds
    back (the last stable offset). Transient consumer errors are retried until `timeout`. When `stop` is given and
    returns true (checked at least every half second), reading ends early: the caller tells a short read by asking
    `stop` again.

    Raises:
        TimeoutError: when the records up to the high watermarks do not arrive within `timeout`.
        KafkaException: on a fatal consumer error.
    """
    consumer = make_consumer(cfg, f"streamtrain-readback-{uuid.uuid4().hex[:8]}")
    try:
        remaining: dict[tuple[str, int], int] = {}
        assignment = []
        for topic in topics:
            for pid, (start, high) in tail_positions(consumer, topic, last, timeout).items():
                if high > start:
                    remaining[(topic, pid)] = high
                    assignment.append(TopicPartition(topic, pid, start))
        consumer.assign(assignment)
        deadline = time.monotonic() + timeout
        while remaining and not (stop is not None and stop()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"records up to the high watermark did not arrive in {timeout:.0f} s: {remaining}")
            for msg in consume_available(consumer, 500, 0.5):  # batches: a large topic costs no call per record
                err = msg.error()
                if err is not None:
                    if err.fatal():
                        raise KafkaException(err)
                    if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                        # Only topic refusals matter: this reader never uses its group (no commits), so a refused
                        # group lookup changes nothing.
                        raise_if_refused(cfg, err, "READ",
                                         msg.topic() or ", ".join(sorted({t for t, _ in remaining})))
                    logger.debug("reading %s to its end: %s", msg.topic(), err)
                    continue
                key = (msg.topic() or "", msg.partition() or 0)
                end = remaining.get(key)
                if end is None:
                    continue
                offset = msg.offset() or 0
                if offset < end:
                    yield msg
                if offset >= end - 1:
                    del remaining[key]
            drop_reached(consumer, remaining)
    finally:
        consumer.close()


def drop_reached(consumer: Consumer, remaining: dict[tuple[str, int], int]) -> None:
    """Forget the partitions of `remaining` (their end offsets) whose position reached their end offset: the last
    offsets of a transactional topic may hold no record a `read_committed` reader is given (a commit marker), but
    its position passes them."""
    if not remaining:
        return
    for tp in consumer.position([TopicPartition(t, p) for t, p in remaining]):
        if tp.offset >= remaining[(tp.topic, tp.partition)]:
            del remaining[(tp.topic, tp.partition)]
