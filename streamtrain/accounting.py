"""Seq accounting: which of a device's samples were seen, missed, or seen more than once."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

__all__ = ["DeviceAccount", "SeqLedger"]


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

    def account(self, device_id: str, expected: int) -> DeviceAccount:
        """Tally one device against seqs 0..expected-1."""
        counts = self._counts.get(device_id, Counter())
        missing = tuple(s for s in range(expected) if counts[s] == 0)
        unexpected = tuple(sorted(s for s in counts if not 0 <= s < expected))
        duplicates = sum(c - 1 for s, c in counts.items() if c > 1 and 0 <= s < expected)
        return DeviceAccount(device_id, expected, sum(counts.values()), missing, duplicates, unexpected)
