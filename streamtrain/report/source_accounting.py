"""Accounting of a bridge's source topics: what became of every source record, by (topic, partition, offset).

The same bins as the device topics' (`accounting.account_records`), named for the bridge, and read from
Kafka alone:

- bridged: a sample in a device topic names it as its source (metadata `source`, `topic/partition/offset`);
- rejected: a dead letter names it (the decoder's or the check's reason);
- skipped: a dead letter with reason `skipped` names it (the decoder returned None on purpose);
- pending: none of these, at or above the bridge group's committed offset (not bridged yet, and it will be);
- lost: none of these, below the committed offset.

The source topics are read from the sources' cluster (`bridge.source_cluster`, else `kafka`); the device
topics, the dead letters and the group's committed offsets from the stack's (`streamtrain.bridge.progress`).

A source record bridged more than once (a duplicate in the device topics) counts in `duplicated`: exactly once
means 0 lost and 0 duplicated, whatever crashed.
"""

from __future__ import annotations

from array import array
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
from confluent_kafka import Message, TopicPartition

from streamtrain.bridge.progress import BridgeProgress
from streamtrain.config import StreamtrainConfig
from streamtrain.decoders import SKIPPED_REASON, source_of
from streamtrain.kafka import read_to_end, tail_positions
from streamtrain.report.accounting import RecordFates, account_records
from streamtrain.wire import DeadLetter, Sample, WireError, decode

__all__ = ["SourceRecords", "SourceTally", "collect_sources", "tally_sources"]

_Partition = tuple[str, int]
_R = TypeVar("_R", Sample, DeadLetter)


@dataclass(frozen=True)
class SourceTally:
    """One source partition's accounting."""

    topic: str
    partition: int
    fates: RecordFates
    """The bins of `account_records`: trained is bridged, dead-lettered is rejected, truncated is skipped."""
    rejected_twice: int
    """Dead letters beyond the first for one record (a rejection written twice)."""
    reasons: dict[str, int]
    """Dead letters by reason (`skipped` included)."""

    @property
    def duplicated(self) -> int:
        """Source records written more than once: as a sample (bridged twice) or as a dead letter."""
        return self.fates.retrained + self.rejected_twice

    @property
    def exact(self) -> bool:
        """Nothing lost, nothing unknown, nothing written twice."""
        return self.fates.settled and self.duplicated == 0

    def summary(self) -> dict[str, object]:
        """What a run report shows for the partition."""
        f = self.fates
        return {"topic": self.topic, "partition": self.partition, "records": f.records, "bridged": f.trained,
                "rejected": f.dead_lettered, "skipped": f.truncated, "pending": f.pending, "lost": len(f.lost),
                "unknown": len(f.unknown), "duplicated": self.duplicated, "reasons": dict(self.reasons)}


@dataclass
class SourceRecords:
    """What the source topics, the device topics and the dead-letter topic hold, by source partition."""

    offsets: dict[_Partition, np.ndarray] = field(default_factory=dict)
    log_start: dict[_Partition, int] = field(default_factory=dict)
    committed: dict[_Partition, int | None] = field(default_factory=dict)
    bridged: dict[_Partition, np.ndarray] = field(default_factory=dict)
    """Source offsets named by device-topic samples, once per sample."""
    letters: dict[_Partition, list[tuple[int, str]]] = field(default_factory=dict)
    """(offset, reason) of each dead letter naming the partition."""


def collect_sources(cfg: StreamtrainConfig, timeout: float = 60.0,
                    stop: Callable[[], bool] | None = None) -> SourceRecords:
    """Read back the sources of `bridge.sources`, the bridge's committed offsets, the device topics of
    `bridge_devices` and the dead-letter topic.

    Raises:
        TimeoutError / KafkaException: the broker does not deliver the records within `timeout`.
    """
    kafka, sources = cfg.kafka, [s.topic for s in cfg.bridge.sources]
    out = SourceRecords()
    progress = BridgeProgress(cfg)
    with progress.clients() as (reader, member):  # the group's offsets are asked for, it is never joined
        parts = []
        for topic in sources:
            for pid, (low, _high) in tail_positions(reader, topic, None, timeout).items():
                out.log_start[(topic, pid)] = low
                parts.append(TopicPartition(topic, pid))
        for tp in progress.committed(member, parts, timeout):
            out.committed[(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else None
    offsets: dict[_Partition, array[int]] = defaultdict(lambda: array("q"))
    for msg in read_to_end(progress.source, sources, timeout, stop=stop):
        offsets[(msg.topic() or "", msg.partition() or 0)].append(msg.offset() or 0)
    bridged: dict[_Partition, array[int]] = defaultdict(lambda: array("q"))
    for sample in _decoded(read_to_end(kafka, [kafka.topics.device(d) for d in cfg.bridge_devices], timeout,
                                       stop=stop), Sample):
        where = source_of(sample)
        if where is not None and where[0] in sources:
            bridged[where[:2]].append(where[2])
    for letter in _decoded(read_to_end(kafka, [kafka.topics.dead_letter], timeout, stop=stop), DeadLetter):
        if letter.topic in sources:
            out.letters.setdefault((letter.topic, letter.partition), []).append((letter.offset, letter.reason))
    out.offsets = {k: np.frombuffer(v, dtype=np.int64).copy() for k, v in offsets.items()}
    out.bridged = {k: np.frombuffer(v, dtype=np.int64).copy() for k, v in bridged.items()}
    return out


def _decoded(messages: Iterable[Message], kind: type[_R]) -> Iterator[_R]:
    for msg in messages:
        try:
            yield decode(msg.value(), msg.headers(), kind, validate=False)
        except WireError:
            continue  # not a record of ours: it names no source


def tally_sources(run: SourceRecords) -> list[SourceTally]:
    """Every record of every source partition in one bin (see the module docstring), sorted by partition."""
    empty = np.zeros(0, dtype=np.int64)
    tallies = []
    for key in sorted(set(run.log_start) | set(run.offsets)):
        letters = run.letters.get(key, [])
        skipped = [o for o, r in letters if r == SKIPPED_REASON]
        rejected = [o for o, r in letters if r != SKIPPED_REASON]
        fates = account_records(run.offsets.get(key, empty), trained=run.bridged.get(key, empty),
                                truncated=skipped, dead_lettered=rejected, committed=run.committed.get(key),
                                log_start=run.log_start.get(key))
        twice = len(letters) - len({o for o, _ in letters})
        tallies.append(SourceTally(key[0], key[1], fates, twice, dict(Counter(r for _, r in letters))))
    return tallies
