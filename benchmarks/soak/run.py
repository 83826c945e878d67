"""`bench soak`, the run: the services as processes on one broker, sampled every few seconds."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_END, KafkaException, TopicPartition

from streamtrain.config import KafkaConfig, StreamtrainConfig
from streamtrain.kafka import list_topics, make_consumer
from streamtrain.wire import Assignment, WireError, decode

from ..common import LaunchOptions
from ..live import (
    FeedbackTail,
    LiveBroker,
    Services,
    ensure_device_topics,
    live_broker,
    rss_tree,
    train_command,
    watermarks,
)
from . import REQUEST_RATE, FollowerStats, PhaseSpan, SoakResult, SoakSample, SoakSetup, plot_soak, summarise_soak

__all__ = ["Progress", "TruncationFollower", "run_soak"]

logger = logging.getLogger(__name__)


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


#: `(seconds so far, of seconds, phase, the sample)` — what a progress display receives.
Progress = Callable[[float, float, str, SoakSample], None]


def run_soak(cfg: StreamtrainConfig, setup: SoakSetup, out: Path, external: bool = False,
             launch: LaunchOptions = LaunchOptions(), progress: Progress | None = None) -> SoakResult:
    """Run the soak, write `out/soak.json` and `out/soak.png`, and return the result.

    Args:
        cfg: the configuration (its broker settings, or the Kafka to use with `external`).
        setup: what to run.
        out: where the JSON and the plot go.
        external: use the Kafka at `cfg.kafka` rather than a private embedded broker (not measured then).
        launch: the root options the services are started with.
        progress: called after every sample.
    """
    out.mkdir(parents=True, exist_ok=True)
    with live_broker(cfg, external, "soak") as broker:
        result = _soak(broker, setup, out, launch, progress)
    result.write(out / "soak.json")
    plot_soak(result, out / "soak.png")
    return result


class _Soak:
    """The soak's services on one broker: a coordinator per phase, the ranks, the producers, the follower."""

    def __init__(self, broker: LiveBroker, setup: SoakSetup, run_dir: Path) -> None:
        self.broker, self.setup, self.kafka, self.job = broker, setup, broker.kafka, "soak"
        self.devices = setup.device_ids()
        self.ranked = self.devices[:setup.ranks]
        group = f"{self.job}.trainers"
        self.services = Services(run_dir / "logs")
        self.ckpt = run_dir / "checkpoints"
        self.versions = run_dir / "versions"
        for stale in self.ckpt.iterdir() if self.ckpt.exists() else ():
            stale.unlink()
        self.follower = TruncationFollower(self.kafka, group, self.job, self.devices[setup.ranks:])
        self.probe = make_consumer(self.kafka, group, **{"enable.auto.commit": "false"})  # reads commits only
        self.common = {"job": self.job, "kafka.bootstrap_servers": self.kafka.bootstrap_servers,
                       "kafka.topic_prefix": self.kafka.topic_prefix, "metrics.port": 0}
        self.samples: list[SoakSample] = []
        self.spans: list[PhaseSpan] = []

    def coordinator(self, truncation: str, launch: LaunchOptions) -> None:
        setup = self.setup
        sets: dict[str, object] = {
            **self.common, "coordinator.devices": self.devices, "coordinator.policy": setup.planner,
            "coordinator.delete_records": True, "coordinator.delete_trained": True, "coordinator.b_max": setup.b_max,
            "coordinator.poll_interval_seconds": 1.0, "coordinator.feedback_wait_seconds": 0.2,
            "coordinator.max_lag_samples": setup.max_lag_samples, "coordinator.seed": setup.seed,
            "coordinator.truncation": truncation}
        self.services.start(f"coordinator-{truncation}", "coordinator",
                            launch.command("coordinator", "coordinate", "--port", "0", settings=sets))

    def start(self, launch: LaunchOptions) -> None:
        """The first phase's coordinator, the ranks (until each has stepped), the follower, the producers."""
        setup = self.setup
        ensure_device_topics(self.kafka, self.devices)
        self.coordinator(setup.phases[0], launch)
        if self.ranked:
            sets = {**self.common, "trainer.device": "cpu", "trainer.backend": "gloo", "trainer.torch_threads": 1,
                    "trainer.num_features": setup.features, "trainer.num_classes": setup.classes,
                    "trainer.hidden_size": 32, "trainer.num_layers": 1, "trainer.plan_wait_seconds": 1.0,
                    "trainer.data_wait_seconds": 0.5, "trainer.checkpoint_every": 5, "trainer.log_every": 50,
                    "trainer.metrics": False,
                    # The ranks outlive the phases' coordinators: the rule that admits every phase's truncation
                    # (truncate and bounded by samples both keep at least the newest record).
                    "coordinator.truncation": "truncate"}
            if setup.serve:
                sets |= {"versions.dir": str(self.versions), "versions.publish_every_seconds": 1.0, "versions.keep": 3}
            self.services.start("trainers", "trainer",
                                launch.command("trainer", *train_command(self.ranked, self.ckpt), settings=sets))
            _wait_for_ranks(self.services, FeedbackTail(self.kafka, self.job), self.ranked, setup.start_timeout_s)
            if setup.serve:
                self.start_serving(launch, sets)
        self.follower.start()
        for i, (ids, rates) in enumerate(setup.producer_groups()):
            sets = {**self.common, "producer.devices": len(ids), "producer.device_ids": ids,
                    "producer.rate.rates": rates, "producer.seed": setup.seed + i, "producer.size.kind": "normal",
                    "producer.size.mean": setup.size_mean, "producer.size.dif": setup.size_dif,
                    "producer.synthetic.features": setup.features, "producer.synthetic.classes": setup.classes,
                    "producer.duration_seconds": 0, "producer.tick_seconds": 0.01, "producer.metrics": False}
            self.services.start(f"producer-{i}", "producer",
                                launch.command("producers", "produce", "--no-progress", settings=sets))

    def start_serving(self, launch: LaunchOptions, settings: dict[str, object]) -> None:
        """`serve` on the versions the ranks publish, and `streamtrain request` sending it the synthetic task."""
        self.services.start("serve", "serve", launch.command("serve", "serve", "--port", "0", settings=settings))
        self.services.start("requests", "requests", launch.command(
            "serve", "request", "--rate", str(self.setup.request_rate or REQUEST_RATE), settings=settings))

    def phases(self, launch: LaunchOptions, progress: Progress | None) -> None:
        """Each phase in turn (its own coordinator), sampled every `sample_every_s` until its share of the run."""
        setup = self.setup
        total_s = setup.minutes * 60.0
        began = time.monotonic()
        for index, truncation in enumerate(setup.phases):
            if index > 0:
                self.services.stop(f"coordinator-{setup.phases[index - 1]}", signal.SIGTERM, 30.0)
                self.coordinator(truncation, launch)
            start, end = round(time.monotonic() - began, 1), (index + 1) * total_s / len(setup.phases)
            while time.monotonic() - began < end:
                sample = _sample(self.broker, self.services, self.kafka, self.probe, self.devices,
                                 time.monotonic() - began, truncation)
                self.samples.append(sample)
                if progress is not None:
                    progress(sample.t, total_s, truncation, sample)
                if dead := self.services.dead():
                    raise RuntimeError(self.services.failure(dead[0]))
                time.sleep(max(0.0, min(setup.sample_every_s, end - (time.monotonic() - began))))
            self.spans.append(PhaseSpan(truncation, start, round(time.monotonic() - began, 1)))

    def close(self) -> None:
        self.follower.stop_event.set()
        self.services.stop_all()
        if self.follower.is_alive():
            self.follower.join(15)
        self.probe.close()


