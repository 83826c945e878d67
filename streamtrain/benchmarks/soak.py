"""`streamtrain bench soak`: 32 device streams at ScaDLES S2 rates through the stack, memory and backlog bounded."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import psutil
import typer
from confluent_kafka import OFFSET_END, KafkaException, TopicPartition

from streamtrain.config import KafkaConfig, StreamtrainConfig
from streamtrain.kafka import make_consumer
from streamtrain.runtime.commands import EXIT_CONFIG, config_from, console, die
from streamtrain.wire import Assignment, WireError, decode

from . import common, live
from .common import Bench, LaunchOptions, Record, Result, Target, num, publish, pyplot, table, targets_table

__all__ = ["BENCH", "SoakResult", "SoakSetup", "run_soak"]

logger = logging.getLogger(__name__)

MIB = 1024.0 * 1024.0
#: Memory a JVM uses besides its heap (metaspace, code cache, thread stacks, direct buffers), in MiB.
_JVM_NON_HEAP_MB = 384.0
CRITERIA = ("Theil-Sen slopes over the second half of each process's samples (RSS; the coordinator is one process per "
            "phase) and of each phase (records retained, lag): RSS <= max(2 MiB, 1% of its peak)/min, or the broker's "
            f"JVM within its -Xmx heap + {_JVM_NON_HEAP_MB:g} MiB; retained and lag <= 2% of the aggregate arrival "
            "rate/min, and no topic growing at over 25% of its own arrival rate")


class SoakSetup(live.StreamsSetup):
    """What the soak runs: `minutes` split evenly over `phases` (the coordinator's truncation in each, restarted in
    between), `ranks` training devices 0..ranks-1 (truncation alone consumes the other streams); with `serve`, a model
    version every second and `request_rate` requests/s answered with them."""

    minutes: float = 2.0
    devices: int = 32
    ranks: int = 4
    producer_procs: int = 4
    b_max: int = 64
    size_mean: float = 16.0
    size_dif: float = 4.0
    sample_every_s: float = 5.0
    phases: tuple[str, ...] = ("truncate", "bounded")
    serve: bool = False
    request_rate: float | None = None


class _Sample(NamedTuple):
    """One reading: every process's RSS (bytes), each device's retained records and lag, the records produced."""

    t: float
    phase: str
    rss: dict[str, int]
    retained: dict[str, int]
    lag: dict[str, int]
    produced: int


class ProcessMemory(Record):
    """One process's resident memory over the run (`heap_bound_mb`: the broker JVM's heap limit and non-heap)."""

    peak_rss_mb: float
    final_rss_mb: float
    samples: int
    slope_mb_per_min_second_half: float | None
    bounded: bool
    heap_bound_mb: float | None = None


class PhaseFigures(Record):
    """Records retained and lag during one phase, from `start_s` to `end_s`; topics growing too fast by device."""

    truncation: str
    start_s: float
    end_s: float
    retained_records_peak: int
    retained_slope_records_per_min_second_half: float | None
    lag_records_peak: int
    lag_slope_records_per_min_second_half: float | None
    growing_topics_records_per_min: dict[str, float]
    retained_bounded: bool
    lag_bounded: bool


class SoakSeries(Record):
    """Every reading of the run, as columns."""

    t: list[float]
    phase: list[str]
    rss_mb: dict[str, list[float | None]]
    retained_total: list[int]
    retained_max_topic: list[int]
    lag_total: list[int]
    lag_max: list[int]


class SoakResult(Result):
    """What `soak.json` holds."""

    setup: SoakSetup
    arrival_rate_total: float
    produced_records: int
    achieved_rate_total: float | None
    follower_commits: int
    follower_errors: int
    phases: list[PhaseFigures]
    processes: dict[str, ProcessMemory]
    series: SoakSeries


def _slope_per_min(points: list[tuple[float, float]]) -> float | None:
    """Theil-Sen slope per minute over the second half of `points` (t, value)."""
    mid = points[0][0] + (points[-1][0] - points[0][0]) / 2 if points else 0.0
    half = [p for p in points if p[0] >= mid]
    s = common.robust_slope([p[0] for p in half], [p[1] for p in half])
    return None if s is None else s * 60.0


def _memory(samples: Sequence[_Sample], broker: live.LiveBroker) -> dict[str, ProcessMemory]:
    processes = {}
    for name in sorted({n for s in samples for n in s.rss}):
        pts = [(s.t, s.rss[name] / MIB) for s in samples if name in s.rss]
        peak, per_min = max(v for _, v in pts), _slope_per_min(pts)
        # -Xmx bounds a JVM's RSS, which rises towards it as the heap fills between collections.
        cap = broker.heap_mb + _JVM_NON_HEAP_MB if name == "broker" and broker.heap_mb else None
        processes[name] = ProcessMemory(
            peak_rss_mb=round(peak, 1), final_rss_mb=round(pts[-1][1], 1), samples=len(pts),
            slope_mb_per_min_second_half=None if per_min is None else round(per_min, 2), heap_bound_mb=cap,
            bounded=per_min is None or per_min <= max(2.0, 0.01 * peak) or (cap is not None and peak <= cap))
    return processes


def _phase(truncation: str, start: float, end: float, samples: Sequence[_Sample],
           rates: dict[str, float]) -> PhaseFigures:
    rows = [s for s in samples if s.phase == truncation]
    tot = [(s.t, float(sum(s.retained.values()))) for s in rows]
    lags = [(s.t, float(sum(s.lag.values()))) for s in rows]
    r_slope, l_slope = _slope_per_min(tot), _slope_per_min(lags)
    # A topic growing at over a quarter of its arrival rate is not bounded, even when the total looks flat.
    growing = {d: round(v, 1) for d, rate in rates.items()
               if (v := _slope_per_min([(s.t, float(s.retained.get(d, 0))) for s in rows])) is not None
               and v > 0.25 * rate * 60.0}
    limit = 0.02 * sum(rates.values()) * 60.0  # unbounded growth would be most of the input
    return PhaseFigures(
        truncation=truncation, start_s=start, end_s=end, retained_records_peak=int(max((v for _, v in tot), default=0)),
        retained_slope_records_per_min_second_half=None if r_slope is None else round(r_slope, 1),
        lag_records_peak=int(max((v for _, v in lags), default=0)),
        lag_slope_records_per_min_second_half=None if l_slope is None else round(l_slope, 1),
        growing_topics_records_per_min=growing, retained_bounded=(r_slope is None or r_slope <= limit) and not growing,
        lag_bounded=l_slope is None or l_slope <= limit)


class TruncationFollower(threading.Thread):
    """Commits, for the devices no rank trains, the truncate-before offsets of the coordinator's plans."""

    def __init__(self, kafka: KafkaConfig, group: str, job: str, devices: Sequence[str]) -> None:
        super().__init__(name="truncation-follower", daemon=True)
        self.kafka, self.group, self.job, self.devices = kafka, group, job, set(devices)
        self.stop_event = threading.Event()
        self.committed: dict[str, int] = {}
        self.commits = self.errors = 0

    def _plans(self, plans: Any) -> dict[str, int]:
        wanted: dict[str, int] = {}
        for msg in plans.consume(200, timeout=0.5):
            with contextlib.suppress(WireError):
                plan = decode(msg.value(), msg.headers(), Assignment) if msg.error() is None else None
                for part in plan.devices if plan is not None and plan.job == self.job else ():
                    if part.device_id in self.devices and part.truncate_before is not None:
                        wanted[part.device_id] = max(wanted.get(part.device_id, 0), part.truncate_before)
        return {d: o for d, o in wanted.items() if o > self.committed.get(d, -1)}

    def run(self) -> None:
        topic = self.kafka.topics.assignments
        with (contextlib.closing(make_consumer(self.kafka, f"st-bench-soak-plans-{os.getpid()}")) as plans,
              contextlib.closing(make_consumer(self.kafka, self.group)) as committer):
            while not self.stop_event.is_set() and not live.assign_topic(plans, topic, OFFSET_END):
                self.stop_event.wait(0.5)
            while not self.stop_event.is_set():
                if fresh := self._plans(plans):
                    try:
                        committer.commit(offsets=[TopicPartition(self.kafka.topics.device(d), 0, o)
                                                  for d, o in fresh.items()], asynchronous=False)
                        self.committed.update(fresh)
                        self.commits += 1
                    except KafkaException as exc:
                        self.errors += 1
                        logger.warning("truncation follower: commit failed (%s)", exc)


