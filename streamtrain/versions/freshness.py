"""Freshness: how long after a sample was produced `serve` first answers with a model version that trained it.

For every trained sample: the time from its `produced_at` to the first prediction made by a version whose
lineage includes it — the version that first trained it, or, when that one was never served (rejected by the
gate, superseded before a request came, its write failed), the next one that was. Served versions only move
forward, so that is the first version answered with at or after the one that trained it.

What makes this measurable without reading every sample back: each `ModelVersion` announcement carries, per
device, the samples it trained first, counted by produced_at at a resolution of 10 ms (`ProducedHistogram`);
each `Prediction` carries the version that made it and when. `serve` turns the two into its live metric, and
`up`'s report and `bench freshness` into a median and a p99 over every sample, with `measure_freshness`; told
which samples were produced while their device had a backlog (a burst), it gives the two parts apart too: a
stream that keeps up gets the line-rate figure, a burst's samples wait their turn to be trained.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..wire import ModelVersion, ProducedCount

__all__ = ["DEFAULT_RESOLUTION_MS", "BacklogAt", "FreshnessSummary", "ProducedHistogram", "ages_seconds",
           "measure_freshness", "weighted_quantile"]

#: Resolution of produced_at in a version's lineage: well below the seconds freshness is measured in.
DEFAULT_RESOLUTION_MS = 10

#: Bins a histogram holds before it halves its resolution (bounded memory whatever the time between versions).
MAX_BINS = 4096


class ProducedHistogram:
    """Samples counted by produced_at (ms) rounded down to `resolution_ms`, in at most `max_bins` bins.

    When the bins would exceed `max_bins` (a long time between versions), the resolution doubles and the bins
    merge: memory stays bounded and every sample stays counted.
    """

    def __init__(self, resolution_ms: int = DEFAULT_RESOLUTION_MS, max_bins: int = MAX_BINS) -> None:
        if resolution_ms < 1 or max_bins < 2:
            raise ValueError(f"resolution_ms must be >= 1 and max_bins >= 2, got {resolution_ms} and {max_bins}")
        self.resolution_ms = resolution_ms
        self.max_bins = max_bins
        self._bins: Counter[int] = Counter()

    def __len__(self) -> int:
        """Samples counted."""
        return sum(self._bins.values())

    def add(self, produced_at_ms: int, count: int = 1) -> None:
        self._bins[produced_at_ms - produced_at_ms % self.resolution_ms] += count
        if len(self._bins) > self.max_bins:
            self.coarsen(self.resolution_ms * 2)

    def add_counts(self, counts: Iterable[ProducedCount], resolution_ms: int) -> None:
        """Add bins of another histogram (coarsening this one to the coarser of the two resolutions)."""
        if resolution_ms > self.resolution_ms:
            self.coarsen(resolution_ms)
        for c in counts:
            self.add(c.produced_at, c.count)

    def coarsen(self, resolution_ms: int) -> None:
        """Re-bin at `resolution_ms` (or coarser, until the bins fit in `max_bins`); never finer than now."""
        self.resolution_ms = max(resolution_ms, self.resolution_ms)
        while True:
            merged: Counter[int] = Counter()
            for at, n in self._bins.items():
                merged[at - at % self.resolution_ms] += n
            self._bins = merged
            if len(merged) <= self.max_bins:
                return
            self.resolution_ms *= 2

    def counts(self) -> tuple[ProducedCount, ...]:
        """The bins, oldest first."""
        return tuple(ProducedCount(at, n) for at, n in sorted(self._bins.items()))

    def clear(self) -> None:
        self._bins.clear()


def ages_seconds(counts: Iterable[ProducedCount], resolution_ms: int, answered_at_ms: int) -> list[tuple[float, int]]:
    """(seconds from the middle of each bin to `answered_at_ms`, samples in it)."""
    half = resolution_ms / 2.0
    return [((answered_at_ms - c.produced_at - half) / 1000.0, c.count) for c in counts]


def weighted_quantile(values: Sequence[float], weights: Sequence[int], q: float) -> float | None:
    """The q-quantile (0..1) of `values`, value i counted `weights[i]` times (None when nothing is counted)."""
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if not len(v) or w.sum() <= 0:
        return None
    order = np.argsort(v, kind="stable")
    cum = np.cumsum(w[order])
    return float(v[order][min(int(np.searchsorted(cum, q * cum[-1], side="left")), len(v) - 1)])


@dataclass(frozen=True)
class FreshnessSummary:
    """Freshness over every trained sample of a run; split, when told which samples arrived during a backlog, into
    those produced at line rate and those that waited in one."""

    samples: int
    """Samples whose freshness was measured (trained, and a version with them answered a request)."""
    median_seconds: float | None
    p99_seconds: float | None
    unserved: int
    """Samples trained by versions after the last one that answered a request (not measured)."""
    versions_published: int
    versions_served: int
    published_median_seconds: float | None = None
    """The training side of it: from produced_at to the announcement of the version that first trained the sample
    (the rest is serve's: reading the announcement, loading the version, the gate, the next request)."""
    line_rate: tuple[int, float | None, float | None] | None = None
    """(samples, median, p99) of the samples produced while their device had no backlog (None: not split)."""
    backlog: tuple[int, float | None, float | None] | None = None
    """The same of the samples produced while their device had a backlog: their wait to be trained dominates."""

    def to_dict(self) -> dict[str, float | int | None]:
        out: dict[str, float | int | None] = {
            "freshness_samples": self.samples, "freshness_seconds_median": self.median_seconds,
            "freshness_seconds_p99": self.p99_seconds, "freshness_unserved_samples": self.unserved,
            "freshness_published_seconds_median": self.published_median_seconds,
            "versions_published": self.versions_published, "versions_served": self.versions_served}
        for name, part in (("line_rate", self.line_rate), ("backlog", self.backlog)):
            if part is not None:
                out |= {f"freshness_{name}_samples": part[0], f"freshness_{name}_seconds_median": part[1],
                        f"freshness_{name}_seconds_p99": part[2]}
        return out


#: Whether a device had a backlog when it produced a sample: (device, produced_at ms) -> bool.
BacklogAt = Callable[[str, int], bool]


class _Ages:
    """Ages in seconds, each counted n times."""

    def __init__(self) -> None:
        self.ages: list[float] = []
        self.weights: list[int] = []

    def add(self, counts: Iterable[ProducedCount], resolution_ms: int, at_ms: int) -> None:
        for age, n in ages_seconds(counts, resolution_ms, at_ms):
            self.ages.append(age)
            self.weights.append(n)

    def summary(self) -> tuple[int, float | None, float | None]:
        return (int(sum(self.weights)), weighted_quantile(self.ages, self.weights, 0.5),
                weighted_quantile(self.ages, self.weights, 0.99))


def measure_freshness(versions: Iterable[ModelVersion], first_answers: Mapping[int, int],
                      backlog: BacklogAt | None = None) -> FreshnessSummary:
    """Freshness of every sample the versions trained.

    Args:
        versions: The announced versions of one job (any order; a version announced twice counts once).
        first_answers: Version number -> the earliest `answered_at` (ms) of a prediction it made.
        backlog: Whether a sample's device had a backlog when it was produced; given, the summary is also split
            into the samples produced at line rate and those produced during a backlog.

    Returns:
        The median and p99 over samples (and per part), and how many were never served.
    """
    unique = {v.version: v for v in versions}
    pending = {False: ProducedHistogram(), True: ProducedHistogram()}  # by: produced during a backlog
    served = {False: _Ages(), True: _Ages()}
    published = _Ages()
    for number in sorted(unique):
        version = unique[number]
        for device in version.lineage:
            resolution = version.produced_at_resolution_ms
            for count in device.new_samples:
                waited = backlog is not None and backlog(device.device_id, count.produced_at)
                pending[waited].add_counts([count], resolution)
            published.add(device.new_samples, resolution, version.created_at)
        answered = first_answers.get(number)
        if answered is not None:
            for waited, histogram in pending.items():
                served[waited].add(histogram.counts(), histogram.resolution_ms, answered)
                histogram.clear()
    everything = _Ages()
    for part in served.values():
        everything.ages += part.ages
        everything.weights += part.weights
    samples, median, p99 = everything.summary()
    return FreshnessSummary(samples=samples, median_seconds=median, p99_seconds=p99,
                            unserved=sum(len(h) for h in pending.values()), versions_published=len(unique),
                            versions_served=sum(1 for n in unique if n in first_answers),
                            published_median_seconds=published.summary()[1],
                            line_rate=served[False].summary() if backlog is not None else None,
                            backlog=served[True].summary() if backlog is not None else None)
