"""After a run: read what happened back from Kafka, and account for every record of every device topic.

Everything comes from the broker, not from the services' own counters: the device topics (each record's
offset, seq, bytes and append time), the trainers' committed offsets, the feedback topic (the offsets each
step trained and truncation dropped), the assignments topic (the plans) and the dead-letter topic. Each
record then lands in one bin — trained, truncated, dead-lettered, pending or lost — by its (topic,
partition, offset) alone (`streamtrain.accounting.account_records`): whatever the producers' seqs look
like, and with pending (not processed yet, resumable from the committed offset) kept apart from loss.

The records are held as numpy arrays, a few integers per record, so reading back a large run costs time
and memory in proportion to its records; a `stop` callable ends the read early (Ctrl-C).
"""

from __future__ import annotations

import contextlib
import logging
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from confluent_kafka import TopicPartition

from streamtrain.config import StreamtrainConfig
from streamtrain.kafka import make_consumer, read_to_end, tail_positions
from streamtrain.report.accounting import RecordFates, account_records
from streamtrain.wire import (
    Assignment,
    DeadLetter,
    DeviceProfile,
    Evaluation,
    Sample,
    SchemaMismatchError,
    StepFeedback,
    WireError,
    decode,
    expand_ranges,
)

__all__ = ["DeviceRecords", "DeviceTally", "ReadInterrupted", "RunRecords", "collect_records", "tally_devices"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T", StepFeedback, Assignment, DeadLetter, Evaluation)


class ReadInterrupted(RuntimeError):
    """Reading the run back was stopped (Ctrl-C) before it was complete."""


@dataclass(frozen=True)
class DeviceRecords:
    """The records of one device topic, one array entry per record, in the order read (offset order per partition).

    Attributes:
        partitions: Partition of each record.
        offsets: Offset of each record.
        seqs: Seq of each record (meaningful only where `decoded`).
        decoded: Whether the record decoded as a Sample.
        timestamps_ms: Append time of each record.
        sizes: Size of each record's sample (0 where not decoded).
        identities: A hash of (seq, record bytes) per record: equal for two copies of one sample.
    """

    partitions: np.ndarray
    offsets: np.ndarray
    seqs: np.ndarray
    decoded: np.ndarray
    timestamps_ms: np.ndarray
    sizes: np.ndarray
    identities: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets)

    @classmethod
    def empty(cls) -> DeviceRecords:
        zeros = np.zeros(0, dtype=np.int64)
        return cls(zeros, zeros, zeros, np.zeros(0, dtype=bool), zeros, zeros, zeros)


class _RecordColumns:
    """Growing typed columns (8 bytes per value, no Python object per record) that become a `DeviceRecords`."""

    def __init__(self) -> None:
        self.partitions, self.offsets, self.seqs = array("q"), array("q"), array("q")
        self.timestamps, self.sizes, self.identities = array("q"), array("q"), array("q")
        self.decoded = array("b")

    def add(self, partition: int, offset: int, timestamp_ms: int, value: bytes | None, sample: Sample | None) -> None:
        self.partitions.append(partition)
        self.offsets.append(offset)
        self.timestamps.append(timestamp_ms)
        self.decoded.append(sample is not None)
        self.seqs.append(sample.seq if sample is not None else -1)
        self.sizes.append(sample.size if sample is not None else 0)
        self.identities.append(hash((sample.seq if sample is not None else None, value)))

    def freeze(self) -> DeviceRecords:
        def col(values: array[int]) -> np.ndarray:
            return np.frombuffer(values, dtype=np.int64).copy()

        return DeviceRecords(col(self.partitions), col(self.offsets), col(self.seqs),
                             np.frombuffer(self.decoded, dtype=np.int8).astype(bool), col(self.timestamps),
                             col(self.sizes), col(self.identities))


@dataclass
class RunRecords:
    """What a run left in Kafka, for the devices it ran."""

    devices: list[str]
    records: dict[str, DeviceRecords] = field(default_factory=dict)
    log_start: dict[tuple[str, int], int] = field(default_factory=dict)
    high: dict[tuple[str, int], int] = field(default_factory=dict)
    committed: dict[tuple[str, int], int | None] = field(default_factory=dict)
    feedback: list[StepFeedback] = field(default_factory=list)
    assignments: list[Assignment] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    evaluations: list[Evaluation] = field(default_factory=list)
    """Held-out evaluations (none when the trainers evaluate nothing)."""
    unreadable: int = 0


@dataclass(frozen=True)
class DeviceTally:
    """One device's accounting: the fates of its records, and its dead letters by reason."""

    device: str
    fates: RecordFates
    dead_letter_reasons: dict[str, int]

    def summary(self) -> dict[str, object]:
        """What the run report shows for the device."""
        return {"device": self.device, **self.fates.summary(), "dead_letter_reasons": dict(self.dead_letter_reasons)}


