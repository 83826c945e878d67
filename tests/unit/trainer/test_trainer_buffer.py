"""The rank's sample buffer: bounds and hysteresis, truncation, oldest-first budgets, commit arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from streamtrain.trainer.buffer import SampleBuffer
from streamtrain.wire import PendingSample, Sample


def _sample(seq: int, size: int = 2) -> Sample:
    return Sample.from_array("d0", seq, np.zeros((size, 16), np.float32), label=0)


def _filled(sizes: list[int], start: int = 0, **kw: int) -> SampleBuffer:
    buf = SampleBuffer(max_samples=kw.get("max_samples", 100), max_bytes=kw.get("max_bytes", 10**9), position=start)
    for i, size in enumerate(sizes):
        buf.add(start + i, _sample(i, size), nbytes=100)
    return buf


def test_full_at_either_bound_and_resumes_below_the_low_mark() -> None:
    buf = SampleBuffer(max_samples=10, max_bytes=1000, resume_ratio=0.5)
    for i in range(9):
        buf.add(i, _sample(i), nbytes=10)
    assert not buf.full
    buf.add(9, _sample(9), nbytes=10)
    assert buf.full and not buf.can_resume
    buf.take(buf.select_oldest(count=5))
    buf.complete_step()
    assert not buf.full and not buf.can_resume  # 5 left: not below 0.5 * 10
    buf.take(buf.select_oldest(count=1))
    buf.complete_step()
    assert buf.can_resume
    by_bytes = SampleBuffer(max_samples=10, max_bytes=1000)
    by_bytes.add(0, _sample(0), nbytes=1000)
    assert by_bytes.full and by_bytes.nbytes == 1000


def test_add_rejects_redelivery_and_skip_counts_as_processed() -> None:
    buf = _filled([1, 1])
    assert buf.seen(1) and not buf.seen(2)
    with pytest.raises(ValueError):
        buf.add(1, _sample(1), nbytes=1)
    buf.skip(2)  # dead-lettered record
    assert buf.position == 3 and len(buf) == 2


def test_truncation_drops_buffered_and_later_arrivals_below_the_floor() -> None:
    buf = _filled([1, 1, 1, 1], start=10)
    assert buf.truncate_before(12) == 2
    assert buf.offsets() == [12, 13]
    assert buf.drain_dropped() == [10, 11] and buf.drain_dropped() == []
    late = SampleBuffer(10, 10**6, position=0)
    late.truncate_before(3)
    assert late.add(0, _sample(0), 1) is False and late.add(3, _sample(3), 1) is True
    assert late.dropped_total == 1 and late.lowest_unprocessed() == 3
    assert late.drain_dropped() == [0]  # a late arrival below the floor is reported by its offset too


def test_oldest_first_selection_within_count_and_size_budget() -> None:
    buf = _filled([4, 3, 5, 1])
    assert buf.select_oldest(count=2) == [0, 1]
    assert buf.select_oldest(size_budget=8) == [0, 1]  # 4 + 3; the 5 would overflow
    assert buf.select_oldest(count=3, size_budget=100) == [0, 1, 2]
    assert buf.select_oldest(size_budget=2) == [0]  # a large head sample is never starved
    assert buf.select_oldest(count=0) == [] and buf.select_oldest(size_budget=0) == []
    assert buf.select_oldest() == [0, 1, 2, 3]


def test_commit_offset_with_out_of_order_training() -> None:
    buf = _filled([1] * 5, start=5)  # offsets 5..9
    samples = buf.take([5, 7, 42])  # 42 is not buffered: skipped
    assert [s.seq for s in samples] == [0, 2]
    assert buf.lowest_unprocessed() == 5  # in flight until the step completes
    buf.complete_step()
    assert buf.lowest_unprocessed() == 6  # 6 is still waiting, so 7 cannot be committed past
    buf.take([6, 8, 9])
    buf.complete_step()
    assert buf.lowest_unprocessed() == 10 == buf.position
    buf.skip(10)  # a dead letter at the end moves the commit point too
    assert buf.lowest_unprocessed() == 11


def test_take_twice_without_completing_is_an_error() -> None:
    buf = _filled([1, 1])
    buf.take([0])
    with pytest.raises(RuntimeError):
        buf.take([1])


def test_new_samples_are_reported_once_and_only_while_pending() -> None:
    buf = _filled([3, 4, 5])
    buf.take([0])
    buf.complete_step()
    assert buf.drain_new() == (PendingSample(1, 4), PendingSample(2, 5))
    assert buf.drain_new() == ()


def test_reported_depth_counts_only_samples_already_reported() -> None:
    buf = _filled([1, 1, 1, 1])
    assert buf.reported_depth == 0  # nothing reported yet: the coordinator knows of none of them
    assert [p.offset for p in buf.drain_new()] == [0, 1, 2, 3]
    assert buf.reported_depth == 4
    buf.add(4, _sample(4), nbytes=100)
    buf.add(5, _sample(5), nbytes=100)
    assert buf.reported_depth == 4  # 4 and 5 arrived after the report
    buf.take([0, 1, 2, 3])
    assert buf.reported_depth == 0 and len(buf) == 2  # the plan took all it knew of: drained
    buf.complete_step()
    buf.drain_new()
    buf.take([4])
    assert buf.reported_depth == 1  # 5 was reported and left behind: a backlog


def test_out_of_order_training_is_remembered_above_the_commit_and_skipped_on_resume() -> None:
    buf = _filled([1] * 8)  # offsets 0-7
    buf.take([0, 1, 4, 6])
    buf.complete_step()
    assert buf.lowest_unprocessed() == 2 and buf.processed_ahead() == [4, 6]
    buf.skip(8)  # a dead-lettered record above the commit is processed too
    assert buf.processed_ahead() == [4, 6, 8]
    resumed = SampleBuffer(100, 10**9, position=2)  # the next run starts at the committed offset
    resumed.skip_ahead([4, 6, 8, 1])  # 1 is below the start: nothing to skip there
    arrivals = [o for o in range(2, 10) if not resumed.done_ahead(o)]
    for offset in range(2, 10):
        if resumed.done_ahead(offset):
            resumed.skip(offset)
        else:
            resumed.add(offset, _sample(offset), nbytes=1)
    assert arrivals == [2, 3, 5, 7, 9] and resumed.offsets() == arrivals
    assert resumed.processed_ahead() == [4, 6, 8]  # still ahead of this run's floor: its checkpoint keeps them
