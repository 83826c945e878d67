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

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from confluent_kafka import OFFSET_END, KafkaException, TopicPartition

from streamtrain.cli_support import module_command
from streamtrain.config import KafkaConfig, StreamtrainConfig
from streamtrain.config.producer import RateConfig
from streamtrain.kafka import list_topics, make_consumer
from streamtrain.wire import Assignment, WireError, decode

from .live import (
    FeedbackTail,
    LiveBroker,
    Services,
    ensure_device_topics,
    live_broker,
    robust_slope,
    rss_tree,
    train_command,
    watermarks,
)
from .registry import save_figure

__all__ = ["SoakSetup", "plot_soak", "render_soak", "run_soak", "soak_command"]

logger = logging.getLogger(__name__)

_MB = 1024.0 * 1024.0
#: Memory a JVM uses besides its heap (metaspace, code cache, thread stacks, direct buffers), in MiB.
_JVM_NON_HEAP_MB = 384.0


@dataclass
class SoakSetup:
    """What the soak runs."""

    minutes: float = 2.0
    devices: int = 32
    ranks: int = 4
    producer_procs: int = 4
    seed: int = 0
    rate_preset: str = "S2"
    planner: str = "scadles"
    b_max: int = 64
    max_lag_samples: int = 512
    size_mean: float = 16.0
    size_dif: float = 4.0
    features: int = 16
    classes: int = 10
    sample_every_s: float = 5.0
    start_timeout_s: float = 240.0
    phases: tuple[str, ...] = ("truncate", "bounded")
    work_dir: Path | None = None
    """Service logs and checkpoints (default: <out>/soak-run)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def device_ids(self) -> list[str]:
        return [str(i) for i in range(self.devices)]

    def rates(self) -> list[float]:
        from producers.rates import sample_base_rates

        cfg = RateConfig(preset=self.rate_preset)  # type: ignore[arg-type]
        return [round(float(r), 1) for r in sample_base_rates(cfg, self.devices, np.random.default_rng(self.seed))]

    def producer_groups(self) -> list[tuple[list[str], list[float]]]:
        ids, rates = self.device_ids(), self.rates()
        n = max(1, min(self.producer_procs, self.devices))
        return [(ids[i::n], rates[i::n]) for i in range(n)]


class TruncationFollower(threading.Thread):
    """Commits, for the devices no rank trains, the truncate-before offsets of the coordinator's plans."""

    def __init__(self, kafka: KafkaConfig, group: str, job: str, devices: Sequence[str]) -> None:
        super().__init__(name="truncation-follower", daemon=True)
        self.kafka, self.job, self.devices = kafka, job, set(devices)
        self.group = group
        self.stop_event = threading.Event()
        self.committed: dict[str, int] = {}
        self.commits = 0
        self.errors = 0

    def run(self) -> None:
        plans = make_consumer(self.kafka, f"st-bench-soak-plans-{os.getpid()}", **{"enable.auto.commit": "false"})
        committer = make_consumer(self.kafka, self.group, **{"enable.auto.commit": "false"})
        topic = self.kafka.topics.assignments
        try:
            while not self.stop_event.is_set():
                meta = list_topics(plans, 5.0, topic).topics.get(topic)
                if meta is not None and meta.error is None and meta.partitions:
                    plans.assign([TopicPartition(topic, p, OFFSET_END) for p in meta.partitions])
                    break
                self.stop_event.wait(0.5)
            while not self.stop_event.is_set():
                wanted: dict[str, int] = {}
                for msg in plans.consume(200, timeout=0.5):
                    if msg.error() is not None:
                        continue
                    try:
                        plan = decode(msg.value(), msg.headers(), Assignment)
                    except WireError:
                        continue
                    if plan.job != self.job:
                        continue
                    for part in plan.devices:
                        if part.device_id in self.devices and part.truncate_before is not None:
                            wanted[part.device_id] = max(wanted.get(part.device_id, 0), part.truncate_before)
                fresh = {d: o for d, o in wanted.items() if o > self.committed.get(d, -1)}
                if fresh:
                    try:
                        committer.commit(offsets=[TopicPartition(self.kafka.topics.device(d), 0, o)
                                                  for d, o in fresh.items()], asynchronous=False)
                        self.committed.update(fresh)
                        self.commits += 1
                    except KafkaException as exc:
                        self.errors += 1
                        logger.warning("truncation follower: commit failed (%s)", exc)
        finally:
            plans.close()
            committer.close()