def collect_records(cfg: StreamtrainConfig, devices: Sequence[str], timeout: float = 60.0,
                    stop: Callable[[], bool] | None = None) -> RunRecords:
    """Read the run's topics to their ends and the trainers' committed offsets.

    Args:
        cfg: The run's configuration (job, Kafka, the trainers' group).
        devices: The devices whose topics to read.
        timeout: Seconds each topic may take to deliver its records.
        stop: Checked while reading; once it returns true the read ends with `ReadInterrupted`.

    Raises:
        ReadInterrupted: `stop` said so.
        TimeoutError / KafkaException: when the broker does not deliver the records within `timeout`.
    """
    kcfg = cfg.kafka
    topics = kcfg.topics
    device_of = {topics.device(d): d for d in devices}
    out = RunRecords(list(devices))
    consumer = make_consumer(kcfg, cfg.trainer_group_id)  # only asks for the group's offsets, never joins it
    try:
        parts = []
        for topic in device_of:
            for pid, (low, high) in tail_positions(consumer, topic, None, timeout).items():
                out.log_start[(topic, pid)], out.high[(topic, pid)] = low, high
                parts.append(TopicPartition(topic, pid))
        for tp in consumer.committed(parts, timeout=timeout):
            out.committed[(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else None
    finally:
        consumer.close()
    columns = {d: _RecordColumns() for d in devices}
    for msg in read_to_end(kcfg, list(device_of), timeout, stop=stop):
        value = msg.value()
        sample: Sample | None = None
        # Not validated (its payload is not needed here): a bad record is dead-lettered by the trainer, and the
        # dead-letter topic says so.
        with contextlib.suppress(WireError):
            sample = decode(value, msg.headers(), Sample, validate=False)
        columns[device_of[msg.topic() or ""]].add(msg.partition() or 0, msg.offset() or 0, int(msg.timestamp()[1]),
                                                  value, sample)
    _check(stop)
    out.records = {d: c.freeze() for d, c in columns.items()}
    out.feedback = _read(cfg, topics.feedback, StepFeedback, timeout, out, stop, beside=(DeviceProfile,))
    out.assignments = _read(cfg, topics.assignments, Assignment, timeout, out, stop)
    out.dead_letters = _read(cfg, topics.dead_letter, DeadLetter, timeout, out, stop)
    if cfg.trainer.eval_path is not None or cfg.trainer.eval_packaged is not None:
        out.evaluations = [e for e in _read(cfg, topics.evaluations, Evaluation, timeout, out, stop)
                           if e.job == cfg.job]
    wanted = set(devices)
    out.feedback = [f for f in out.feedback if f.job == cfg.job and f.device_id in wanted]
    out.assignments = [a for a in out.assignments if a.job == cfg.job]
    return out


def _check(stop: Callable[[], bool] | None) -> None:
    if stop is not None and stop():
        raise ReadInterrupted("reading the run back from Kafka was interrupted")


def _read(cfg: StreamtrainConfig, topic: str, kind: type[_T], timeout: float, out: RunRecords,
          stop: Callable[[], bool] | None, beside: tuple[type[Any], ...] = ()) -> list[_T]:
    """The records of `kind` in `topic`; records of the kinds `beside` it there (a rank's start-up profile on the
    feedback topic) are passed over, anything else is counted unreadable."""
    items: list[_T] = []
    for msg in read_to_end(cfg.kafka, [topic], timeout, stop=stop):
        try:
            items.append(decode(msg.value(), msg.headers(), kind))
        except SchemaMismatchError as exc:
            if not _one_of(msg, beside):
                out.unreadable += 1
                logger.warning("unreadable record in %s at offset %s: %s", topic, msg.offset(), exc)
        except WireError as exc:
            out.unreadable += 1
            logger.warning("unreadable record in %s at offset %s: %s", topic, msg.offset(), exc)
    _check(stop)
    return items


def _one_of(msg: Any, kinds: tuple[type[Any], ...]) -> bool:
    for other in kinds:
        with contextlib.suppress(WireError):
            decode(msg.value(), msg.headers(), other)
            return True
    return False


def tally_devices(cfg: StreamtrainConfig, run: RunRecords, running: bool = False) -> list[DeviceTally]:
    """Account for every record of every device topic (its partition 0: a rank trains one partition).

    Args:
        cfg: The run's configuration.
        run: What `collect_records` read.
        running: The deployment was still running while it was read: what the feedback and dead letters say of
            offsets past the last record read (records that arrived, and were trained, after the device topic was
            read) is left out, rather than counted as offsets the topic never held.
    """
    topics = cfg.kafka.topics
    tallies = []
    for device in run.devices:
        topic = topics.device(device)
        records = run.records.get(device, DeviceRecords.empty())
        mine = records.partitions == 0
        high: int | None = None
        if running:
            read_to = records.offsets[mine]
            high = int(read_to.max()) + 1 if len(read_to) else run.high.get((topic, 0), 0)
        feedback = [fb for fb in run.feedback if fb.device_id == device]
        letters = [d for d in run.dead_letters if d.topic == topic and d.partition == 0
                   and (high is None or d.offset < high)]

        def read(offsets: np.ndarray, high: int | None = high) -> np.ndarray:
            return offsets if high is None else offsets[offsets < high]

        fates = account_records(
            records.offsets[mine],
            trained=read(np.concatenate([expand_ranges(fb.trained_offsets) for fb in feedback]
                                        or [np.zeros(0, np.int64)])),
            truncated=read(np.concatenate([expand_ranges(fb.dropped_offsets) for fb in feedback]
                                          or [np.zeros(0, np.int64)])),
            dead_lettered=[d.offset for d in letters], committed=run.committed.get((topic, 0)),
            log_start=run.log_start.get((topic, 0)), identities=records.identities[mine & records.decoded],
            undecodable=int((mine & ~records.decoded).sum()))
        tallies.append(DeviceTally(device, fates, dict(Counter(d.reason for d in letters))))
    return tallies
