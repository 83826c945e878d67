"""`streamtrain bench soak`: 32 device streams at ScaDLES S2 rates through the stack, memory and backlog bounded.

One broker, `--producer-procs` producer processes sharing the 32 streams (rates drawn once from the
S2 preset: uniform, mean 300, std 112 samples/s per device, about 9,600 samples/s in all), one
coordinator, and `--ranks` gloo ranks training devices 0..R-1. A trainer rank is one process per
device (`streamtrain train` has no multi-device rank) and costs about half a GiB of resident memory,
so 32 of them do not fit this 2-core machine: the other 32 - R streams are consumed by truncation
alone — the benchmark's *truncation follower* (in the benchmark process) commits, for those
devices, exactly the truncate-before offsets the coordinator's plans give, as a rank that trains
nothing would; the coordinator's DeleteRecords then removes them from the broker (it never deletes
past what the trainers' group committed).

The coordinator runs with `truncate` for the first half of the run, then is restarted with
`bounded` for the second half, while producers and ranks keep running. Every `--sample-every`
seconds it records the resident memory (RSS, from /proc) of every process — broker, producers,
coordinator, trainer launcher, each rank, and the benchmark itself — the records each device topic
retains (high watermark - log start offset) and each device's lag (high watermark - committed).
Boundedness is judged on Theil-Sen slopes (robust to single steps) over the second half of each phase.

`--minutes 2` (the default) is a smoke-sized run; `--minutes 30` is the real soak.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..common import (
    Bench,
    LaunchOptions,
    Record,
    RenderContext,
    Result,
    Target,
    num,
    pyplot,
    robust_slope,
    save_figure,
    table,
    target_lines,
    targets_table,
)
from ..streams import StreamsSetup

if TYPE_CHECKING:
    from ..live import LiveBroker

__all__ = ["BENCH", "Bounded", "FollowerStats", "PhaseFigures", "PhaseSpan", "ProcessMemory", "SoakResult",
           "SoakRunSetup", "SoakSample", "SoakSeries", "SoakSetup", "soak_targets", "summarise_soak"]

class SoakSetup(StreamsSetup):
    """What the soak runs (service logs and checkpoints in `work_dir`, default <out>/soak-run)."""

    minutes: float = 2.0
    """Length of the run, split evenly over the phases."""
    devices: int = 32
    ranks: int = 4
    """Gloo ranks training devices 0..ranks-1; the other streams are consumed by truncation alone."""
    producer_procs: int = 4
    b_max: int = 64
    size_mean: float = 16.0
    size_dif: float = 4.0
    sample_every_s: float = 5.0
    phases: tuple[str, ...] = ("truncate", "bounded")
    """The coordinator's truncation in each phase (restarted between them)."""
    serve: bool = False
    """The ranks publish a model version every second and `serve` answers a request load at `request_rate` with
    them, its memory sampled with the rest."""
    request_rate: float | None = None
    """Requests per second of the load `serve` answers (set with `serve`; absent from runs without it)."""

    def producer_groups(self) -> list[tuple[list[str], list[float]]]:
        """The devices (and their rates) of each producer process."""
        ids, rates = self.device_ids(), self.stream_rates()
        n = max(1, min(self.producer_procs, self.devices))
        return [(ids[i::n], rates[i::n]) for i in range(n)]


#: Requests per second of the load `serve` answers in `bench soak --serve`.
REQUEST_RATE = 20.0

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


class SoakResult(Result):
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


