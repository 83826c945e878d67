"""What the bridge checks before it starts: each source topic exists, and its decoder works on its first records.

The first records are the ones the bridge would bridge next (from its group's committed offsets, else the log
start), read from the sources' cluster (`bridge.source_cluster`, else `kafka`) by a consumer that is assigned,
never subscribed, and never commits: peeking changes nothing.
A decoder that breaks the contract on any of them, or that rejects most of them (more than
`bridge.check_min_decoded` allows: a shape that fits a few records by chance passes "any"), is a setting to fix,
not bad data: the bridge does not start, and the message names the setting.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, KafkaException, Message, TopicPartition

from streamtrain.authz import raise_if_refused
from streamtrain.config import StreamtrainConfig
from streamtrain.decoders import ContractError, Decoder, Rejected, SourceRecord, to_sample
from streamtrain.kafka import KafkaConsumer, consume_available, topic_metadata, transient, watermarks

from .errors import BridgeSetupError
from .progress import BridgeProgress

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
    progress = BridgeProgress(cfg)
    # A reader of the sources, and the bridge's own group for its committed offsets (neither joins it).
    with progress.clients() as (consumer, member):
        checks = []
        for i, source in enumerate(bridge.sources):
            setting = f"bridge.sources.{i}"
            parts = _partitions(consumer, source.topic, setting, min(bridge.check_seconds, 10.0), progress)
            count = bridge.check_records
            starts = _starts(progress, member, parts, source.topic) if count else []
            messages = _peek(consumer, starts, count, bridge.check_seconds, progress) if count else []
            found = try_decoder(decoders[source.topic], [SourceRecord.from_message(m) for m in messages], devices,
                                setting, bridge.check_min_decoded)
            checks.append(SourceCheck(source.topic, len(parts), *found))
            logger.info("checked %s (%d partitions): %d of its next %d records decode (%d skipped, %d rejected)",
                        source.topic, len(parts), found[1], found[0], found[2], found[3])
        return checks


#: The longest the check waits for the group's committed offsets before it peeks at the log start instead.
COMMITTED_WAIT_S = 10.0


def _starts(progress: BridgeProgress, member: KafkaConsumer, parts: list[TopicPartition],
            topic: str) -> list[TopicPartition]:
    """Where the group stands on `parts`, or the log start when its committed offsets cannot be read in time.

    A bridge killed mid-transaction leaves its offset commit open: until this bridge's start fences it (after the
    check) or the broker's transaction timeout aborts it, the offsets are unstable and a read of them waits. The
    check only needs records to try the decoder on, so it does not wait for that (a wait as long as the
    transaction timeout ended the start with a timeout).
    """
    try:
        return progress.committed(member, parts, COMMITTED_WAIT_S)
    except KafkaException as exc:
        err = exc.args[0]
        if not transient(err):
            raise  # a refusal (the group's ACL) or a broken setting: the start fails naming it
        logger.warning("the group's committed offsets of %s could not be read in time (%s): an earlier bridge's "
                       "open transaction may hold them until this one fences it; its decoder is tried on the first "
                       "records of the log instead", topic, err.str())
        return [TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING) for tp in parts]


def try_decoder(decoder: Decoder, records: list[SourceRecord], devices: Collection[str], setting: str,
                min_decoded: float = 0.5) -> tuple[int, int, int, int]:
    """Try `decoder` on `records`: (records, samples, skipped, rejected).

    Args:
        decoder: the source's decoder.
        records: its topic's next records.
        devices: the job's devices.
        setting: how the settings name the source, e.g. "bridge.sources.0".
        min_decoded: the least share of the records, skipped ones aside, that must decode (`bridge.check_min_decoded`).

    Raises:
        BridgeSetupError: the decoder broke its contract on one of them, or decoded fewer than `min_decoded` of
            them; the message names the setting behind the most common rejection (`<setting>.decoder`, the
            decoder's own setting, or bridge.devices).
    """
    samples = skipped = 0
    rejected: list[tuple[SourceRecord, Rejected]] = []
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
            rejected.append((record, exc))
        except Exception as exc:  # a user decoder's own failure: a rejection like any other
            rejected.append((record, Rejected("decoder-error", f"{type(exc).__name__}: {exc}")))
    if rejected and samples < min_decoded * (samples + len(rejected)):
        raise BridgeSetupError(_too_few(rejected, samples, len(records), setting, min_decoded))
    return len(records), samples, skipped, len(rejected)


def _too_few(rejected: list[tuple[SourceRecord, Rejected]], samples: int, tried: int, setting: str,
             min_decoded: float) -> str:
    """The start-up check's refusal: how many decoded, and the most common rejection, by its setting."""
    reason, count = Counter(why.reason for _, why in rejected).most_common(1)[0]
    record, why = next((r, w) for r, w in rejected if w.reason == reason)
    named = why.setting if (why.setting or "").startswith("bridge.") else f"{setting}.{why.setting or 'decoder'}"
    first = f"({record.source}): {why.reason}: {why.detail}"
    if not samples:
        return f"{named}: none of the first {tried} records of {record.topic} decodes; the first {first}"
    return (f"{named}: only {samples} of the first {tried} records of {record.topic} decode (bridge.check_min_decoded "
            f"= {min_decoded:g} of those not skipped); {len(rejected)} rejected, {count} as {reason}, "
            f"the first {first}")


def _partitions(consumer: KafkaConsumer, topic: str, setting: str, timeout: float,
                progress: BridgeProgress) -> list[TopicPartition]:
    try:
        meta = topic_metadata(consumer, topic, timeout=timeout)
    except KafkaException as exc:
        raise_if_refused(consumer.kafka, exc.args[0], "DESCRIBE", topic, "topic")
        where = f" on {progress.where}" if progress.remote else ""
        raise BridgeSetupError(f"{setting}.topic: topic {topic} is not there{where} ({exc.args[0].str()}): create "
                               "it, or fix the name") from None
    return [TopicPartition(topic, pid) for pid in sorted(meta.partitions)]


def _peek(consumer: KafkaConsumer, parts: list[TopicPartition], count: int, seconds: float,
          progress: BridgeProgress) -> list[Message]:
    """Up to `count` records from where the group stands (`parts`: its committed offsets, negative where none: the
    log start), waiting at most `seconds`."""
    deadline = time.monotonic() + seconds
    ends: dict[int, int] = {}
    start = []
    for tp in parts:
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
                elif not progress.ignored(err):
                    raise_if_refused(consumer.kafka, err, "READ", msg.topic(), "topic")
            for tp in consumer.position([TopicPartition(parts[0].topic, p) for p in ends]):
                if tp.offset >= ends[tp.partition]:
                    del ends[tp.partition]
    finally:
        consumer.unassign()
    return found[:count]
