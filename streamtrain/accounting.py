"""Seq accounting: which of a device's samples were seen, missed, or seen more than once."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass

__all__ = ["DeviceAccount", "SeqFates", "SeqLedger", "account_device"]


@dataclass(frozen=True)
class DeviceAccount:
    """One device's tally against the seqs 0..expected-1 that were produced."""

    device_id: str
    expected: int
    seen: int
    missing: tuple[int, ...]
    duplicates: int
    unexpected: tuple[int, ...]

    @property
    def exact(self) -> bool:
        """Every expected seq seen exactly once, nothing else."""
        return not self.missing and not self.duplicates and not self.unexpected


class SeqLedger:
    """Counts every (device, seq) seen; `account` compares against what was produced."""

    def __init__(self) -> None:
        self._counts: dict[str, Counter[int]] = defaultdict(Counter)

    def add(self, device_id: str, seq: int) -> None:
        self._counts[device_id][seq] += 1

    def devices(self) -> list[str]:
        return sorted(self._counts)

    def counts(self, device_id: str) -> Counter[int]:
        """A copy of one device's seq -> times seen."""
        return Counter(self._counts.get(device_id, Counter()))

    def account(self, device_id: str, expected: int) -> DeviceAccount:
        """Tally one device against seqs 0..expected-1."""
        counts = self._counts.get(device_id, Counter())
        missing = tuple(s for s in range(expected) if counts[s] == 0)
        unexpected = tuple(sorted(s for s in counts if not 0 <= s < expected))
        duplicates = sum(c - 1 for s, c in counts.items() if c > 1 and 0 <= s < expected)
        return DeviceAccount(device_id, expected, sum(counts.values()), missing, duplicates, unexpected)


@dataclass(frozen=True)
class SeqFates:
    """What became of every record of one device topic after a run (see `account_device`).

    Every record falls into exactly one of: dead-lettered, trained (at least once), truncated (processed
    past without training, as counted by the trainers' feedback), pending (not processed yet), or lost
    (processed past, not trained, and more than the feedback says were truncated).
    """

    device_id: str
    expected: int
    """Seqs 0..expected-1 were produced."""
    records: int
    trained: int
    """Distinct seqs trained at least once."""
    duplicates: int
    """Extra trainings of a seq beyond its first (at-least-once: bounded, not zero, after a trainer crash)."""
    truncated: int
    dead_lettered: int
    pending: tuple[int, ...]
    """Seqs at or above the committed offset, never trained: the run stopped before they were processed."""
    lost: tuple[int, ...]
    """Seqs processed past but neither trained nor covered by the reported truncations (silently dropped)."""
    missing: tuple[int, ...]
    """Seqs 0..expected-1 that are not in the topic at all (never delivered, or lost by the broker)."""
    topic_duplicates: int
    """Records whose seq is already in the topic (a producer retry that idempotence did not catch)."""
    foreign: tuple[int, ...]
    """Seqs trained that the topic never held (or outside 0..expected-1)."""
    undecodable: int
    """Records without a readable seq that were not dead-lettered."""

    @property
    def complete(self) -> bool:
        """Every produced seq trained, truncated or dead-lettered; nothing lost, pending or foreign."""
        return not (self.pending or self.lost or self.missing or self.foreign or self.undecodable)

    @property
    def exact(self) -> bool:
        """`complete`, and no seq trained twice or written twice."""
        return self.complete and not self.duplicates and not self.topic_duplicates


def account_device(
    device_id: str,
    records: Iterable[tuple[int, int | None]],
    trained: SeqLedger,
    *,
    dead_offsets: Collection[int] = (),
    truncated: int = 0,
    committed: int | None = None,
    expected: int | None = None,
) -> SeqFates:
    """Account for every record of one device topic (one partition) by seq.

    Args:
        device_id: The device.
        records: (offset, seq) of every record read back from the device topic; seq None when undecodable.
        trained: Every (device, seq) handed to a training step, counted (a seq log, e.g.).
        dead_offsets: Offsets of this topic found in the dead-letter topic.
        truncated: Samples of this device the trainers reported dropped (`StepFeedback.dropped`, summed).
        committed: The trainers' committed offset of the topic (None: nothing committed).
        expected: Seqs 0..expected-1 were produced (default: up to the highest seq in the topic).
    """
    dead = set(dead_offsets)
    counts = trained.counts(device_id)
    in_topic: Counter[int] = Counter()
    n_records = n_dead = undecodable = 0
    skipped: list[int] = []
    pending: list[int] = []
    for offset, seq in records:
        n_records += 1
        if offset in dead:
            n_dead += 1
            if seq is not None:
                in_topic[seq] += 1
            continue
        if seq is None:
            undecodable += 1
            continue
        in_topic[seq] += 1
        if in_topic[seq] > 1 or counts[seq] > 0:
            continue
        if committed is not None and offset < committed:
            skipped.append(seq)
        else:
            pending.append(seq)
    if expected is None:
        expected = max(in_topic, default=-1) + 1
    n_truncated = min(len(skipped), truncated)
    lost = tuple(sorted(skipped)) if len(skipped) > truncated else ()
    return SeqFates(
        device_id=device_id, expected=expected, records=n_records,
        trained=sum(1 for s in in_topic if counts[s] > 0), duplicates=sum(c - 1 for c in counts.values() if c > 1),
        truncated=n_truncated, dead_lettered=n_dead, pending=tuple(sorted(pending)), lost=lost,
        missing=tuple(s for s in range(expected) if in_topic[s] == 0),
        topic_duplicates=sum(c - 1 for c in in_topic.values() if c > 1),
        foreign=tuple(sorted(s for s in counts if counts[s] > 0 and (s not in in_topic or not 0 <= s < expected))),
        undecodable=undecodable,
    )