def plot_soak(result: SoakResult, png: Path) -> Path:
    """RSS of every process, records retained and lag over time, phases shaded."""
    series = result.series
    t = [v / 60.0 for v in series.t]
    fig, axes = pyplot().subplots(1, 3, figsize=(13, 3.6))
    for name, values in sorted(series.rss_mb.items()):
        pts = [(x, v) for x, v in zip(t, values, strict=True) if v is not None]
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], label=name, lw=1)
    axes[1].plot(t, series.retained_total, label="all 32 topics" if result.devices == 32 else "all topics")
    axes[1].plot(t, series.retained_max_topic, label="largest topic")
    axes[2].plot(t, series.lag_total, label="total")
    axes[2].plot(t, series.lag_max, label="largest device")
    for ax in axes:
        for phase in result.phases:
            if phase.truncation == "bounded":
                ax.axvspan(phase.start_s / 60.0, phase.end_s / 60.0, color="grey", alpha=0.12)
        ax.set_xlabel("minutes (grey: bounded; white: truncate)")
        ax.grid(alpha=0.3)
    axes[0].set(ylabel="RSS (MiB)", title="resident memory per process")
    axes[0].legend(fontsize=6, ncol=2)
    axes[1].set(ylabel="records", title="records retained on the broker")
    axes[1].legend(fontsize=8)
    axes[2].set(ylabel="records", title="lag (high watermark - committed)")
    axes[2].legend(fontsize=8)
    fig.suptitle(f"soak: {result.devices} streams at ScaDLES {result.setup.rate_preset} "
                 f"(~{result.setup.arrival_rate_total:,.0f} samples/s), {result.ranks} ranks, "
                 f"{result.minutes:g} min", fontsize=9)
    return save_figure(fig, png)


def soak_targets(result: SoakResult) -> list[Target]:
    """Every process's memory, the records retained, each topic and the lag: bounded."""
    procs, bounded, phases = result.processes, result.bounded, result.phases
    peak_total = sum(p.peak_rss_mb for p in procs.values())
    return [
        Target("memory of every process bounded (RSS slope over the second half)",
               f"peak RSS {num(max((p.peak_rss_mb for p in procs.values()), default=None), 0)} MiB (largest process), "
               f"{num(peak_total, 0)} MiB all processes" + "".join(
                   f"; {n} still rising ({num(p.slope_mb_per_min_second_half)} MiB/min)"
                   for n, p in sorted(procs.items()) if not p.bounded),
               bounded.memory, "not reported (ScaDLES reports buffer sizes, not process memory)"),
        Target("retained records bounded under truncate and bounded",
               "; ".join(f"{p.truncation}: peak {num(p.retained_records_peak)}, slope "
                         f"{num(p.retained_slope_records_per_min_second_half, 0)}/min" for p in phases),
               bounded.retained_records, "ScaDLES Table IV: truncation keeps buffers 848x-9,429x smaller than "
               "persistence"),
        Target("no device topic keeps growing", "; ".join(
            f"{p.truncation}: " + (", ".join(f"device {d} +{num(v, 0)}/min"
                                             for d, v in p.growing_topics_records_per_min.items()) or "none")
            for p in phases), not any(p.growing_topics_records_per_min for p in phases)),
        Target("lag bounded", "; ".join(f"{p.truncation}: peak {num(p.lag_records_peak)}, slope "
                                        f"{num(p.lag_slope_records_per_min_second_half, 0)}/min" for p in phases),
               bounded.lag),
    ]


def render_soak(result: SoakResult, ctx: RenderContext) -> str:
    """The `soak` section of BENCHMARKS.md: targets, every process's memory, notes, the plot."""
    png = plot_soak(result, ctx.plot_path("soak.png"))
    setup = result.setup
    rows = [[name, p.peak_rss_mb, p.final_rss_mb, num(p.slope_mb_per_min_second_half), p.samples]
            for name, p in sorted(result.processes.items())]
    return "\n\n".join([
        f"Setup: {result.devices} device streams at ScaDLES {setup.rate_preset} rates (about "
        f"{setup.arrival_rate_total:,.0f} samples/s in all; achieved {num(result.achieved_rate_total, 0)}) from "
        f"{setup.producer_procs} producer processes; {result.ranks} gloo ranks train devices 0-{result.ranks - 1}, "
        f"the other {result.devices - result.ranks} streams are consumed by truncation alone (the benchmark "
        f"commits the coordinator's truncate-before offsets for them); `truncate` then `bounded` "
        f"(max {setup.max_lag_samples} samples) for {result.minutes:g} minutes in all, DeleteRecords on. "
        f"Criteria: {result.bounded.criteria}.",
        targets_table(soak_targets(result)),
        table(["process", "peak RSS MiB", "final RSS MiB", "slope MiB/min (2nd half)", "samples"], rows),
        f"![soak]({ctx.link(png)})",
    ])