def _rank_names(tree: dict[int, int], launcher: int) -> dict[str, int]:
    """Name the trainer processes: the `--local-ranks` launcher, and each rank by its --device-id."""
    out: dict[str, int] = {}
    for pid, rss in tree.items():
        with contextlib.suppress(psutil.Error):  # a rank may exit while it is read
            argv = psutil.Process(pid).cmdline()
            if "--device-id" in argv:  # a rank (with one device, the trainer process itself)
                out[f"rank-{argv[argv.index('--device-id') + 1]}"] = rss
            elif pid == launcher:
                out["trainer-launcher"] = rss
    return out


class _Soak:
    """The soak's services on one broker: a coordinator per phase, the ranks, the producers, the follower."""

    def __init__(self, broker: live.LiveBroker, setup: SoakSetup, run_dir: Path, launch: LaunchOptions) -> None:
        self.broker, self.setup, self.kafka = broker, setup, broker.kafka
        self.devices, self.ranked = setup.device_ids(), setup.device_ids()[:setup.ranks]
        self.services = live.Services(self.kafka, "soak", run_dir / "logs", launch, self.devices)
        self.ckpt, self.versions = run_dir / "checkpoints", run_dir / "versions"
        self.follower = TruncationFollower(self.kafka, "soak.trainers", "soak", self.devices[setup.ranks:])
        self.probe = make_consumer(self.kafka, "soak.trainers")  # reads the ranks' and the follower's commits
        self.samples: list[_Sample] = []
        self.spans: list[tuple[str, float, float]] = []

    def coordinator(self, truncation: str) -> None:
        # absent_after_seconds=0: the follower's devices never send feedback, yet must not count as absent.
        self.services.start(f"coordinator-{truncation}", "coordinator", "coordinate", "--port", "0",
                            settings=self.setup.coordinator_sets(
                                truncation, delete_records=True, delete_trained=True, poll_interval_seconds=1.0,
                                feedback_wait_seconds=0.2, max_lag_samples=self.setup.max_lag_samples,
                                absent_after_seconds=0.0))

    def start(self) -> None:
        """The first phase's coordinator, the ranks (until each has stepped), serve, the follower, the producers."""
        setup = self.setup
        self.coordinator(setup.phases[0])
        if self.ranked:
            # The ranks outlive the coordinators: `truncate` admits the plans of every phase's truncation.
            sets = {**setup.trainer_sets(hidden_size=32, num_layers=1, checkpoint_every=5, log_every=50),
                    "coordinator.truncation": "truncate"}
            if setup.serve:
                sets |= {"versions.dir": str(self.versions), "versions.publish_every_seconds": 1.0, "versions.keep": 3}
            self.services.start("trainers", "trainer", *live.train_command(self.ranked, self.ckpt), settings=sets)
            with contextlib.closing(live.FeedbackTail(self.kafka, "soak")) as tail:
                self.services.await_ranks(tail.reporting, self.ranked, setup.start_timeout_s)
            if setup.serve:
                self.services.start("serve", "serve", "serve", "--port", "0", settings=sets)
                self.services.start("requests", "requests", "request", "--rate", str(setup.request_rate or 20.0),
                                    settings=sets)
        self.follower.start()
        n, rates = max(1, min(setup.producer_procs, setup.devices)), setup.stream_rates()
        for i in range(n):
            self.services.start(f"producer-{i}", "producer", "produce", "--no-progress",
                                settings=setup.producer_sets(self.devices[i::n], rates[i::n], setup.seed + i))

    def sample(self, t: float, truncation: str) -> _Sample:
        rss: dict[str, int] = {}
        for name, pid in {"bench": os.getpid(), "broker": self.broker.pid, **self.services.pids()}.items():
            if pid is not None:  # an external broker's memory is not the benchmark's to measure
                tree = live.rss_tree(pid)
                rss.update(_rank_names(tree, pid) if name == "trainers" else {name: tree.get(pid, 0)})
        marks = live.watermarks(self.probe, self.kafka, self.devices)
        committed: dict[str, int] = {}
        with contextlib.suppress(KafkaException):
            topics = {self.kafka.topics.device(d): d for d in self.devices}
            parts = self.probe.committed([TopicPartition(t, 0) for t in topics], timeout=10)
            committed = {topics[tp.topic]: tp.offset for tp in parts if tp.error is None and tp.offset >= 0}
        return _Sample(round(t, 1), truncation, rss, {d: hi - lo for d, (lo, hi) in marks.items()},
                       {d: max(0, hi - committed.get(d, lo)) for d, (lo, hi) in marks.items()},
                       sum(hi for _, hi in marks.values()))

    def phases(self) -> None:
        """Each phase in turn (its own coordinator), sampled every `sample_every_s` until its share of the run."""
        setup, total_s, began = self.setup, self.setup.minutes * 60.0, time.monotonic()
        for index, truncation in enumerate(setup.phases):
            if index > 0:
                self.services.stop(f"coordinator-{setup.phases[index - 1]}", signal.SIGTERM, 30.0)
                self.coordinator(truncation)
            start, end = round(time.monotonic() - began, 1), (index + 1) * total_s / len(setup.phases)
            while time.monotonic() - began < end:
                self.samples.append(s := self.sample(time.monotonic() - began, truncation))
                console.print(f"{s.t:4.0f}/{total_s:.0f}s {truncation:<8} retained {sum(s.retained.values()):>7,} "
                              f"lag {sum(s.lag.values()):>7,} RSS {sum(s.rss.values()) / MIB:5.0f} MiB "
                              f"({len(s.rss)} procs)", highlight=False, soft_wrap=True)
                self.services.check()
                time.sleep(max(0.0, min(setup.sample_every_s, end - (time.monotonic() - began))))
            self.spans.append((truncation, start, round(time.monotonic() - began, 1)))

    def close(self) -> None:
        self.follower.stop_event.set()
        self.services.stop_all()
        if self.follower.is_alive():
            self.follower.join(15)
        self.probe.close()

    def result(self) -> SoakResult:
        samples, setup = self.samples, self.setup
        rates = dict(zip(self.devices, setup.stream_rates(), strict=True))
        processes = _memory(samples, self.broker)
        seconds = samples[-1].t - samples[0].t if len(samples) > 1 else 0.0
        produced = samples[-1].produced if samples else 0
        return SoakResult(
            setup=setup, arrival_rate_total=round(sum(rates.values()), 1), produced_records=produced,
            achieved_rate_total=round(produced / seconds, 1) if seconds else None,
            follower_commits=self.follower.commits, follower_errors=self.follower.errors,
            phases=[_phase(*span, samples, rates) for span in self.spans], processes=processes,
            series=SoakSeries(
                t=[s.t for s in samples], phase=[s.phase for s in samples],
                rss_mb={n: [round(s.rss[n] / MIB, 1) if n in s.rss else None for s in samples] for n in processes},
                retained_total=[sum(s.retained.values()) for s in samples],
                retained_max_topic=[max(s.retained.values(), default=0) for s in samples],
                lag_total=[sum(s.lag.values()) for s in samples],
                lag_max=[max(s.lag.values(), default=0) for s in samples]))


