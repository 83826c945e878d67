"""Accounting by record: what became of every record of a device topic, by (topic, partition, offset).

After a run every record of a device-topic partition falls into exactly one bin:

- trained: a step trained it (its offset is in some feedback's `trained_offsets`);
- dead-lettered: its offset is in the dead-letter topic (undecodable, untrainable, refused by the payload
  rule, or in a step skipped because its loss was not finite);
- truncated: truncation dropped it (its offset is in some feedback's `dropped_offsets`);
- pending: none of these, at or above the committed offset: not processed yet, and resumable from the
  committed offset, so not lost;
- lost: none of these, below the committed offset: processed past with no record of what became of it.

The bins come from offsets alone, so the producers may number their samples any way (from a timestamp,
with gaps, two producers on one topic); seqs only help find a record written twice, as a record whose
(seq, bytes) repeat an earlier one. Everything is numpy over arrays of offsets: time and memory are
linear in the records read.

`SeqLedger` is the other kind of check: that a stream our own producers numbered 0..n-1 arrived whole.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

__all__ = ["DeviceAccount", "RecordFates", "SeqLedger", "account_records"]


def _int64(values: Collection[int] | np.ndarray) -> np.ndarray:
    return np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.int64).reshape(-1)


def _unique(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct values and how often each occurs, by one sort (`np.unique` may hash instead: far slower
    on large int64 arrays)."""
    ordered = np.sort(values, kind="stable")
    first = np.ones(len(ordered), dtype=bool)
    first[1:] = ordered[1:] != ordered[:-1]
    starts = np.flatnonzero(first)
    return ordered[starts], np.diff(np.append(starts, len(ordered)))


@dataclass(frozen=True)
class RecordFates:
    """What became of every record of one device-topic partition (see the module docstring)."""

    records: int
    """Records accounted: those read back, and those below the log start that the run names (deleted after
    they were processed)."""
    trained: int
    truncated: int
    dead_lettered: int
    pending: int
    lost: np.ndarray
    """Offsets processed past (below the committed offset) that nothing says were trained, dropped or
    dead-lettered."""
    retrained: int
    """Trainings of a record beyond its first (at-least-once after a crash; 0 in a run without faults)."""
    unknown: np.ndarray
    """Offsets that feedback or dead letters name but the topic never held."""
    written_twice: int
    """Records that repeat an earlier record of the topic (same seq and bytes: one sample written twice)."""
    undecodable: int
    """Records the reader could not decode (each also in some bin: normally dead-lettered)."""

    @property
    def unaccounted(self) -> int:
        """Records lost, plus records the run claims that the topic never held."""
        return len(self.lost) + len(self.unknown)

    @property
    def settled(self) -> bool:
        """Nothing lost or unknown: every record trained, truncated, dead-lettered or safely pending."""
        return self.unaccounted == 0

    @property
    def complete(self) -> bool:
        """`settled`, and nothing pending either: the run processed every record."""
        return self.settled and self.pending == 0

    def summary(self) -> dict[str, int]:
        """The counts, as the run report holds them."""
        return {"records": self.records, "trained": self.trained, "truncated": self.truncated,
                "dead_lettered": self.dead_lettered, "pending": self.pending, "lost": len(self.lost),
                "unknown": len(self.unknown), "unaccounted": self.unaccounted, "retrained": self.retrained,
                "written_twice": self.written_twice, "undecodable": self.undecodable}


def account_records(
    offsets: Collection[int] | np.ndarray,
    *,
    trained: Collection[int] | np.ndarray = (),
    truncated: Collection[int] | np.ndarray = (),
    dead_lettered: Collection[int] | np.ndarray = (),
    committed: int | None = None,
    log_start: int | None = None,
    identities: np.ndarray | None = None,
    undecodable: int = 0,
) -> RecordFates:
    """Put every record of one partition in one bin (see the module docstring).

    Args:
        offsets: Offsets of the records read back (one per record).
        trained: Offsets the feedback says were trained, once per training (repeats are retrainings).
        truncated: Offsets the feedback says truncation dropped.
        dead_lettered: Offsets of this partition found in the dead-letter topic.
        committed: The trainers' committed offset (None: nothing committed, so nothing processed past).
        log_start: The partition's log start: records below it are gone, and those the run names are
            accounted from what it says of them. Default: the lowest offset read.
        identities: Per record of `offsets`, a key equal for two copies of one sample (e.g. a hash of seq
            and bytes), to count records written twice; None: not counted.
        undecodable: How many of the records could not be decoded (reported, not binned).

    Returns:
        The fates.
    """
    read = _int64(offsets)
    trained_once, times = _unique(_int64(trained))
    dropped, _ = _unique(_int64(truncated))
    dead, _ = _unique(_int64(dead_lettered))
    floor = int(read.min()) if log_start is None and len(read) else (log_start or 0)
    named = np.concatenate([trained_once, dropped, dead])
    every, _ = _unique(np.concatenate([read, named[named < floor]]))  # below the floor: deleted once processed
    claimed, _ = _unique(named[named >= floor])
    unknown = claimed[~np.isin(claimed, read)]

    is_trained = np.isin(every, trained_once, assume_unique=True)
    is_dead = ~is_trained & np.isin(every, dead, assume_unique=True)
    is_dropped = ~is_trained & ~is_dead & np.isin(every, dropped, assume_unique=True)
    unfated = every[~(is_trained | is_dead | is_dropped)]
    below = unfated < committed if committed is not None else np.zeros(len(unfated), dtype=bool)
    known = np.isin(trained_once, every, assume_unique=True)

    written_twice = 0
    if identities is not None and len(identities):
        written_twice = int(len(identities) - len(_unique(np.asarray(identities))[0]))
    return RecordFates(
        records=len(every), trained=int(is_trained.sum()), truncated=int(is_dropped.sum()),
        dead_lettered=int(is_dead.sum()), pending=int((~below).sum()), lost=unfated[below],
        retrained=int((times[known] - 1).sum()), unknown=unknown, written_twice=written_twice,
        undecodable=undecodable)


@dataclass(frozen=True)
class DeviceAccount:
    """One device's tally against the seqs 0..expected-1 its producer numbered."""

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
    """Counts every (device, seq) seen, to check a stream that one of our producers numbered 0..n-1.

    This is the producers' own contract (each of them numbers its device's samples densely from 0), not how
    a run is accounted: a run is accounted by record (`account_records`), whatever the numbering.
    """

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
        """Tally one device against the seqs 0..expected-1 its producer sent."""
        counts = self._counts.get(device_id, Counter())
        seqs = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        times = np.fromiter(counts.values(), dtype=np.int64, count=len(counts))
        inside = (seqs >= 0) & (seqs < expected)
        # Missing = expected - distinct seen inside; listed by walking the sorted seqs, not the whole range.
        present = np.sort(seqs[inside])
        gaps = np.flatnonzero(np.diff(np.concatenate([[-1], present, [expected]])) > 1)
        edges = np.concatenate([[-1], present, [expected]])
        missing = tuple(int(s) for g in gaps for s in range(int(edges[g]) + 1, int(edges[g + 1])))
        return DeviceAccount(device_id, expected, int(times.sum()), missing, int((times[inside] - 1).sum()),
                             tuple(int(s) for s in np.sort(seqs[~inside])))
