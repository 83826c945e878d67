"""One device's pending-sample index as the coordinator rebuilds it from its trainer's feedback and the plans.

What a trainer reported as newly buffered, minus what lies below its lowest unprocessed offset,
minus what a published plan gave it (in flight until the trainer's feedback for that step says it
followed the plan; returned to the index otherwise), minus what a plan truncated. A plan without
offsets (a count and size budget: no index yet) claims the oldest pending samples within its budget
until its step's feedback, the trainer's own rule. With plans made one step ahead two plans are
outstanding at a time; feedback for step s settles only the plans up to s.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np

from streamtrain.wire import PendingSample, StepFeedback

from .state import PendingIndex

__all__ = ["PendingBook"]

logger = logging.getLogger(__name__)

_Samples = tuple[np.ndarray, np.ndarray, np.ndarray]  # offsets (sorted), sizes, arrival seconds


def _no_samples() -> _Samples:
    return np.empty(0, np.int64), np.empty(0), np.empty(0)


def _select(part: _Samples, keep: np.ndarray | slice) -> _Samples:
    return part[0][keep], part[1][keep], part[2][keep]


def _merge(a: _Samples, b: _Samples) -> _Samples:
    """Two offset-sorted sets of samples with no offset in common, as one offset-sorted set."""
    if not len(b[0]):
        return a
    if not len(a[0]) or a[0][-1] < b[0][0]:
        return tuple(np.concatenate((x, y)) for x, y in zip(a, b, strict=True))  # type: ignore[return-value]
    off = np.concatenate((a[0], b[0]))
    order = np.argsort(off, kind="stable")
    return off[order], np.concatenate((a[1], b[1]))[order], np.concatenate((a[2], b[2]))[order]


class PendingBook:
    """One device's pending-sample index, rebuilt from its trainer's feedback and the published plans.

    Kept as offset-sorted numpy arrays (pending, and per plan step what is in flight), so feedback,
    plans and the policies' `index()` cost a few array operations rather than a dict walk per sample.
    """

    def __init__(self) -> None:
        self._pending: _Samples = _no_samples()
        self._inflight: dict[int, _Samples] = {}  # plan step -> the samples it handed out
        self._budgets: dict[int, tuple[int | None, int | None]] = {}  # plan step -> (count, size budget)
        self.floor = 0
        self.buffer_depth = 0
        self.reported = False
        self._cache: PendingIndex | None = None  # the last index built; every change drops it

    def _set(self, pending: _Samples) -> None:
        self._pending = pending
        self._cache = None

    def __len__(self) -> int:
        return len(self._pending[0])

    @property
    def inflight(self) -> int:
        """Samples handed to plans whose feedback has not come back yet."""
        return sum(len(v[0]) for v in self._inflight.values())

    @property
    def complete(self) -> bool:
        """True when the index covers the trainer's whole buffer (not after a restart that lost old reports)."""
        return self.reported and len(self) + self.inflight >= self.buffer_depth

    def ingest(self, fb: StepFeedback, arrival: float) -> None:
        """Apply one feedback record of this device.

        Args:
            fb: the trainer's report for step `fb.step`; `plan_step == step` says it followed our plan.
            arrival: when its new samples arrived, in seconds on the planning clock.
        """
        budgeted = self._settle(fb.step, followed=fb.plan_step == fb.step)
        self.add(fb.new_samples, arrival)
        self.advance(fb.lowest_unprocessed_offset)
        self.buffer_depth = fb.buffer_depth
        self.reported = True
        extra = len(self) + self.inflight - fb.buffer_depth
        if (fb.plan_step != fb.step or budgeted) and extra > 0:
            # A local (fallback) plan, or one without offsets, trained samples we cannot name; trainers take the
            # oldest first, so forget the oldest rather than plan samples the trainer no longer holds.
            self._set(_select(self._pending, slice(extra, None)))

    def add(self, samples: Iterable[PendingSample], arrival: float) -> None:
        """Add newly buffered samples (those below the floor or already in flight are ignored; a sample
        reported again replaces its earlier report)."""
        pairs = [(s.offset, s.size) for s in samples]
        if not pairs:
            return
        raw = np.array(pairs, dtype=np.int64).reshape(-1, 2)
        off = raw[:, 0]
        keep = off >= self.floor
        if self._inflight:
            keep &= ~np.isin(off, np.concatenate([v[0] for v in self._inflight.values()]))
        off = off[keep]
        if not len(off):
            return
        sizes = np.maximum(raw[keep, 1], 1).astype(np.float64)
        new = (off, sizes, np.full(len(off), float(arrival)))
        pending = self._pending
        if not bool(np.all(off[1:] > off[:-1])) or (len(pending[0]) and bool(np.isin(off, pending[0]).any())):
            # Out of order or reported twice: the latest report of an offset wins (dict semantics).
            both = _merge_all(pending, new)
            self._set(both)
            return
        self._set(_merge(pending, new))

    def advance(self, lowest_unprocessed: int) -> None:
        """Forget everything below the trainer's lowest unprocessed offset (trained, dropped or committed)."""
        if lowest_unprocessed <= self.floor:
            return
        self.floor = lowest_unprocessed
        k = int(np.searchsorted(self._pending[0], lowest_unprocessed, side="left"))
        if k:
            self._set(_select(self._pending, slice(k, None)))
        for step, part in list(self._inflight.items()):
            self._inflight[step] = _select(part, part[0] >= lowest_unprocessed)

    def take(self, step: int, offsets: Iterable[int], count: int | None = None, size_budget: int | None = None) -> None:
        """Mark the offsets a published plan gives this device for `step` as in flight.

        A part without offsets but with a `count` or `size_budget` claims the oldest pending samples within
        them until the step's feedback (`budget_claims`), when the trainer's lowest unprocessed offset says
        what it took.
        """
        wanted = np.fromiter(offsets, dtype=np.int64)
        if not len(wanted) and (count is not None or size_budget is not None):
            self._budgets[step] = (count, size_budget)
            return
        pending = self._pending
        if not len(wanted) or not len(pending[0]):
            return
        pos = np.searchsorted(pending[0], wanted)
        pos = pos[pos < len(pending[0])]
        pos = pos[np.isin(pending[0][pos], wanted)]
        if not len(pos):
            return
        mask = np.zeros(len(pending[0]), dtype=bool)
        mask[pos] = True
        self._set(_select(pending, ~mask))
        self._inflight[step] = _merge(self._inflight.get(step, _no_samples()), _select(pending, mask))

    def truncate(self, before: int) -> int:
        """Drop pending offsets below `before` (a plan's truncate-before); returns how many."""
        k = int(np.searchsorted(self._pending[0], before, side="left"))
        if k:
            self._set(_select(self._pending, slice(k, None)))
            # The trainer drops them when it runs the plan: a plan made before its next report must not find
            # the index short of the depth it last reported (and plan without offsets).
            self.buffer_depth = max(0, self.buffer_depth - k)
        return k

    def budget_claims(self) -> list[tuple[int | None, int | None]]:
        """(count, size budget) of the published plans without offsets whose step has not reported, in step order."""
        return [self._budgets[s] for s in sorted(self._budgets)]

    def drop_claims_before(self, step: int) -> None:
        """Forget the budget claims of plans for steps before `step` that no feedback settled: the device's
        rank did not report them (gone, or never there), and in a synchronous group a rank that is there
        reports every step, so such a claim takes nothing any more. Kept, they would pile up one per plan
        and make the device's backlog look taken, so truncation would never reach it."""
        for s in [s for s in self._budgets if s < step]:
            del self._budgets[s]

    def _settle(self, step: int, followed: bool) -> bool:
        """Settle the plans of steps up to `step`; returns whether `step`'s own plan had no offsets."""
        budgeted = False
        for s in [s for s in self._budgets if s <= step]:
            budgeted |= s == step
            del self._budgets[s]  # the trainer's lowest unprocessed offset now says what it took
        for s in [s for s in self._inflight if s <= step]:
            part = self._inflight.pop(s)
            if s == step and followed:
                continue  # trained
            # The trainer did not run that plan (late, or its feedback for it never came): still pending.
            self._set(_merge(self._pending, _select(part, part[0] >= self.floor)))
        return budgeted

    def index(self) -> PendingIndex:
        """The pending samples, oldest first, as policies read them."""
        if self._cache is None:
            self._cache = PendingIndex(*self._pending) if len(self) else PendingIndex.empty()
        return self._cache


def _merge_all(old: _Samples, new: _Samples) -> _Samples:
    """Union by offset where `new` may repeat offsets of `old` or of itself: the last report of each wins."""
    off = np.concatenate((old[0], new[0]))[::-1]
    _, first = np.unique(off, return_index=True)  # first in reversed order = last reported
    pick = len(off) - 1 - first
    return tuple(np.concatenate((x, y))[pick] for x, y in zip(old, new, strict=True))  # type: ignore[return-value]