def run_soak(cfg: StreamtrainConfig, setup: SoakSetup, out: Path, external: bool = False,
             launch: LaunchOptions = LaunchOptions()) -> SoakResult:
    """Run the soak on a private embedded broker (or, unmeasured, `cfg.kafka` with `external`), write
    `out/soak.json` and `out/soak.png`; RuntimeError when a service failed or the ranks did not start."""
    with live.live_broker(cfg, external, "soak") as broker:
        soak = _Soak(broker, setup, setup.work_dir or out / "soak-run", launch)
        try:
            soak.start()
            soak.phases()
        finally:
            soak.close()
    return publish(BENCH, soak.result(), out)


def plot_soak(result: SoakResult) -> Any:
    """RSS of every process, records retained and lag over time, phases shaded."""
    series, setup = result.series, result.setup
    panels: list[tuple[str, str, dict[str, Sequence[float | None]]]] = [
        ("RSS (MiB)", "resident memory per process", dict(sorted(series.rss_mb.items()))),
        ("records", "records retained on the broker",
         {f"all {setup.devices} topics": series.retained_total, "largest topic": series.retained_max_topic}),
        ("records", "lag (high watermark - committed)", {"total": series.lag_total, "largest device": series.lag_max})]
    fig, axes = pyplot().subplots(1, 3, figsize=(13, 3.6))
    for ax, (ylabel, title, lines) in zip(axes, panels, strict=True):
        for label, values in lines.items():
            pts = [(x / 60.0, v) for x, v in zip(series.t, values, strict=True) if v is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, lw=1 if ax is axes[0] else None)
        for phase in result.phases:
            if phase.truncation == "bounded":
                ax.axvspan(phase.start_s / 60.0, phase.end_s / 60.0, color="grey", alpha=0.12)
        ax.set(xlabel="minutes (grey: bounded; white: truncate)", ylabel=ylabel, title=title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6 if ax is axes[0] else 8, ncol=2 if ax is axes[0] else 1)
    fig.suptitle(f"soak: {setup.devices} streams at ScaDLES {setup.rate_preset} (~{result.arrival_rate_total:,.0f} "
                 f"samples/s), {setup.ranks} ranks, {setup.minutes:g} min", fontsize=9)
    return fig