def _rank_names(tree: dict[int, int], launcher: int) -> dict[str, int]:
    """Name the trainer processes: the `--local-ranks` launcher, and each rank by its --device-id."""
    out: dict[str, int] = {}
    for pid, rss in tree.items():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--device-id" in argv:  # a rank (with one device, the trainer process itself)
            out[f"rank-{argv[argv.index(b'--device-id') + 1].decode()}"] = rss
        elif pid == launcher:
            out["trainer-launcher"] = rss
    return out


Progress = Callable[[float, float, str, dict[str, Any]], None]


def run_soak(cfg: StreamtrainConfig, setup: SoakSetup, out: Path, external: bool = False,
             global_args: Sequence[str] = (), progress: Progress | None = None) -> dict[str, Any]:
    """Run the soak, write `out/soak.json` and `out/soak.png`, and return the document."""
    out.mkdir(parents=True, exist_ok=True)
    with live_broker(cfg, external, "soak") as broker:
        doc = _soak(broker, setup, out, global_args, progress)
    text = json.dumps(doc, indent=1) + "\n"
    (out / "soak.json").write_text(text)
    doc = json.loads(text)  # what the file holds (tuples become lists)
    plot_soak(doc, out / "soak.png")
    return doc


def _soak(broker: LiveBroker, setup: SoakSetup, out: Path, global_args: Sequence[str],
          progress: Progress | None) -> dict[str, Any]:
    kafka, job = broker.kafka, "soak"
    devices = setup.device_ids()
    ranked = devices[:setup.ranks]
    follower_devices = devices[setup.ranks:]
    group = f"{job}.trainers"
    ensure_device_topics(kafka, devices)
    run_dir = setup.work_dir or out / "soak-run"
    services = Services(run_dir / "logs")
    common = {"job": job, "kafka.bootstrap_servers": kafka.bootstrap_servers, "kafka.topic_prefix": kafka.topic_prefix,
              "metrics.port": 0}
    coord_sets: dict[str, object] = {
        "coordinator.devices": devices, "coordinator.policy": setup.planner, "coordinator.delete_records": True,
        "coordinator.delete_trained": True,
        "coordinator.b_max": setup.b_max, "coordinator.poll_interval_seconds": 1.0,
        "coordinator.plan_wait_seconds": 0.2, "coordinator.max_lag_samples": setup.max_lag_samples,
        "coordinator.seed": setup.seed}
    trainer_sets = {"trainer.device": "cpu", "trainer.backend": "gloo", "trainer.torch_threads": 1,
                    "trainer.num_features": setup.features, "trainer.num_classes": setup.classes,
                    "trainer.hidden_size": 32, "trainer.num_layers": 1, "trainer.plan_wait_s": 1.0,
                    "trainer.data_wait_s": 0.5, "trainer.checkpoint_every": 5, "trainer.log_every": 50,
                    "trainer.metrics": False,
                    # The ranks outlive the phases' coordinators: the rule that admits every phase's truncation
                    # (truncate and bounded by samples both keep at least the newest record).
                    "coordinator.truncation": "truncate"}
    ckpt = run_dir / "checkpoints"
    if ckpt.exists():
        for stale in ckpt.iterdir():
            stale.unlink()
    follower = TruncationFollower(kafka, group, job, follower_devices)
    probe = make_consumer(kafka, group, **{"enable.auto.commit": "false"})  # reads the group's commits only
    total_s = setup.minutes * 60.0
    phase_s = total_s / len(setup.phases)
    samples: list[dict[str, Any]] = []
    phases: list[dict[str, Any]] = []
    failures: list[str] = []
    try:
        def coordinator(truncation: str) -> None:
            services.start(f"coordinator-{truncation}", "coordinator", module_command(
                "coordinator", "coordinate", "--port", "0", global_args=global_args,
                sets={**common, **coord_sets, "coordinator.truncation": truncation}))

        coordinator(setup.phases[0])
        if ranked:
            services.start("trainers", "trainer", module_command(
                "trainer", *train_command(ranked, ckpt), global_args=global_args, sets={**common, **trainer_sets}))
            _wait_for_ranks(services, FeedbackTail(kafka, job), ranked, setup.start_timeout_s)
        follower.start()
        for i, (ids, rates) in enumerate(setup.producer_groups()):
            services.start(f"producer-{i}", "producer", module_command("producers", "produce", "--no-progress",
                                                                       global_args=global_args, sets={
                **common, "producer.devices": len(ids), "producer.device_ids": ids, "producer.rate.rates": rates,
                "producer.seed": setup.seed + i, "producer.size.kind": "normal", "producer.size.mean": setup.size_mean,
                "producer.size.dif": setup.size_dif, "producer.synthetic.features": setup.features,
                "producer.synthetic.classes": setup.classes, "producer.duration_s": 0,
                "producer.tick_s": 0.01, "producer.metrics": False}))
        began = time.monotonic()
        for index, truncation in enumerate(setup.phases):
            if index > 0:
                services.stop(f"coordinator-{setup.phases[index - 1]}", signal.SIGTERM, 30.0)
                coordinator(truncation)
            start = time.monotonic() - began
            phases.append({"truncation": truncation, "start_s": round(start, 1)})
            end = (index + 1) * phase_s
            while time.monotonic() - began < end:
                sample = _sample(broker, services, kafka, probe, devices, time.monotonic() - began, truncation)
                samples.append(sample)
                if progress is not None:
                    progress(sample["t"], total_s, truncation, sample)
                if dead := services.dead():
                    raise RuntimeError(services.failure(dead[0]))
                time.sleep(max(0.0, min(setup.sample_every_s, end - (time.monotonic() - began))))
            phases[-1]["end_s"] = round(time.monotonic() - began, 1)
    except RuntimeError as exc:
        failures.append(str(exc))
        raise
    finally:
        follower.stop_event.set()
        services.stop_all()
        follower.join(15)
        probe.close()
    return _document(setup, broker, samples, phases, follower, failures)