def _soak(broker: LiveBroker, setup: SoakSetup, out: Path, launch: LaunchOptions,
          progress: Progress | None) -> SoakResult:
    soak = _Soak(broker, setup, setup.work_dir or out / "soak-run")
    failures: list[str] = []
    try:
        soak.start(launch)
        soak.phases(launch, progress)
    except RuntimeError as exc:
        failures.append(str(exc))
        raise
    finally:
        soak.close()
    stats = FollowerStats(devices=setup.devices - setup.ranks, commits=soak.follower.commits,
                          errors=soak.follower.errors)
    return summarise_soak(setup, broker, soak.samples, soak.spans, stats, failures)


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
                                   f"{services.log_dir / 'trainers.log'}")
            time.sleep(0.2)
    finally:
        tail.close()


def _sample(broker: LiveBroker, services: Services, kafka: KafkaConfig, probe: Any, devices: Sequence[str],
            t: float, truncation: str) -> SoakSample:
    rss: dict[str, int] = {"bench": rss_tree(os.getpid()).get(os.getpid(), 0)}
    if broker.pid is not None:
        rss["broker"] = rss_tree(broker.pid).get(broker.pid, 0)
    for name, pid in services.pids().items():
        tree = rss_tree(pid)
        if name == "trainers":
            rss.update(_rank_names(tree, pid))
        else:  # coordinator-<truncation> (one process per phase), serve, requests
            rss[name] = tree.get(pid, 0)
    marks = watermarks(probe, kafka, devices)
    committed: dict[str, int] = {}
    with contextlib.suppress(KafkaException):
        parts = probe.committed([TopicPartition(kafka.topics.device(d), 0) for d in devices], timeout=10)
        by_topic = {kafka.topics.device(d): d for d in devices}
        committed = {by_topic[tp.topic]: tp.offset for tp in parts if tp.error is None and tp.offset >= 0}
    retained = {d: hi - lo for d, (lo, hi) in marks.items()}
    lag = {d: max(0, hi - committed.get(d, lo)) for d, (lo, hi) in marks.items()}
    return SoakSample(round(t, 1), truncation, rss, retained, lag, sum(hi for _, hi in marks.values()))