def soak_targets(result: SoakResult) -> list[Target]:
    """Every process's memory, the records retained, each topic and the lag: bounded."""
    procs, phases = result.processes, result.phases
    return [
        Target("memory of every process bounded (RSS slope over the second half)",
               f"peak RSS {num(max((p.peak_rss_mb for p in procs.values()), default=None), 0)} MiB (largest process), "
               f"{num(sum(p.peak_rss_mb for p in procs.values()), 0)} MiB all processes" + "".join(
                   f"; {n} still rising ({num(p.slope_mb_per_min_second_half)} MiB/min)"
                   for n, p in sorted(procs.items()) if not p.bounded),
               all(p.bounded for p in procs.values()),
               "not reported (ScaDLES reports buffer sizes, not process memory)"),
        Target("retained records bounded under truncate and bounded",
               "; ".join(f"{p.truncation}: peak {num(p.retained_records_peak)}, slope "
                         f"{num(p.retained_slope_records_per_min_second_half, 0)}/min" for p in phases),
               all(p.retained_bounded for p in phases), "ScaDLES Table IV: truncation keeps buffers 848x-9,429x "
               "smaller than persistence"),
        Target("no device topic keeps growing", "; ".join(
            f"{p.truncation}: " + (", ".join(f"device {d} +{num(v, 0)}/min"
                                             for d, v in p.growing_topics_records_per_min.items()) or "none")
            for p in phases), not any(p.growing_topics_records_per_min for p in phases)),
        Target("lag bounded", "; ".join(f"{p.truncation}: peak {num(p.lag_records_peak)}, slope "
                                        f"{num(p.lag_slope_records_per_min_second_half, 0)}/min" for p in phases),
               all(p.lag_bounded for p in phases)),
    ]


