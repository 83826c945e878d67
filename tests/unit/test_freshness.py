"""Freshness from version lineages and first answers: every sample counted once, at the first served version."""

from __future__ import annotations

import pytest

from streamtrain.versions.freshness import ProducedHistogram, measure_freshness, weighted_quantile
from streamtrain.wire import DeviceLineage, ModelVersion, ProducedCount


def _version(number: int, *produced: tuple[str, int, int]) -> ModelVersion:
    """A version whose devices first trained `count` samples produced at `ms` each: (device, ms, count)."""
    devices: dict[str, list[ProducedCount]] = {}
    for device, ms, count in produced:
        devices.setdefault(device, []).append(ProducedCount(ms, count))
    return ModelVersion(job="j", version=number, step=number, location="",
                        lineage=tuple(DeviceLineage(d, 0, tuple(c)) for d, c in devices.items()),
                        produced_at_resolution_ms=10)


def test_each_sample_is_measured_at_the_first_answer_of_a_version_that_trained_it() -> None:
    versions = [
        _version(1, ("0", 1000, 3), ("1", 1500, 1)),
        _version(2, ("0", 2000, 2)),  # never answered with (rejected by the gate): its samples wait for version 3
        _version(3, ("1", 2500, 1)),
        _version(4, ("0", 4000, 5)),  # trained after the last answer: not measured
    ]
    summary = measure_freshness(versions, {1: 2005, 3: 3505})
    # Version 1: 3 samples 1.0 s old (from the middle of their 10 ms bin) and 1 sample 0.5 s old; version 3: two
    # of version 2 at 1.5 s and one of its own at 1.0 s.
    assert summary.samples == 7 and summary.unserved == 5
    assert summary.median_seconds == pytest.approx(1.0)
    assert summary.p99_seconds == pytest.approx(1.5)
    assert (summary.versions_published, summary.versions_served) == (4, 2)


def test_a_histogram_stays_bounded_and_counts_every_sample() -> None:
    histogram = ProducedHistogram(resolution_ms=10, max_bins=8)
    for ms in range(0, 1000, 7):
        histogram.add(ms)
    assert len(histogram) == len(range(0, 1000, 7))
    assert len(histogram.counts()) <= 8 and histogram.resolution_ms >= 125
    assert all(c.produced_at % histogram.resolution_ms == 0 for c in histogram.counts())
    other = ProducedHistogram(resolution_ms=10)
    other.add_counts(histogram.counts(), histogram.resolution_ms)  # a coarser histogram coarsens the one it joins
    assert other.resolution_ms == histogram.resolution_ms and len(other) == len(histogram)


def test_weighted_quantiles() -> None:
    assert weighted_quantile([3.0, 1.0, 2.0], [1, 1, 98], 0.5) == 2.0
    assert weighted_quantile([3.0, 1.0, 2.0], [1, 1, 98], 0.995) == 3.0
    assert weighted_quantile([], [], 0.5) is None


def test_freshness_splits_into_line_rate_and_backlog_samples() -> None:
    versions = [_version(1, ("0", 1000, 5), ("1", 1000, 2)), _version(2, ("0", 1500, 4))]
    # Device 1 was in a burst's backlog when its samples were produced; device 0 kept up.
    summary = measure_freshness(versions, {1: 2005, 2: 7505}, backlog=lambda device, _ms: device == "1")
    assert summary.line_rate == (9, pytest.approx(1.0), pytest.approx(6.0))
    assert summary.backlog == (2, pytest.approx(1.0), pytest.approx(1.0))
    assert summary.samples == 11 and measure_freshness(versions, {1: 2005}).line_rate is None
