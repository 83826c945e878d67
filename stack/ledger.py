"""After a run: read what happened back from Kafka, and account for every sample produced.

Everything comes from the broker, not from the services' own counters: the device topics (each
record's offset, seq and timestamp), the trainers' committed offsets, the feedback topic (samples
trained and dropped per step), the assignments topic (the plans) and the dead-letter topic. A
device's records then fall into exactly one of:

- dead-lettered: its (topic, partition, offset) is in the dead-letter topic;
- processed: below the trainers' committed offset, so trained or truncated — and the feedback's
  trained + dropped counts must add up to the processed records exactly;
- pending: at or above the committed offset: never processed (the run stopped before the backlog
  drained).

`samples_unaccounted` is then pending records + seqs missing from the topic (failed deliveries) +
processed records that no feedback counts as trained or dropped.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from confluent_kafka import TopicPartition

from streamtrain.accounting import SeqLedger
from streamtrain.config import StreamtrainConfig
from streamtrain.kafka import make_consumer, read_to_end, tail_positions
from streamtrain.wire import Assignment, DeadLetter, Evaluation, Sample, StepFeedback, WireError, decode

__all__ = ["DeviceRecord", "DeviceTally", "RunRecords", "collect_records", "tally_devices"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T", StepFeedback, Assignment, DeadLetter, Evaluation)


@dataclass(frozen=True)
class DeviceRecord:
    """One record of a device topic: where it is, its seq (None when undecodable), when it was appended."""

    partition: int
    offset: int
    seq: int | None
    timestamp_ms: int
    size: int | None


@dataclass
class RunRecords:
    """What a run left in Kafka, for the devices it ran."""

    devices: list[str]
    records: dict[str, list[DeviceRecord]] = field(default_factory=dict)
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
    """One device's accounting (see the module docstring)."""

    device: str
    produced: int
    trained: int
    truncated: int
    dead_lettered: int
    pending: int
    unexplained: int
    duplicated: int
    seq_missing: int
    seq_duplicates: int

    @property
    def unaccounted(self) -> int:
        return self.pending + self.seq_missing + self.unexplained


def collect_records(cfg: StreamtrainConfig, devices: Sequence[str], timeout: float = 60.0) -> RunRecords:
    """Read the run's topics to their ends and the trainers' committed offsets.

    Raises:
        TimeoutError / KafkaException: when the broker does not deliver the records within `timeout`.
    """
    kcfg = cfg.kafka
    topics = kcfg.topics
    device_of = {topics.device(d): d for d in devices}
    out = RunRecords(list(devices), {d: [] for d in devices})
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
    for msg in read_to_end(kcfg, list(device_of), timeout):
        device = device_of[msg.topic() or ""]
        seq = size = None
        try:
            sample = decode(msg.value(), msg.headers(), Sample)
            seq, size = sample.seq, sample.size
        except WireError:
            pass  # a bad record: the trainer dead-letters it; the dead-letter topic says so
        out.records[device].append(DeviceRecord(msg.partition() or 0, msg.offset() or 0, seq,
                                                int(msg.timestamp()[1]), size))
    out.feedback = _read(cfg, topics.feedback, StepFeedback, timeout, out)
    out.assignments = _read(cfg, topics.assignments, Assignment, timeout, out)
    out.dead_letters = _read(cfg, topics.dead_letter, DeadLetter, timeout, out)
    if cfg.trainer.eval_path is not None or cfg.trainer.eval_packaged is not None:
        out.evaluations = [e for e in _read(cfg, topics.evaluations, Evaluation, timeout, out) if e.job == cfg.job]
    wanted = set(devices)
    out.feedback = [f for f in out.feedback if f.job == cfg.job and f.device_id in wanted]
    out.assignments = [a for a in out.assignments if a.job == cfg.job]
    return out


def _read(cfg: StreamtrainConfig, topic: str, kind: type[_T], timeout: float, out: RunRecords) -> list[_T]:
    items: list[_T] = []
    for msg in read_to_end(cfg.kafka, [topic], timeout):
        try:
            items.append(decode(msg.value(), msg.headers(), kind))
        except WireError as exc:
            out.unreadable += 1
            logger.warning("unreadable record in %s at offset %s: %s", topic, msg.offset(), exc)
    return items


def tally_devices(cfg: StreamtrainConfig, run: RunRecords) -> list[DeviceTally]:
    """Account for every record of every device topic (see the module docstring)."""
    topics = cfg.kafka.topics
    dead: set[tuple[str, int, int]] = {(d.topic, d.partition, d.offset) for d in run.dead_letters}
    trained: dict[str, int] = defaultdict(int)
    dropped: dict[str, int] = defaultdict(int)
    for fb in run.feedback:
        trained[fb.device_id] += fb.samples
        dropped[fb.device_id] += fb.dropped
    tallies = []
    for device in run.devices:
        topic = topics.device(device)
        ledger = SeqLedger()
        n_dead = pending = processed = 0
        for rec in run.records[device]:
            if rec.seq is not None:
                ledger.add(device, rec.seq)
            committed = run.committed.get((topic, rec.partition))
            if (topic, rec.partition, rec.offset) in dead:
                n_dead += 1
            elif committed is not None and rec.offset < committed:
                processed += 1
            else:
                pending += 1
        seqs = [r.seq for r in run.records[device] if r.seq is not None]
        account = ledger.account(device, max(seqs) + 1 if seqs else 0)
        counted = trained[device] + dropped[device]
        tallies.append(DeviceTally(
            device=device, produced=len(run.records[device]), trained=trained[device], truncated=dropped[device],
            dead_lettered=n_dead, pending=pending, unexplained=max(0, processed - counted),
            duplicated=max(0, counted - processed), seq_missing=len(account.missing),
            seq_duplicates=account.duplicates))
    return tallies