def render_soak(result: SoakResult) -> str:
    """The `soak` section of BENCHMARKS.md: setup, targets, every process's memory."""
    setup = result.setup
    return "\n\n".join([
        f"Setup: {setup.devices} streams at ScaDLES {setup.rate_preset} rates (about {result.arrival_rate_total:,.0f} "
        f"samples/s; achieved {num(result.achieved_rate_total, 0)}), {setup.producer_procs} producer processes; "
        f"{setup.ranks} gloo ranks (devices 0-{setup.ranks - 1}), {setup.devices - setup.ranks} streams truncation "
        f"alone; `truncate` then `bounded` (max {setup.max_lag_samples} samples), {setup.minutes:g} minutes in all. "
        f"Criteria: {CRITERIA}.",
        targets_table(soak_targets(result)),
        table(["process", "peak RSS MiB", "final RSS MiB", "slope MiB/min (2nd half)", "samples"],
              [[name, p.peak_rss_mb, p.final_rss_mb, num(p.slope_mb_per_min_second_half), p.samples]
               for name, p in sorted(result.processes.items())]),
    ])


def soak_command(
    ctx: typer.Context,
    minutes: Annotated[float, typer.Option(min=0.2, help="Length of the run, half truncate, half bounded (30: the "
                                           "real soak).")] = 2.0,
    out: common.Out = Path("reports/bench"),
    devices: Annotated[int, typer.Option(min=1, max=256, help="Device streams.")] = 32,
    ranks: Annotated[int, typer.Option(min=0, max=32, help="Gloo ranks (~0.5 GiB each) training devices 0..R-1; "
                                       "truncation alone consumes the rest.")] = 4,
    producer_procs: Annotated[int, typer.Option(min=1, help="Producer processes sharing the streams.")] = 4,
    sample_every: Annotated[float, typer.Option(min=0.5, help="Seconds between samples.")] = 5.0,
    max_lag_samples: Annotated[int, typer.Option(min=1, help="bounded: coordinator.max_lag_samples.")] = 512,
    seed: common.Seed = 0,
    external: common.External = False,
    work_dir: common.WorkDir = Path("reports/bench-runs"),
    serve: Annotated[bool, typer.Option(help="Model versions every second, `serve` answering 20 requests/s with "
                                        "them (needs --ranks >= 1).")] = False,
) -> None:
    """Soak: 32 streams at ScaDLES S2 rates through the stack; every process's memory, retained records and lag must
    stay bounded. Writes DIR/soak.json and DIR/soak.png; logs in WORK_DIR/soak/logs."""
    cfg = config_from(ctx)
    if ranks > devices:
        die(f"--ranks {ranks} is more than --devices {devices}", EXIT_CONFIG)
    serving = serve and ranks > 0
    setup = SoakSetup(minutes=minutes, devices=devices, ranks=ranks, producer_procs=producer_procs,
                      sample_every_s=sample_every, max_lag_samples=max_lag_samples, seed=seed,
                      work_dir=work_dir / "soak", serve=serving, request_rate=20.0 if serving else None)
    try:
        run_soak(cfg, setup, out, external, LaunchOptions.of(ctx))
    except RuntimeError as exc:  # a verdict is a finding (in the JSON); a service that failed is an error
        die(str(exc))


BENCH = Bench("soak", soak_command, SoakResult, render_soak, soak_targets, plot_soak, args=("--minutes", "5"),
              quick_args=("--minutes", "1"), timeout_s=600)
