"""Where the bridge reads its sources and keeps its progress: the stack's cluster, or the sources' own.

**One cluster** (no `bridge.source_cluster`): the bridge's group reads the source topics, and its committed
offsets of them are its progress, put in each transaction (`send_offsets_to_transaction`), as in Kafka's
consume-transform-produce loop. Everything here is then the identity.

**Two clusters** (`bridge.source_cluster` set): a Kafka transaction cannot span clusters, so the progress is kept
on the cluster the samples are written to, in the same transactions (the approach of MirrorMaker 2's exactly-once):

- the source cluster is read by a consumer that is only assigned partitions: it never joins a group there and
  never commits (it needs READ on the source topics, nothing else);
- on the stack's cluster each source topic has an empty twin, `<prefix>.bridge-offsets.<topic>`, with at least
  as many partitions (a broker keeps committed offsets only of partitions it holds; the bridge creates and grows
  them). The group's committed offset of twin partition p is where source partition p is bridged up to;
- the bridge's group subscribes to the twins on the stack's cluster, so the group protocol shares the source
  partitions among the bridges of one group, and a restarted or replaced bridge is fenced by its generation and
  its transactional id, exactly as on one cluster. Nothing is ever fetched from the twins (they are paused);
- each transaction commits the source positions as the twins' offsets, with that group's metadata: samples, dead
  letters and progress become visible together, on the one cluster that holds them all.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import NewPartitions

from streamtrain.authz import raise_if_refused
from streamtrain.config import ClusterConfig, StreamtrainConfig
from streamtrain.kafka import (
    KafkaConsumer,
    TopicSpec,
    committed_offsets,
    ensure_topics,
    list_topics,
    make_admin,
    make_consumer,
)

from .errors import BridgeSetupError

__all__ = ["BridgeProgress", "close_quietly"]

logger = logging.getLogger(__name__)


def close_quietly(consumer: KafkaConsumer) -> None:
    """Close `consumer`; an error its callbacks raise meanwhile (a refused login, told already) is only logged."""
    try:
        consumer.close()
    except KafkaException as exc:
        logger.debug("closing a consumer: %s", exc)


class BridgeProgress:
    """The bridge's clusters: where its sources are read (`source`), where its group keeps its offsets (`kafka`).

    Args:
        cfg: the whole configuration (`kafka`, `bridge.source_cluster`, `bridge.sources`, the bridge's group).
    """

    def __init__(self, cfg: StreamtrainConfig) -> None:
        self.kafka = cfg.kafka
        self.remote = cfg.bridge.source_cluster is not None
        self.source: ClusterConfig = cfg.bridge.source_cluster or cfg.kafka
        self.group = cfg.bridge.group(cfg.job)
        self.topics = [s.topic for s in cfg.bridge.sources]
        self._names = cfg.kafka.topics

    @property
    def where(self) -> str:
        """The sources' cluster as a message names it."""
        if self.remote:
            return f"the source cluster ({self.source.setting}.bootstrap_servers={self.source.bootstrap_servers})"
        return f"the stack's cluster (kafka.bootstrap_servers={self.kafka.bootstrap_servers})"

    # ---- names ----------------------------------------------------------------------------------------------

    def group_topics(self) -> list[str]:
        """The topics the bridge's group subscribes to: the sources, or on two clusters their twins."""
        return [self._names.bridge_offsets(t) for t in self.topics] if self.remote else list(self.topics)

    def tracked(self, parts: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Source partitions (with their offsets) as the group commits them: the same, or their twins."""
        if not self.remote:
            return list(parts)
        return [TopicPartition(self._names.bridge_offsets(tp.topic), tp.partition, tp.offset) for tp in parts]

    def sources_of(self, parts: Iterable[TopicPartition]) -> list[TopicPartition]:
        """The source partitions (with the offsets) of partitions of the group's topics (`group_topics`)."""
        if not self.remote:
            return list(parts)
        out = []
        for tp in parts:
            topic = self._names.bridge_source_of(tp.topic)
            if topic is not None:
                out.append(TopicPartition(topic, tp.partition, tp.offset))
        return out

    # ---- clients --------------------------------------------------------------------------------------------

    def reader(self, **overrides: Any) -> KafkaConsumer:
        """A consumer of the source topics, to be assigned (on the source cluster it never joins nor commits)."""
        return make_consumer(self.source, self.group, **overrides)

    def ignored(self, err: KafkaError) -> bool:
        """Whether a reader's error event is to be ignored: on another cluster, the refused look-up of the group
        librdkafka makes a consumer name (it is never joined; the bridge's user needs no right on it there)."""
        return self.remote and err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED

    @contextlib.contextmanager
    def clients(self) -> Iterator[tuple[KafkaConsumer, KafkaConsumer]]:
        """(a reader of the sources, a consumer that asks the group's committed offsets): one consumer on one
        cluster; neither joins the group. Both closed on leaving."""
        reader = self.reader()
        member = make_consumer(self.kafka, self.group) if self.remote else reader
        try:
            yield reader, member
        finally:
            close_quietly(reader)
            if member is not reader:
                close_quietly(member)

    def committed(self, consumer: KafkaConsumer, parts: list[TopicPartition],
                  timeout: float = 30.0) -> list[TopicPartition]:
        """The group's committed offsets of source partitions `parts` (negative where none), asked through
        `consumer` (a consumer of the stack's cluster in the bridge's group)."""
        if not parts:
            return []
        return self.sources_of(committed_offsets(consumer, self.tracked(parts), timeout))

    # ---- the source cluster, at start-up --------------------------------------------------------------------

    def source_partitions(self, timeout: float) -> dict[str, int]:
        """The partitions of each source topic on the source cluster.

        Raises:
            BridgeSetupError: the cluster does not answer, refuses the login, or lacks a source topic; the message
                names the setting and the cluster.
            AuthorizationError: the source cluster's ACLs do not let the bridge's principal describe a topic.
        """
        reader = self.reader()
        try:
            try:
                meta = list_topics(reader, timeout)
            except KafkaException as exc:
                err = exc.args[0]
                if err.fatal():  # a refused login or a TLS setting, explained by the client's error guard
                    raise BridgeSetupError(f"{self.where}: {err.str()}") from None
                raise BridgeSetupError(
                    f"{self.source.setting}.bootstrap_servers: no broker of {self.where} answered within "
                    f"{timeout:g} s ({err.str()}): check the address, that this host reaches it, and "
                    f"{self.source.setting}.security_protocol") from None
            counts = {}
            for i, topic in enumerate(self.topics):
                found = meta.topics.get(topic)
                if found is not None and found.error is not None:
                    raise_if_refused(self.source, found.error, "DESCRIBE", topic, "topic")
                if found is None or found.error is not None or not found.partitions:
                    raise BridgeSetupError(f"bridge.sources.{i}.topic: topic {topic} is not on {self.where}: "
                                           "create it there, or fix the name")
                counts[topic] = len(found.partitions)
            return counts
        finally:
            close_quietly(reader)

    def ensure_twins(self, partitions: dict[str, int], timeout: float = 30.0) -> None:
        """Create each source topic's twin on the stack's cluster, or grow it to the source's partitions."""
        if not self.remote:
            return
        admin = make_admin(self.kafka)
        twins = {self._names.bridge_offsets(t): n for t, n in partitions.items()}
        existing = list_topics(admin, timeout).topics
        ensure_topics(admin, [TopicSpec(name, n, self.kafka.replication_factor) for name, n in twins.items()
                              if name not in existing], timeout)
        grow = [NewPartitions(name, n) for name, n in twins.items()
                if name in existing and len(existing[name].partitions) < n]
        for name, future in (admin.create_partitions(grow, request_timeout=timeout).items() if grow else ()):
            try:
                future.result(timeout)
            except KafkaException as exc:
                raise_if_refused(self.kafka, exc.args[0], "ALTER", name, "topic")
                if exc.args[0].code() != KafkaError.INVALID_PARTITIONS:  # grown meanwhile by another bridge
                    raise
