"""The fast planning paths against the straightforward versions they replaced, on random inputs.

- ett-stream's fill (`_fill_indexed`) against `fill_reference`, and whole plans against
  `plan_ett_stream_reference`;
- the numpy `PendingBook` against a dict-of-offsets model of the same rules;
- the sorting row median against `np.nanmedian`.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from coordinator.fleet import PendingBook
from coordinator.perfmodel import PerfModel, _row_nanmedian
from coordinator.policies.ett_stream import (
    _fill_indexed,
    fill_reference,
    plan_ett_stream,
    plan_ett_stream_reference,
)
from coordinator.state import DeviceState, PendingIndex, PlanningState
from streamtrain.config import CoordinatorConfig
from streamtrain.wire import PendingSample, StepFeedback


def _random_devices(rng: np.random.Generator, n: int, pending: bool = True) -> list[DeviceState]:
    out = []
    for i in range(n):
        k = int(rng.integers(1, 60))
        sizes = rng.integers(1, int(rng.choice([5, 60, 3000])), k).astype(float)
        limit = None if rng.random() < 0.5 else float(rng.uniform(5, 400))
        out.append(DeviceState(
            f"d{i}", PerfModel(a=float(rng.uniform(1e-4, 1e-2)), b=float(rng.uniform(0, 0.1))),
            pending=PendingIndex(np.sort(rng.choice(10_000, k, replace=False)), sizes, np.sort(rng.uniform(0, 9, k)))
            if pending or rng.random() < 0.7 else None,
            arrival_rate=float(rng.choice([0.0, rng.uniform(1, 200)])), mean_size=float(rng.uniform(1, 50)),
            lag=k, size_limit=limit))
    return out


def _random_config(rng: np.random.Generator) -> CoordinatorConfig:
    b_max = int(rng.integers(1, 40))
    return CoordinatorConfig(b_min=min(int(rng.integers(0, 5)), b_max), b_max=b_max,
                             best_fit_rounds=int(rng.integers(0, 7)), global_batch=int(rng.integers(1, 300)),
                             best_fit_lookahead=[None, 1, 2, 5, 20][int(rng.integers(0, 5))],
                             weight_by=str(rng.choice(["samples", "size"])))  # type: ignore[arg-type]


def test_fast_fill_picks_exactly_what_the_reference_picks() -> None:
    rng = np.random.default_rng(7)
    for _ in range(1500):
        devices = _random_devices(rng, int(rng.integers(1, 9)))
        limits = np.array([np.inf if d.size_limit is None else d.size_limit for d in devices])
        budgets = np.minimum(rng.uniform(-20, 600, len(devices)), limits)
        cfg = _random_config(rng)
        fast = _fill_indexed(devices, budgets, limits, cfg)
        slow = fill_reference(devices, budgets, limits, cfg)
        assert len(fast) == len(slow)
        for a, b in zip(fast, slow, strict=True):
            assert a.tolist() == b.tolist()


def test_when_everything_pending_fits_the_fast_fill_takes_it_all_as_the_reference_does() -> None:
    """The line-rate case (short buffers, budgets to spare) short-cuts the fill; edges included: a budget equal
    to a device's total, a buffer as long as b_max, a memory limit some sample exceeds (no short cut)."""
    rng = np.random.default_rng(5)
    taken_all = 0
    for _ in range(600):
        devices = _random_devices(rng, int(rng.integers(1, 9)))
        totals = np.array([d.pending.sizes.sum() for d in devices])  # type: ignore[union-attr]
        limits = np.array([np.inf if d.size_limit is None else d.size_limit for d in devices])
        budgets = np.minimum(totals + rng.choice([0.0, 0.5, 100.0], len(devices)), limits)
        cfg = _random_config(rng).model_copy(update={"b_max": int(rng.choice([60, 100]))})
        fast = _fill_indexed(devices, budgets, limits, cfg)
        slow = fill_reference(devices, budgets, limits, cfg)
        assert [a.tolist() for a in fast] == [b.tolist() for b in slow]
        taken_all += all(len(a) == len(d.pending) for a, d in zip(fast, devices, strict=True))  # type: ignore[arg-type]
    assert taken_all > 100  # the short cut was taken often


def test_fast_plan_equals_the_reference_plan() -> None:
    rng = np.random.default_rng(11)
    for step in range(400):
        devices = _random_devices(rng, int(rng.integers(1, 7)), pending=False)
        state = PlanningState(step=step, now=10.0, devices=tuple(devices))
        cfg = _random_config(rng)
        fast, slow = plan_ett_stream(state, cfg), plan_ett_stream_reference(state, cfg)
        assert (fast.step_time_target, fast.lr_scale, fast.notes) == (slow.step_time_target, slow.lr_scale, slow.notes)
        for a, b in zip(fast.devices, slow.devices, strict=True):
            assert a.device_id == b.device_id and a.count == b.count
            assert (a.offsets is None) == (b.offsets is None)
            if a.offsets is not None:
                assert a.offsets.tolist() == b.offsets.tolist()  # type: ignore[union-attr]
            assert a.total_size == pytest.approx(b.total_size)
            assert a.predicted_seconds == pytest.approx(b.predicted_seconds)
            assert a.weight == pytest.approx(b.weight)


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
