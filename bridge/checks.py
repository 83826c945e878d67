"""What the bridge checks before it starts: each source topic exists, and its decoder works on its first records.

The first records are the ones the bridge would bridge next (from its group's committed offsets, else the log
start), read by a consumer that is assigned, never subscribed, and never commits: peeking changes nothing.
A decoder that breaks the contract on any of them, or that rejects every one of them, is a setting to fix,
not bad data: the bridge does not start, and the message names the setting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, KafkaException, Message, TopicPartition

from streamtrain.authz import raise_if_refused
from streamtrain.config import StreamtrainConfig
from streamtrain.decoders import ContractError, Decoder, Rejected, SourceRecord, to_sample
from streamtrain.kafka import (
    KafkaConsumer,
    committed_offsets,
    consume_available,
    make_consumer,
    topic_metadata,
    watermarks,
)

from .errors import BridgeSetupError

__all__ = ["SourceCheck", "check_sources", "try_decoder"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceCheck:
    """What trying a source's decoder on its first records found."""

    topic: str
    partitions: int
    records: int
    """Records tried."""
    samples: int
    """Of those, how many became samples."""
    skipped: int
    rejected: int


def check_sources(cfg: StreamtrainConfig, decoders: Mapping[str, Decoder],
                  devices: Collection[str]) -> list[SourceCheck]:
    """Check every source topic (`bridge.sources`) and its decoder on its first records.

    Raises:
        BridgeSetupError: naming the setting to fix.
        AuthorizationError: the bridge's principal may not read a source topic.
    """
    bridge = cfg.bridge
    # The bridge's own group, for its committed offsets (a consumer that is only assigned never joins it).
    consumer = make_consumer(cfg.kafka, bridge.group(cfg.job))
    try:
        checks = []
        for i, source in enumerate(bridge.sources):
            setting = f"bridge.sources.{i}"
            parts = _partitions(consumer, source.topic, setting, min(bridge.check_seconds, 10.0))
            count = bridge.check_records
            messages = _peek(consumer, parts, count, bridge.check_seconds) if count else []
            found = try_decoder(decoders[source.topic], [SourceRecord.from_message(m) for m in messages], devices,
                                setting)
            checks.append(SourceCheck(source.topic, len(parts), *found))
            logger.info("checked %s (%d partitions): %d of its next %d records decode (%d skipped, %d rejected)",
                        source.topic, len(parts), found[1], found[0], found[2], found[3])
        return checks
    finally:
        consumer.close()


def try_decoder(decoder: Decoder, records: list[SourceRecord], devices: Collection[str],
                setting: str) -> tuple[int, int, int, int]:
    """Try `decoder` on `records`: (records, samples, skipped, rejected).

    Raises:
        BridgeSetupError: the decoder broke its contract on one of them, or rejected every one of them; the
            message names the setting (`<setting>.decoder`, the decoder's own setting, or bridge.devices).
    """
    samples = skipped = 0
    first: tuple[SourceRecord, Rejected] | None = None
    for record in records:
        try:
            fields = decoder(record)
            if fields is None:
                skipped += 1
                continue
            to_sample(fields, record, devices)
            samples += 1
        except ContractError as exc:
            raise BridgeSetupError(f"{setting}.decoder: on {record.source} the decoder broke its contract: "
                                   f"{exc.detail}") from None
        except Rejected as exc:
            first = first or (record, exc)
        except Exception as exc:  # a user decoder's own failure: a rejection like any other
            first = first or (record, Rejected("decoder-error", f"{type(exc).__name__}: {exc}"))
    if first is not None and not samples and not skipped:
        record, why = first
        named = why.setting if (why.setting or "").startswith("bridge.") else f"{setting}.{why.setting or 'decoder'}"
        raise BridgeSetupError(f"{named}: none of the first {len(records)} records of {record.topic} decodes; the "
                               f"first ({record.source}): {why.reason}: {why.detail}")
    return len(records), samples, skipped, len(records) - samples - skipped


def _partitions(consumer: KafkaConsumer, topic: str, setting: str, timeout: float) -> list[TopicPartition]:
    try:
        meta = topic_metadata(consumer, topic, timeout=timeout)
    except KafkaException as exc:
        raise_if_refused(consumer.kafka, exc.args[0], "DESCRIBE", topic, "topic")
        raise BridgeSetupError(f"{setting}.topic: topic {topic} is not there ({exc.args[0].str()}): create it, or "
                               "fix the name") from None
    return [TopicPartition(topic, pid) for pid in sorted(meta.partitions)]


def _peek(consumer: KafkaConsumer, parts: list[TopicPartition], count: int, seconds: float) -> list[Message]:
    """Up to `count` records from where the group stands (or the log start), waiting at most `seconds`."""
    deadline = time.monotonic() + seconds
    ends: dict[int, int] = {}
    start = []
    for tp in committed_offsets(consumer, parts, timeout=max(seconds, 30.0)):
        low, high = watermarks(consumer, TopicPartition(tp.topic, tp.partition), max(0.1, deadline - time.monotonic()))
        if high > max(tp.offset, low):
            ends[tp.partition] = high
            start.append(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING))
    consumer.assign(start)
    found: list[Message] = []
    try:
        while ends and len(found) < count and time.monotonic() < deadline:
            for msg in consume_available(consumer, count - len(found), 0.2):
                err = msg.error()
                if err is None:
                    found.append(msg)
                else:
                    raise_if_refused(consumer.kafka, err, "READ", msg.topic(), "topic")
            for tp in consumer.position([TopicPartition(parts[0].topic, p) for p in ends]):
                if tp.offset >= ends[tp.partition]:
                    del ends[tp.partition]
    finally:
        consumer.unassign()
    return found[:count]