def soak_command(
    ctx: typer.Context,
    minutes: Annotated[float, typer.Option(min=0.2, help="Length of the run (half truncate, half bounded). 2 is a "
                                           "smoke run; --minutes 30 is the real soak.")] = 2.0,
    out: Annotated[Path, typer.Option("--out", help="Directory for soak.json and soak.png.", metavar="DIR")
                   ] = Path("reports/bench"),
    devices: Annotated[int, typer.Option(min=1, max=256, help="Device streams.")] = 32,
    ranks: Annotated[int, typer.Option(min=0, max=32, help="Gloo ranks (one process each, ~0.5 GiB) training "
                                       "devices 0..R-1; the rest are consumed by truncation alone.")] = 4,
    producer_procs: Annotated[int, typer.Option(min=1, help="Producer processes sharing the streams.")] = 4,
    sample_every: Annotated[float, typer.Option(min=0.5, help="Seconds between samples.")] = 5.0,
    max_lag_samples: Annotated[int, typer.Option(min=1, help="bounded: coordinator.max_lag_samples.")] = 512,
    seed: Annotated[int, typer.Option(help="Seed of the stream rates and data.")] = 0,
    external: Annotated[bool, typer.Option(help="Use the configured Kafka (kafka.bootstrap_servers) instead of a "
                                           "private embedded broker (whose memory is then not measured).")] = False,
    work_dir: Annotated[Path, typer.Option(help="Service logs and checkpoints (WORK_DIR/soak).")
                        ] = Path("reports/bench-runs"),
    serve: Annotated[bool, typer.Option(help="Model versions every second and `serve` answering 20 requests/s "
                                        "with them, in the loop (needs --ranks >= 1).")] = False,
) -> None:
    """Soak: 32 streams at ScaDLES S2 rates through the stack; memory, retained records and lag must stay bounded.

    Producers, a coordinator (truncate for the first half, then restarted with bounded) with
    DeleteRecords, and --ranks gloo ranks; the streams without a rank are consumed by truncation
    alone. Samples RSS of every process (/proc), records retained per topic and lag every
    --sample-every seconds, and judges boundedness on slopes over the second half of each phase.
    Writes DIR/soak.json and DIR/soak.png; logs in WORK_DIR/soak/logs. Exit 1 when something grew.
    """
    from streamtrain.cli_support import config_from, console, die

    from .run import run_soak

    cfg = config_from(ctx)
    if ranks > devices:
        die(f"--ranks {ranks} is more than --devices {devices}", 2)
    setup = SoakSetup(minutes=minutes, devices=devices, ranks=ranks, producer_procs=producer_procs,
                      sample_every_s=sample_every, max_lag_samples=max_lag_samples, seed=seed,
                      work_dir=work_dir / "soak", serve=serve and ranks > 0,
                      request_rate=REQUEST_RATE if serve and ranks > 0 else None)

    def progress(t: float, total: float, phase: str, sample: SoakSample) -> None:
        rss = sum(sample.rss.values()) / MIB
        console.print(f"{t:4.0f}/{total:.0f}s {phase:<8} retained {sum(sample.retained.values()):>7,} "
                      f"lag {sum(sample.lag.values()):>7,} RSS {rss:5.0f} MiB ({len(sample.rss)} procs)",
                      highlight=False, soft_wrap=True)

    try:
        result = run_soak(cfg, setup, out, external, LaunchOptions.of(ctx), progress)
    except RuntimeError as exc:
        die(str(exc))
    for line in target_lines(soak_targets(result)):
        console.print(line, highlight=False, soft_wrap=True)
    console.print(f"wrote {out / 'soak.json'} and {out / 'soak.png'}", highlight=False)
    if result.failures:  # a verdict is a finding (it is in the JSON); a service that failed is an error
        console.print(f"[red]failures: {'; '.join(result.failures)}")
        raise typer.Exit(1)


BENCH = Bench("soak", soak_command, SoakResult, render_soak, args=("--minutes", "5"), quick_args=("--minutes", "1"),
              timeout_s=600, about=__doc__ or "")
