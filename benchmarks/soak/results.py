"""What `bench soak` measures, typed, and the verdicts: every process's memory, records retained and lag bounded."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..common import Record, robust_slope
from .setup import SoakSetup

if TYPE_CHECKING:
    from ..live import LiveBroker

__all__ = ["Bounded", "FollowerStats", "PhaseFigures", "PhaseSpan", "ProcessMemory", "SoakResult", "SoakRunSetup",
           "SoakSample", "SoakSeries", "summarise_soak"]

MIB = 1024.0 * 1024.0
#: Memory a JVM uses besides its heap (metaspace, code cache, thread stacks, direct buffers), in MiB.
_JVM_NON_HEAP_MB = 384.0


@dataclass(frozen=True)
class SoakSample:
    """What the benchmark reads at one moment: every process's RSS (bytes), each device's retained records and
    lag, and the records produced in all."""

    t: float
    phase: str
    rss: dict[str, int]
    retained: dict[str, int]
    lag: dict[str, int]
    produced: int


@dataclass(frozen=True)
class PhaseSpan:
    """When a phase (one coordinator's truncation) ran, in seconds from the start."""

    truncation: str
    start_s: float
    end_s: float


class ProcessMemory(Record):
    """One process's resident memory over the run."""

    peak_rss_mb: float
    final_rss_mb: float
    samples: int
    slope_mb_per_min_second_half: float | None
    """Theil-Sen slope over the second half of its own samples."""
    bounded: bool
    heap_bound_mb: float | None = None
    """The broker's JVM: its heap limit plus what a JVM uses besides."""


class PhaseFigures(Record):
    """Records retained and lag during one phase."""

    truncation: str
    start_s: float
    end_s: float
    samples: int
    retained_records_peak: int
    retained_records_final: int | None
    retained_records_max_topic_peak: int
    retained_slope_records_per_min_second_half: float | None
    lag_records_peak: int
    lag_slope_records_per_min_second_half: float | None
    slope_limit_records_per_min: float
    growing_topics_records_per_min: dict[str, float]
    """Device topics growing at over a quarter of their own arrival rate."""
    retained_bounded: bool
    lag_bounded: bool


class FollowerStats(Record):
    """The truncation follower: the devices it stood in for, its commits and failed commits."""

    devices: int
    commits: int
    errors: int


class Bounded(Record):
    """The verdicts and the rule behind them."""

    memory: bool
    retained_records: bool
    lag: bool
    criteria: str


class SoakSeries(Record):
    """Every sample of the run, as columns."""

    t: list[float]
    phase: list[str]
    rss_mb: dict[str, list[float | None]]
    retained_total: list[int]
    retained_max_topic: list[int]
    retained_by_device: dict[str, list[int | None]]
    lag_total: list[int]
    lag_max: list[int]
    produced: list[int]


class SoakRunSetup(SoakSetup):
    """The setup as `soak.json` stores it: with the rates drawn and the broker's."""

    rates: list[float]
    arrival_rate_total: float
    embedded_broker: bool
    broker_rss: str


class SoakResult(Record):
    """What `soak.json` holds."""

    minutes: float
    devices: int
    ranks: int
    setup: SoakRunSetup
    phases: list[PhaseFigures]
    processes: dict[str, ProcessMemory]
    produced_records: int
    achieved_rate_total: float | None
    follower: FollowerStats
    bounded: Bounded
    failures: list[str]
    series: SoakSeries


def _second_half(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if not points:
        return []
    t0, t1 = points[0][0], points[-1][0]
    mid = t0 + (t1 - t0) / 2
    return [p for p in points if p[0] >= mid]


def _slope_per_min(points: list[tuple[float, float]]) -> float | None:
    half = _second_half(points)
    s = robust_slope([p[0] for p in half], [p[1] for p in half])
    return None if s is None else s * 60.0


def _memory(samples: Sequence[SoakSample], broker: LiveBroker) -> dict[str, ProcessMemory]:
    processes = {}
    for name in sorted({n for s in samples for n in s.rss}):
        pts = [(s.t, s.rss[name] / MIB) for s in samples if name in s.rss]
        peak = max(v for _, v in pts)
        per_min = _slope_per_min(pts)
        ok = per_min is None or per_min <= max(2.0, 0.01 * peak)
        # A JVM's RSS rises towards its heap limit as the heap fills between collections; -Xmx bounds it, so
        # the broker is bounded while it stays within its heap plus the JVM's own (non-heap) memory.
        jvm_cap = broker.heap_mb + _JVM_NON_HEAP_MB if name == "broker" and broker.heap_mb else None
        if jvm_cap is not None:
            ok = ok or peak <= jvm_cap
        processes[name] = ProcessMemory(
            peak_rss_mb=round(peak, 1), final_rss_mb=round(pts[-1][1], 1), samples=len(pts),
            slope_mb_per_min_second_half=None if per_min is None else round(per_min, 2), bounded=ok,
            heap_bound_mb=jvm_cap)
    return processes


def _phase(span: PhaseSpan, samples: Sequence[SoakSample], rates: dict[str, float]) -> PhaseFigures:
    rows = [s for s in samples if s.phase == span.truncation]
    tot = [(s.t, float(sum(s.retained.values()))) for s in rows]
    lags = [(s.t, float(sum(s.lag.values()))) for s in rows]
    r_slope, l_slope = _slope_per_min(tot), _slope_per_min(lags)
    # A topic nothing deletes from grows at its whole arrival rate; one growing at over a quarter of it is not
    # bounded, even when the total (1/32 of which it is) looks flat.
    growing = {}
    for device, rate in rates.items():
        per_min = _slope_per_min([(s.t, float(s.retained.get(device, 0))) for s in rows])
        if per_min is not None and per_min > 0.25 * rate * 60.0:
            growing[device] = round(per_min, 1)
    # Unbounded growth would be (arrivals - training) per second: most of the input. Allow 2% of it.
    limit = 0.02 * sum(rates.values()) * 60.0
    return PhaseFigures(
        truncation=span.truncation, start_s=span.start_s, end_s=span.end_s, samples=len(rows),
        retained_records_peak=int(max((v for _, v in tot), default=0)),
        retained_records_final=int(tot[-1][1]) if tot else None,
        retained_records_max_topic_peak=max((max(s.retained.values(), default=0) for s in rows), default=0),
        retained_slope_records_per_min_second_half=None if r_slope is None else round(r_slope, 1),
        lag_records_peak=int(max((v for _, v in lags), default=0)),
        lag_slope_records_per_min_second_half=None if l_slope is None else round(l_slope, 1),
        slope_limit_records_per_min=round(limit, 1),
        growing_topics_records_per_min=growing,
        retained_bounded=(r_slope is None or r_slope <= limit) and not growing,
        lag_bounded=l_slope is None or l_slope <= limit,
    )


def summarise_soak(setup: SoakSetup, broker: LiveBroker, samples: Sequence[SoakSample], spans: Sequence[PhaseSpan],
                   follower: FollowerStats, failures: Sequence[str]) -> SoakResult:
    """The soak's figures and verdicts from its samples."""
    rates = dict(zip(setup.device_ids(), setup.stream_rates(), strict=True))
    arrival = float(sum(rates.values()))
    processes = _memory(samples, broker)
    phases = [_phase(span, samples, rates) for span in spans]
    produced = samples[-1].produced if samples else 0
    seconds = samples[-1].t - samples[0].t if len(samples) > 1 else 0.0
    return SoakResult(
        minutes=setup.minutes, devices=setup.devices, ranks=setup.ranks,
        setup=SoakRunSetup.model_validate({
            **setup.model_dump(), "rates": list(rates.values()), "arrival_rate_total": round(arrival, 1),
            "embedded_broker": broker.embedded,
            "broker_rss": "measured" if broker.pid is not None else "external broker: not measured"}),
        phases=phases,
        processes=processes,
        produced_records=produced,
        achieved_rate_total=round(produced / seconds, 1) if seconds else None,
        follower=follower,
        bounded=Bounded(
            memory=all(p.bounded for p in processes.values()),
            retained_records=all(p.retained_bounded for p in phases),
            lag=all(p.lag_bounded for p in phases),
            criteria="Theil-Sen slopes (robust to single steps) over the second half: of each process's own samples "
                     "for RSS (<= max(2 MiB, 1% of its peak) per minute; the coordinator is one process per phase; "
                     "the broker's JVM also passes while its RSS stays within its -Xmx heap + "
                     f"{_JVM_NON_HEAP_MB:g} MiB), of each phase for the records retained and the lag (<= 2% of the "
                     "aggregate arrival rate, i.e. growth at 1/50 of the input; and no single topic growing at over "
                     "25% of its own arrival rate)"),
        failures=list(failures),
        series=SoakSeries(
            t=[s.t for s in samples], phase=[s.phase for s in samples],
            rss_mb={n: [round(s.rss[n] / MIB, 1) if n in s.rss else None for s in samples] for n in processes},
            retained_total=[sum(s.retained.values()) for s in samples],
            retained_max_topic=[max(s.retained.values(), default=0) for s in samples],
            retained_by_device={d: [s.retained.get(d) for s in samples] for d in setup.device_ids()},
            lag_total=[sum(s.lag.values()) for s in samples],
            lag_max=[max(s.lag.values(), default=0) for s in samples],
            produced=[s.produced for s in samples]),
    )