def _wait_for_ranks(services: Services, tail: FeedbackTail, ranked: Sequence[str], timeout: float) -> None:
    """Wait until every rank has reported a step (the trainers are up), or fail on an early exit."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    try:
        while not set(ranked) <= seen:
            seen |= {fb.device_id for fb in tail.poll()}
            if dead := services.dead():
                raise RuntimeError(services.failure(dead[0]))
            if time.monotonic() > deadline:
                raise RuntimeError(f"the trainer ranks did not report a step within {timeout:.0f} s; see "
                                   f"{services.children['trainers'].log_path}")
            time.sleep(0.2)
    finally:
        tail.close()


def _sample(broker: LiveBroker, services: Services, kafka: KafkaConfig, probe: Any, devices: Sequence[str],
            t: float, truncation: str) -> dict[str, Any]:
    rss: dict[str, int] = {"bench": rss_tree(os.getpid()).get(os.getpid(), 0)}
    if broker.pid is not None:
        rss["broker"] = rss_tree(broker.pid).get(broker.pid, 0)
    for name, pid in services.pids().items():
        tree = rss_tree(pid)
        if name == "trainers":
            rss.update(_rank_names(tree, pid))
        else:  # coordinator-<truncation>: one process per phase
            rss[name] = tree.get(pid, 0)
    marks = watermarks(probe, kafka, devices)
    committed: dict[str, int] = {}
    with contextlib.suppress(KafkaException):
        parts = probe.committed([TopicPartition(kafka.topics.device(d), 0) for d in devices], timeout=10)
        by_topic = {kafka.topics.device(d): d for d in devices}
        committed = {by_topic[tp.topic]: tp.offset for tp in parts if tp.error is None and tp.offset >= 0}
    retained = {d: hi - lo for d, (lo, hi) in marks.items()}
    lag = {d: max(0, hi - committed.get(d, lo)) for d, (lo, hi) in marks.items()}
    return {"t": round(t, 1), "phase": truncation, "rss": rss, "retained": retained, "lag": lag,
            "produced": sum(hi for _, hi in marks.values())}


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


def _document(setup: SoakSetup, broker: LiveBroker, samples: list[dict[str, Any]], phases: list[dict[str, Any]],
              follower: TruncationFollower, failures: list[str]) -> dict[str, Any]:
    names = sorted({n for s in samples for n in s["rss"]})
    arrival = float(sum(setup.rates()))
    processes: dict[str, Any] = {}
    memory_ok = True
    for name in names:
        pts = [(s["t"], s["rss"][name] / _MB) for s in samples if name in s["rss"]]
        peak = max(v for _, v in pts)
        per_min = _slope_per_min(pts)
        limit = max(2.0, 0.01 * peak)
        ok = per_min is None or per_min <= limit
        # A JVM's RSS rises towards its heap limit as the heap fills between collections; -Xmx bounds it, so
        # the broker is bounded while it stays within its heap plus the JVM's own (non-heap) memory.
        jvm_cap = broker.heap_mb + _JVM_NON_HEAP_MB if name == "broker" and broker.heap_mb else None
        if jvm_cap is not None:
            ok = ok or peak <= jvm_cap
        memory_ok &= ok
        processes[name] = {"peak_rss_mb": round(peak, 1), "final_rss_mb": round(pts[-1][1], 1), "samples": len(pts),
                           "slope_mb_per_min_second_half": None if per_min is None else round(per_min, 2),
                           "bounded": ok, **({"heap_bound_mb": jvm_cap} if jvm_cap is not None else {})}
    per_phase = []
    retained_ok = lag_ok = True
    rate_of = dict(zip(setup.device_ids(), setup.rates(), strict=True))
    for phase in phases:
        rows = [s for s in samples if s["phase"] == phase["truncation"]]
        tot = [(s["t"], float(sum(s["retained"].values()))) for s in rows]
        lags = [(s["t"], float(sum(s["lag"].values()))) for s in rows]
        r_slope, l_slope = _slope_per_min(tot), _slope_per_min(lags)
        # A topic nothing deletes from grows at its whole arrival rate; one growing at over a quarter of it is not
        # bounded, even when the total (1/32 of which it is) looks flat.
        growing = {}
        for device, rate in rate_of.items():
            per_min = _slope_per_min([(s["t"], float(s["retained"].get(device, 0))) for s in rows])
            if per_min is not None and per_min > 0.25 * rate * 60.0:
                growing[device] = round(per_min, 1)
        # Unbounded growth would be (arrivals - training) per second: most of the input. Allow 2% of it.
        limit = 0.02 * arrival * 60.0
        r_ok = (r_slope is None or r_slope <= limit) and not growing
        l_ok = l_slope is None or l_slope <= limit
        retained_ok &= r_ok
        lag_ok &= l_ok
        per_phase.append({
            **phase, "samples": len(rows),
            "retained_records_peak": int(max((v for _, v in tot), default=0)),
            "retained_records_final": int(tot[-1][1]) if tot else None,
            "retained_records_max_topic_peak": max((max(s["retained"].values(), default=0) for s in rows), default=0),
            "retained_slope_records_per_min_second_half": None if r_slope is None else round(r_slope, 1),
            "lag_records_peak": int(max((v for _, v in lags), default=0)),
            "lag_slope_records_per_min_second_half": None if l_slope is None else round(l_slope, 1),
            "slope_limit_records_per_min": round(limit, 1),
            "growing_topics_records_per_min": growing,
            "retained_bounded": r_ok, "lag_bounded": l_ok,
        })
    produced = samples[-1]["produced"] if samples else 0
    seconds = samples[-1]["t"] - samples[0]["t"] if len(samples) > 1 else 0.0
    return {
        "minutes": setup.minutes,
        "devices": setup.devices,
        "ranks": setup.ranks,
        "setup": {**{k: v for k, v in asdict(setup).items() if k not in ("extra", "work_dir")}, **setup.extra,
                  "rates": setup.rates(),
                  "arrival_rate_total": round(arrival, 1), "embedded_broker": broker.embedded,
                  "broker_rss": "measured" if broker.pid is not None else "external broker: not measured"},
        "phases": per_phase,
        "processes": processes,
        "produced_records": produced,
        "achieved_rate_total": round(produced / seconds, 1) if seconds else None,
        "follower": {"devices": setup.devices - setup.ranks, "commits": follower.commits, "errors": follower.errors},
        "bounded": {"memory": memory_ok, "retained_records": retained_ok, "lag": lag_ok,
                    "criteria": "Theil-Sen slopes (robust to single steps) over the second half: of each process's own "
                                "samples for RSS "
                                "(<= max(2 MiB, 1% of its peak) per minute; the coordinator is one process per "
                                "phase; the broker's JVM also passes while its RSS stays within its -Xmx heap + "
                                f"{_JVM_NON_HEAP_MB:g} MiB), of each phase for the records retained and the lag "
                                "(<= 2% of the aggregate arrival rate, i.e. growth at 1/50 of the input; and no "
                                "single topic growing at over 25% of its own arrival rate)"},
        "failures": failures,
        "series": {
            "t": [s["t"] for s in samples], "phase": [s["phase"] for s in samples],
            "rss_mb": {n: [round(s["rss"].get(n, 0) / _MB, 1) if n in s["rss"] else None for s in samples]
                       for n in names},
            "retained_total": [sum(s["retained"].values()) for s in samples],
            "retained_max_topic": [max(s["retained"].values(), default=0) for s in samples],
            "retained_by_device": {d: [s["retained"].get(d) for s in samples] for d in setup.device_ids()},
            "lag_total": [sum(s["lag"].values()) for s in samples],
            "lag_max": [max(s["lag"].values(), default=0) for s in samples],
            "produced": [s["produced"] for s in samples],
        },
    }


def plot_soak(doc: dict[str, Any], png: Path) -> Path:
    """RSS of every process, records retained and lag over time, phases shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = doc["series"]
    t = [v / 60.0 for v in series["t"]]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for name, values in sorted(series["rss_mb"].items()):
        pts = [(x, v) for x, v in zip(t, values, strict=True) if v is not None]
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], label=name, lw=1)
    axes[1].plot(t, series["retained_total"], label="all 32 topics" if doc["devices"] == 32 else "all topics")
    axes[1].plot(t, series["retained_max_topic"], label="largest topic")
    axes[2].plot(t, series["lag_total"], label="total")
    axes[2].plot(t, series["lag_max"], label="largest device")
    for ax in axes:
        for phase in doc["phases"]:
            if phase["truncation"] == "bounded":
                ax.axvspan(phase["start_s"] / 60.0, phase["end_s"] / 60.0, color="grey", alpha=0.12)
        ax.set_xlabel("minutes (grey: bounded; white: truncate)")
        ax.grid(alpha=0.3)
    axes[0].set(ylabel="RSS (MiB)", title="resident memory per process")
    axes[0].legend(fontsize=6, ncol=2)
    axes[1].set(ylabel="records", title="records retained on the broker")
    axes[1].legend(fontsize=8)
    axes[2].set(ylabel="records", title="lag (high watermark - committed)")
    axes[2].legend(fontsize=8)
    fig.suptitle(f"soak: {doc['devices']} streams at ScaDLES {doc['setup']['rate_preset']} "
                 f"(~{doc['setup']['arrival_rate_total']:,.0f} samples/s), {doc['ranks']} ranks, "
                 f"{doc['minutes']:g} min", fontsize=9)
    return save_figure(fig, png)


