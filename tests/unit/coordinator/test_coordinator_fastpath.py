"""The coordinator's fast bookkeeping against the straightforward versions it replaced, on random inputs.

- the numpy `PendingBook` against a dict-of-offsets model of the same rules;
- the sorting row median against `np.nanmedian`.

The planners' fast paths are checked against their specification in test_coordinator_reference.py.
"""

from __future__ import annotations

import warnings

import numpy as np

from streamtrain.coordinator.fleet import PendingBook
from streamtrain.coordinator.perfmodel import _row_nanmedian
from streamtrain.wire import PendingSample, StepFeedback


class _DictBook:
    """The pending book's rules on a plain dict (the implementation the numpy book replaced)."""

    def __init__(self) -> None:
        self.pending: dict[int, tuple[float, float]] = {}
        self.inflight: dict[int, dict[int, tuple[float, float]]] = {}
        self.floor = 0

    def ingest(self, fb: StepFeedback, arrival: float) -> None:
        for s in [s for s in self.inflight if s <= fb.step]:
            offsets = self.inflight.pop(s)
            if not (s == fb.step and fb.plan_step == fb.step):
                self.pending.update({o: v for o, v in offsets.items() if o >= self.floor})
        taken = {o for v in self.inflight.values() for o in v}
        for smp in fb.new_samples:
            if smp.offset >= self.floor and smp.offset not in taken:
                self.pending[smp.offset] = (float(max(smp.size, 1)), arrival)
        if fb.lowest_unprocessed_offset > self.floor:
            self.floor = fb.lowest_unprocessed_offset
            self.pending = {o: v for o, v in self.pending.items() if o >= self.floor}
            self.inflight = {s: {o: v for o, v in f.items() if o >= self.floor} for s, f in self.inflight.items()}
        extra = len(self.pending) + sum(len(v) for v in self.inflight.values()) - fb.buffer_depth
        if fb.plan_step != fb.step and extra > 0:
            for o in sorted(self.pending)[:extra]:
                del self.pending[o]

    def take(self, step: int, offsets: list[int]) -> None:
        got = {o: self.pending.pop(o) for o in offsets if o in self.pending}
        if got:
            self.inflight.setdefault(step, {}).update(got)

    def truncate(self, before: int) -> int:
        gone = [o for o in self.pending if o < before]
        for o in gone:
            del self.pending[o]
        return len(gone)


def test_numpy_pending_book_follows_the_dict_rules() -> None:
    rng = np.random.default_rng(3)
    for _ in range(60):
        book, ref = PendingBook(), _DictBook()
        top = 0
        for step in range(30):
            new = sorted(set(rng.integers(max(top - 5, 0), top + 20, int(rng.integers(0, 12))).tolist()))
            if rng.random() < 0.2:
                new = new[::-1]  # out of order (and below the top: repeats of known offsets)
            top = max([top, *[o + 1 for o in new]])
            fb = StepFeedback(job="j", step=step, device_id="a", rank=0,
                              plan_step=step if rng.random() < 0.7 else -1, samples=1, total_size=1,
                              compute_seconds=0.1, data_wait_seconds=0.0, comm_seconds=0.0, step_seconds=0.1,
                              memory_bytes=0, lowest_unprocessed_offset=int(ref.floor + rng.integers(0, 3)),
                              buffer_depth=int(rng.integers(0, 40)),
                              new_samples=tuple(PendingSample(o, int(rng.integers(0, 50))) for o in new))
            book.ingest(fb, float(step))
            ref.ingest(fb, float(step))
            if ref.pending and rng.random() < 0.7:
                pick = rng.choice(sorted(ref.pending), int(rng.integers(1, len(ref.pending) + 1)), replace=False)
                book.take(step + 1, pick.tolist())
                ref.take(step + 1, pick.tolist())
            if rng.random() < 0.1:
                cut = ref.floor + int(rng.integers(0, 10))
                assert book.truncate(cut) == ref.truncate(cut)
            idx = book.index()
            expect = sorted(ref.pending.items())
            assert idx.offsets.tolist() == [o for o, _ in expect]
            assert idx.sizes.tolist() == [v[0] for _, v in expect]
            assert idx.arrivals.tolist() == [v[1] for _, v in expect]
            assert book.inflight == sum(len(v) for v in ref.inflight.values())


def test_row_median_is_numpys_nanmedian() -> None:
    rng = np.random.default_rng(5)
    for _ in range(500):
        values = rng.normal(size=(int(rng.integers(1, 5)), int(rng.integers(1, 70))))
        values[rng.random(values.shape) < rng.random()] = np.nan
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = np.nanmedian(values, axis=1)
        assert np.array_equal(_row_nanmedian(values), expected, equal_nan=True)
