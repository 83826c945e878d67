"""A rank's bounded buffer of decoded samples and the offset arithmetic of what may be committed.

Offsets are those of the rank's one device-topic partition. An offset is *unprocessed* while its
sample sits in the buffer or in the step now running; everything below the position that is
neither was trained, dropped (truncated) or dead-lettered. The committable offset is therefore
the lowest unprocessed one, which stays put when a plan trains samples out of order:

    buffer.add(5, s5); buffer.add(6, s6); buffer.add(7, s7)
    buffer.take([5, 7]); buffer.complete_step()
    buffer.lowest_unprocessed()  # 6: committing 8 would lose sample 6 on a restart
    buffer.processed_ahead()     # [7]: a restart from 6 must not train 7 again (the checkpoint keeps it)
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from itertools import takewhile

from streamtrain.wire import PendingSample, Sample

__all__ = ["BufferedSample", "SampleBuffer"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BufferedSample:
    """A buffered sample with its offset and record size in bytes."""

    offset: int
    sample: Sample
    nbytes: int


class SampleBuffer:
    """Samples waiting to be trained, oldest offset first, bounded in samples and bytes.

    `add` always accepts; `full` / `can_resume` tell the consumer when to pause and resume fetching
    (it stops adding as soon as the buffer is full, so the bounds hold to within one record).

    Args:
        max_samples: Pause fetching at this many buffered samples.
        max_bytes: Pause fetching at this many buffered record bytes.
        resume_ratio: Resume once below this fraction of both bounds.
        position: First offset expected from Kafka (where consumption starts).
    """

    def __init__(self, max_samples: int, max_bytes: int, resume_ratio: float = 0.8, position: int = 0) -> None:
        self.max_samples = max_samples
        self.max_bytes = max_bytes
        self.resume_ratio = resume_ratio
        self.position = position
        """Every offset below this one has been seen (buffered, dropped or dead-lettered)."""
        self.floor = 0
        """Samples below this offset are dropped on sight (the latest truncate-before)."""
        self._entries: dict[int, BufferedSample] = {}  # insertion order == offset order
        self._in_flight: dict[int, BufferedSample] = {}
        self._bytes = 0
        self._new: list[PendingSample] = []
        self._dropped: list[int] = []  # offsets dropped since the last report
        self._done_ahead: set[int] = set()  # offsets an earlier run processed past where this one resumed
        self.dropped_total = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Record bytes of the buffered samples."""
        return self._bytes

    @property
    def full(self) -> bool:
        """At or above either bound: stop fetching."""
        return len(self._entries) >= self.max_samples or self._bytes >= self.max_bytes

    @property
    def can_resume(self) -> bool:
        """Below the low-water mark of both bounds: fetching may resume."""
        return (len(self._entries) < self.max_samples * self.resume_ratio
                and self._bytes < self.max_bytes * self.resume_ratio)

    def offsets(self) -> list[int]:
        """Buffered offsets, oldest first."""
        return list(self._entries)

    def seen(self, offset: int) -> bool:
        """True when `offset` is a re-delivery of something already seen (e.g. after pause/resume)."""
        return offset < self.position

    def skip(self, offset: int) -> None:
        """Account for an offset that holds no trainable sample (dead-lettered, or processed by an earlier run):
        it counts as processed."""
        self.position = max(self.position, offset + 1)
        self._done_ahead.discard(offset)

    def pass_to(self, offset: int) -> None:
        """Every offset below `offset` that has not come is one that never will: a transactional topic's commit and
        abort markers and its aborted records take offsets no `read_committed` consumer is given, and the
        consumer's position passes them. Without this, the lowest unprocessed offset (the commit, the lag) would
        stop short of the topic's end at the last marker."""
        self.position = max(self.position, offset)

    def processed_ahead(self) -> list[int]:
        """Offsets at or above `lowest_unprocessed()` already trained, dropped or dead-lettered (plans train out of
        order): a run resuming from the lowest unprocessed offset must skip them, or it would train them again."""
        waiting = self._entries.keys() | self._in_flight.keys()
        return [o for o in range(self.lowest_unprocessed(), self.position) if o not in waiting]

    def skip_ahead(self, offsets: Iterable[int]) -> None:
        """Offsets, at or above the position, that an earlier run processed (its `processed_ahead`)."""
        self._done_ahead.update(o for o in offsets if o >= self.position)

    def done_ahead(self, offset: int) -> bool:
        """Whether an earlier run processed `offset` (to be skipped on arrival, see `skip_ahead`)."""
        return offset in self._done_ahead

    def add(self, offset: int, sample: Sample, nbytes: int) -> bool:
        """Buffer the sample at `offset`; returns False when it was dropped (below the truncation floor).

        Raises:
            ValueError: `offset` was already seen (the caller must filter re-deliveries with `seen`).
        """
        if offset < self.position:
            raise ValueError(f"offset {offset} is below the position {self.position}: already seen")
        self.position = offset + 1
        if offset < self.floor:
            self._drop([offset])
            return False
        self._entries[offset] = BufferedSample(offset, sample, nbytes)
        self._bytes += nbytes
        self._new.append(PendingSample(offset, sample.size))
        return True

    def truncate_before(self, offset: int) -> int:
        """Drop every buffered sample below `offset`, and any that arrives later below it.

        Returns:
            How many buffered samples were dropped now.
        """
        self.floor = max(self.floor, offset)
        doomed = [o for o in self._entries if o < offset]
        for o in doomed:
            self._bytes -= self._entries.pop(o).nbytes
        self._drop(doomed)
        return len(doomed)

    def _drop(self, offsets: list[int]) -> None:
        self._dropped.extend(offsets)
        self.dropped_total += len(offsets)

    @property
    def dropped_since_report(self) -> int:
        """Samples dropped since the last `drain_dropped`."""
        return len(self._dropped)

    def select_oldest(self, count: int | None = None, size_budget: int | None = None,
                      exclude: Collection[int] = ()) -> list[int]:
        """Offsets of the oldest samples within `count` and a total `size_budget` (None: no bound).

        The oldest sample is taken even when it alone exceeds the size budget, so a large sample
        cannot starve at the head of the buffer. Offsets in `exclude` (named by a later plan) are passed over.
        """
        if size_budget is not None and size_budget <= 0:
            return []
        chosen: list[int] = []
        total = 0
        for offset, entry in self._entries.items():
            if count is not None and len(chosen) >= count:
                break
            if offset in exclude:
                continue
            size = entry.sample.size
            if size_budget is not None and chosen and total + size > size_budget:
                break
            chosen.append(offset)
            total += size
        return chosen

    def take(self, offsets: Iterable[int]) -> list[Sample]:
        """Move the buffered samples at `offsets` into the running step (absent offsets are skipped).

        Raises:
            RuntimeError: the previous step was not completed.
        """
        if self._in_flight:
            raise RuntimeError("take() before complete_step() of the previous step")
        samples: list[Sample] = []
        for offset in sorted(set(offsets)):
            entry = self._entries.pop(offset, None)
            if entry is None:
                continue
            self._bytes -= entry.nbytes
            self._in_flight[offset] = entry
            samples.append(entry.sample)
        return samples

    def in_flight(self) -> list[BufferedSample]:
        """The samples of the running step, oldest first."""
        return sorted(self._in_flight.values(), key=lambda entry: entry.offset)

    def complete_step(self) -> None:
        """The running step finished its optimizer step: its samples are processed."""
        self._in_flight.clear()

    def lowest_unprocessed(self) -> int:
        """The offset to commit: every offset below it was trained, dropped or dead-lettered."""
        lowest = self.position
        if self._entries:
            lowest = min(lowest, next(iter(self._entries)))
        if self._in_flight:
            lowest = min(lowest, min(self._in_flight))
        return lowest

    @property
    def first_unreported(self) -> int:
        """Every buffered sample below this offset was reported in feedback (samples arrive in offset order)."""
        return self._new[0].offset if self._new else self.position

    @property
    def reported_depth(self) -> int:
        """Buffered samples already reported in feedback."""
        return self.count_reported()

    def count_reported(self, before: int | None = None, exclude: Collection[int] = ()) -> int:
        """Buffered samples reported in feedback and below offset `before` (None: any), less those in `exclude`."""
        bound = self.first_unreported if before is None else min(before, self.first_unreported)
        return sum(1 for offset in takewhile(lambda offset: offset < bound, self._entries) if offset not in exclude)

    def count_buffered(self, exclude: Collection[int] = ()) -> int:
        """Buffered samples, reported or not, less those in `exclude`."""
        return sum(1 for offset in self._entries if offset not in exclude)

    def drain_new(self) -> tuple[PendingSample, ...]:
        """(offset, size) of samples buffered since the last call that are still buffered (for feedback)."""
        new = tuple(p for p in self._new if p.offset in self._entries or p.offset in self._in_flight)
        self._new.clear()
        return new

    def drain_dropped(self) -> list[int]:
        """Offsets of the samples dropped since the last call (for feedback)."""
        dropped, self._dropped = self._dropped, []
        return dropped