def render_soak(doc: dict[str, Any], ctx: Any) -> str:
    """The BENCHMARKS.md section."""
    from .registry import _num, _table, _verdict

    png = plot_soak(doc, ctx.plot_path("soak.png"))
    setup, bounded = doc["setup"], doc["bounded"]
    procs = doc["processes"]
    peak_total = sum(p["peak_rss_mb"] for p in procs.values())
    targets = _table(["target", "measured", "paper", "verdict"], [
        ["memory of every process bounded (RSS slope over the second half)",
         f"peak RSS {_num(max((p['peak_rss_mb'] for p in procs.values()), default=None), 0)} MiB "
         f"(largest process), {_num(peak_total, 0)} MiB all processes",
         "not reported (ScaDLES reports buffer sizes, not process memory)", _verdict(bounded["memory"])],
        ["retained records bounded under truncate and bounded",
         "; ".join(f"{p['truncation']}: peak {_num(p['retained_records_peak'])}, slope "
                   f"{_num(p['retained_slope_records_per_min_second_half'], 0)}/min" for p in doc["phases"]),
         "ScaDLES Table IV: truncation keeps buffers 848x-9,429x smaller than persistence", _verdict(
             bounded["retained_records"])],
        ["no device topic keeps growing", "; ".join(
            f"{p['truncation']}: " + (", ".join(f"device {d} +{_num(v, 0)}/min" for d, v in
                                                p.get("growing_topics_records_per_min", {}).items()) or "none")
            for p in doc["phases"]), "-", _verdict(not any(p.get("growing_topics_records_per_min")
                                                          for p in doc["phases"]))],
        ["lag bounded", "; ".join(f"{p['truncation']}: peak {_num(p['lag_records_peak'])}, slope "
                                  f"{_num(p['lag_slope_records_per_min_second_half'], 0)}/min"
                                  for p in doc["phases"]), "—", _verdict(bounded["lag"])],
    ])
    rows = [[name, p["peak_rss_mb"], p["final_rss_mb"], _num(p["slope_mb_per_min_second_half"]), p["samples"]]
            for name, p in sorted(procs.items())]
    notes = []
    growing = sorted({d for p in doc["phases"] for d in p.get("growing_topics_records_per_min", {})}, key=int)
    if growing:
        notes.append(f"Device topic(s) {', '.join(growing)} kept growing: their rank kept up with the stream, so "
                     "the backlog stayed under the bound, nothing was truncated there, and the coordinator's "
                     "DeleteRecords - which only removes truncated records, never past a truncate-before offset - "
                     "deleted nothing: the topic keeps every trained record, as under persistence.")
    grew = sorted(n for n, p in procs.items() if not p["bounded"])
    if grew:
        notes.append(f"Memory still rising in the second half: {', '.join(grew)}. A run of {doc['minutes']:g} "
                     "minutes includes warm-up (the broker's JVM heap grows towards -Xmx, the ranks' allocator "
                     "pools fill after the coordinator restart); `--minutes 30` is the run that decides.")
    if len(doc["phases"]) > 1:
        notes.append("The spike at the phase change is the coordinator restart: no plans, truncation or "
                     "DeleteRecords until the new coordinator has started and rebuilt its state from Kafka.")
    return "\n\n".join([
        f"Setup: {doc['devices']} device streams at ScaDLES {setup['rate_preset']} rates (about "
        f"{setup['arrival_rate_total']:,.0f} samples/s in all; achieved {_num(doc['achieved_rate_total'], 0)}) from "
        f"{setup['producer_procs']} producer processes; {doc['ranks']} gloo ranks train devices 0-{doc['ranks'] - 1}, "
        f"the other {doc['devices'] - doc['ranks']} streams are consumed by truncation alone (the benchmark "
        f"commits the coordinator's truncate-before offsets for them); `truncate` then `bounded` "
        f"(max {setup['max_lag_samples']} samples) for {doc['minutes']:g} minutes in all, DeleteRecords on. "
        f"Criteria: {bounded['criteria']}.",
        targets,
        _table(["process", "peak RSS MiB", "final RSS MiB", "slope MiB/min (2nd half)", "samples"], rows),
        *notes,
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
) -> None:
    """Soak: 32 streams at ScaDLES S2 rates through the stack; memory, retained records and lag must stay bounded.

    Producers, a coordinator (truncate for the first half, then restarted with bounded) with
    DeleteRecords, and --ranks gloo ranks; the streams without a rank are consumed by truncation
    alone. Samples RSS of every process (/proc), records retained per topic and lag every
    --sample-every seconds, and judges boundedness on slopes over the second half of each phase.
    Writes DIR/soak.json and DIR/soak.png; logs in WORK_DIR/soak/logs. Exit 1 when something grew.
    """
    from streamtrain.cli_support import config_from, console, die

    from .cli import _root_options

    cfg = config_from(ctx)
    if ranks > devices:
        die(f"--ranks {ranks} is more than --devices {devices}", 2)
    setup = SoakSetup(minutes=minutes, devices=devices, ranks=ranks, producer_procs=producer_procs,
                      sample_every_s=sample_every, max_lag_samples=max_lag_samples, seed=seed,
                      work_dir=work_dir / "soak")

    def progress(t: float, total: float, phase: str, sample: dict[str, Any]) -> None:
        rss = sum(sample["rss"].values()) / _MB
        console.print(f"{t:4.0f}/{total:.0f}s {phase:<8} retained {sum(sample['retained'].values()):>7,} "
                      f"lag {sum(sample['lag'].values()):>7,} RSS {rss:5.0f} MiB ({len(sample['rss'])} procs)",
                      highlight=False, soft_wrap=True)

    try:
        doc = run_soak(cfg, setup, out, external, _root_options(ctx), progress)
    except RuntimeError as exc:
        die(str(exc))
    for name, p in sorted(doc["processes"].items()):
        console.print(f"  {name:<18} peak {p['peak_rss_mb']:8.1f} MiB  slope {p['slope_mb_per_min_second_half']} "
                      f"MiB/min", highlight=False)
    for p in doc["phases"]:
        console.print(f"  {p['truncation']:<9} retained peak {p['retained_records_peak']:,}, slope "
                      f"{p['retained_slope_records_per_min_second_half']}/min; lag peak {p['lag_records_peak']:,}",
                      highlight=False)
    verdict = ", ".join(f"{k} {'bounded' if doc['bounded'][k] else 'NOT bounded'}"
                        for k in ("memory", "retained_records", "lag"))
    console.print(f"{verdict}; wrote {out / 'soak.json'} and {out / 'soak.png'}", highlight=False, soft_wrap=True)
    if doc["failures"]:  # a verdict is a finding (it is in the JSON); a service that failed is an error
        console.print(f"[red]failures: {'; '.join(doc['failures'])}")
        raise typer.Exit(1)
