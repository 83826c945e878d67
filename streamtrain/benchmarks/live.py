"""The live-cell runner of the benchmarks on real processes: the broker they share (`live_broker`), one cell of
the whole local stack (`run_stack_cell`), the services as child processes for benchmarks that arrange them
themselves (`Services`, on `StreamsSetup` streams), and probes (watermarks, feedback, resident memory).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil
from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition
from pydantic import Field

from streamtrain.broker import BrokerError, EmbeddedBroker
from streamtrain.config import KafkaConfig, StreamtrainConfig, parse_assignment
from streamtrain.kafka import TopicSpec, consume_available, ensure_topics, list_topics, make_admin, make_consumer
from streamtrain.kafka import watermarks as kafka_watermarks
from streamtrain.stack.options import BrokerMode, StackOptions
from streamtrain.stack.procs import Child, ChildSet
from streamtrain.stack.services import ServiceSpec
from streamtrain.wire import StepFeedback, WireError, decode

from .common import LaunchOptions, Record

if TYPE_CHECKING:
    from streamtrain.report.ledger import RunRecords
    from streamtrain.report.schema import StackReport

__all__ = [
    "CellRun",
    "FeedbackTail",
    "LiveBroker",
    "Services",
    "StackCell",
    "StreamsSetup",
    "assign_topic",
    "delete_topics",
    "live_broker",
    "rss_tree",
    "run_stack_cell",
    "train_command",
    "watermarks",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveBroker:
    """The broker a benchmark runs on: its Kafka settings; when embedded, the JVM's pid and heap limit (MiB)."""

    kafka: KafkaConfig
    pid: int | None
    embedded: bool
    heap_mb: float | None = None


@contextlib.contextmanager
def live_broker(cfg: StreamtrainConfig, external: bool, tag: str, starting: Callable[[], None] | None = None,
                heap: str | None = None) -> Iterator[LiveBroker]:
    """A private embedded broker with `cfg.broker`'s settings (its JVM's heap `heap` when given) in a scratch
    directory (`starting()` is called first), or with `external` the Kafka of `cfg.kafka` under a fresh topic
    prefix named by `tag`.

    Raises:
        RuntimeError: the embedded broker did not start, or no broker answers at the configured address.
    """
    if external:
        if not EmbeddedBroker.answers(cfg.kafka.bootstrap_servers, timeout=10.0,
                                      settings=cfg.kafka.security_settings()):
            raise RuntimeError(f"no Kafka broker answers at {cfg.kafka.bootstrap_servers} (kafka.bootstrap_servers)")
        prefix = f"{cfg.kafka.topic_prefix}.{tag}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        yield LiveBroker(cfg.kafka.model_copy(update={"topic_prefix": prefix}), None, False)
        return
    with tempfile.TemporaryDirectory(prefix=f"st-{tag}-") as tmp:
        settings = cfg.broker.model_copy(update={"data_dir": Path(tmp) / "kafka", "port": 0, "controller_port": 0,
                                                 **({"heap": heap} if heap else {})})
        broker = EmbeddedBroker(settings)
        if starting is not None:
            starting()
        try:
            bootstrap = broker.start()
        except BrokerError as exc:
            raise RuntimeError(f"the embedded Kafka broker did not start: {exc}") from None
        try:
            kafka = cfg.kafka.model_copy(update={"bootstrap_servers": bootstrap,
                                                 "topic_prefix": f"{cfg.kafka.topic_prefix}.{tag}"})
            yield LiveBroker(kafka, broker.pid(), True, settings.heap_mb)
        finally:
            broker.stop()


@dataclass(frozen=True, kw_only=True)
class StackCell(StackOptions):
    """One run of the whole local stack: `up`'s options (`out`: its run directory; no Prometheus, on the benchmark's
    broker), the benchmark's `tag` and the cell's `index` (its topic prefix and job), and the dotted settings that
    make it this cell, on top of the launch options (then `extra_sets`)."""

    tag: str
    index: int
    settings: Mapping[str, object]
    extra_sets: Sequence[str] = ()
    broker: BrokerMode = "external"
    prometheus: bool = False
    drain_timeout_s: float = 0.0
    start_timeout_s: float = 240.0


@dataclass(frozen=True)
class CellRun:
    """What a cell's run left: `up`'s report and the records read back (None when they could not be), the error."""

    report: StackReport | None
    records: RunRecords | None
    seconds: float
    run_dir: Path
    error: str | None


def delete_topics(cfg: StreamtrainConfig) -> None:
    """Delete every topic under `cfg`'s topic prefix (disk space only: a failure is logged, never raised)."""
    try:
        admin = make_admin(cfg.kafka)
        names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(cfg.kafka.topic_prefix + ".")]
        for fut in admin.delete_topics(names, operation_timeout=30).values() if names else ():
            fut.result(timeout=30)
    except Exception as exc:  # disk space only: never fail a benchmark over it
        logger.warning("could not delete the topics of %s: %s", cfg.kafka.topic_prefix, exc)


def run_stack_cell(cell: StackCell, bootstrap: str, launch: LaunchOptions = LaunchOptions()) -> CellRun:
    """Run one cell on the broker at `bootstrap` and read it back; its checkpoints and topics are deleted after."""
    from streamtrain.stack.runner import LocalStack, StackError

    run_id = uuid.uuid4().hex[:6]
    settings = {"job": f"{cell.tag}-{run_id}-{cell.index}", "kafka.bootstrap_servers": bootstrap,
                "kafka.topic_prefix": f"{cell.tag[:3]}{run_id}c{cell.index}", **cell.settings,
                **dict(parse_assignment(s) for s in cell.extra_sets)}
    run_dir = cell.out.resolve()
    opts = replace(cell, out=run_dir, global_args=launch.argv(settings))
    stack = LocalStack(launch.config(settings), opts, say=lambda line: logger.info("%s", line))
    began = time.monotonic()
    try:
        report = stack.run()
    except StackError as exc:
        return CellRun(None, None, round(time.monotonic() - began, 1), run_dir, str(exc))
    finally:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # the model is not what a benchmark measures
        delete_topics(stack.cfg.model_copy(update={"kafka": stack.kafka}))
    error = "; ".join(stack.failures) or (None if stack.records is not None else "no records read back")
    return CellRun(report, stack.records, round(time.monotonic() - began, 1), run_dir, error)


class StreamsSetup(Record):
    """Device streams at rates drawn from a ScaDLES preset (with `seed`, which also seeds the data and the model), a
    coordinator planning them, the ranks' task, how often Kafka is read; logs and checkpoints in `work_dir`."""

    devices: int = 4
    seed: int = 0
    rate_preset: str = "S2"
    planner: str = "scadles"
    b_max: int = 12
    max_lag_samples: int = 512
    size_mean: float = 45.0
    size_dif: float = 15.0
    features: int = 16
    classes: int = 10
    sample_every_s: float = 0.5
    start_timeout_s: float = 240.0
    work_dir: Path | None = Field(default=None, exclude=True)

    def device_ids(self) -> list[str]:
        return [str(i) for i in range(self.devices)]

    def stream_rates(self) -> list[float]:
        """Each device's rate in samples/s, drawn from the preset with `seed` (identical in every run)."""
        from streamtrain.config.producer import RateConfig
        from streamtrain.producers.rates import sample_base_rates

        cfg = RateConfig.model_validate({"preset": self.rate_preset})
        rng = np.random.default_rng(self.seed)
        return [round(float(r), 1) for r in sample_base_rates(cfg, self.devices, rng)]

    def producer_sets(self, ids: Sequence[str], rates: Sequence[float], seed: int) -> dict[str, object]:
        """A producer process's settings for the streams `ids` at `rates`."""
        return {"producer.devices": len(ids), "producer.device_ids": list(ids), "producer.rate.rates": list(rates),
                "producer.seed": seed, "producer.size.kind": "normal" if self.size_dif > 0 else "fixed",
                "producer.size.mean": self.size_mean, "producer.size.dif": self.size_dif,
                "producer.synthetic.features": self.features, "producer.synthetic.classes": self.classes,
                "producer.duration_seconds": 0, "producer.tick_seconds": 0.01, "producer.metrics": False}

    def trainer_sets(self, **own: object) -> dict[str, object]:
        """The ranks' settings (CPU, gloo, one thread), with `own` (trainer settings by their short name) on top."""
        return {f"trainer.{k}": v for k, v in {
            "device": "cpu", "backend": "gloo", "torch_threads": 1, "num_features": self.features,
            "num_classes": self.classes, "plan_wait_seconds": 1.0, "data_wait_seconds": 0.5, "metrics": False,
            **own}.items()}

    def coordinator_sets(self, truncation: str, **own: object) -> dict[str, object]:
        """The coordinator's settings under `truncation`, with `own` (by their short name) on top."""
        return {f"coordinator.{k}": v for k, v in {
            "devices": self.device_ids(), "policy": self.planner, "truncation": truncation, "b_max": self.b_max,
            "seed": self.seed, **own}.items()}


def train_command(devices: Sequence[str], checkpoint_dir: Path) -> tuple[str, ...]:
    """`train` for `devices`: one rank process when there is one device, else `--local-ranks N` (a launcher)."""
    if len(devices) == 1:
        return ("train", "--device-id", devices[0], "--checkpoint-dir", str(checkpoint_dir))
    return ("train", "--local-ranks", str(len(devices)), "--devices", ",".join(devices), "--checkpoint-dir",
            str(checkpoint_dir))


#: The package each kind of service runs from (the others from the package of their own name).
_MODULES = {"producer": "producers", "requests": "serve"}


class Services(ChildSet):
    """A benchmark's own service processes on one topic prefix and job, each logging to `log_dir/<name>.log`."""

    def __init__(self, kafka: KafkaConfig, job: str, log_dir: Path, launch: LaunchOptions,
                 devices: Sequence[str]) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        for stale in log_dir.glob("*.log"):  # a reused directory starts with fresh logs
            stale.unlink()
        super().__init__(log_dir, [])
        self.launch = launch
        self.common: dict[str, object] = {"job": job, "kafka.bootstrap_servers": kafka.bootstrap_servers,
                                          "kafka.topic_prefix": kafka.topic_prefix, "metrics.port": 0}
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "160", "OMP_NUM_THREADS": "1"}
        # The device topics first: the trainers need them to exist before they start.
        ensure_topics(make_admin(kafka), [TopicSpec.from_config(kafka, kafka.topics.device(d)) for d in devices])

    def start(self, name: str, kind: str, *command: str, settings: Mapping[str, object]) -> Child:
        """Start `streamtrain <command>` of the service `kind` as `name`, with the shared settings and `settings`."""
        module = f"streamtrain.{_MODULES.get(kind, kind)}"
        argv = self.launch.command(module, *command, settings={**self.common, **settings})
        return self.spawn(ServiceSpec(name, kind, argv, ()), self.env)

    def check(self, deadline: float | None = None, what: str = "") -> None:
        """Raise `RuntimeError` when a service died on its own (with its log's tail), or with `what` past `deadline`."""
        if dead := [c for c in self.children if not c.running() and not c.stopped_by_us]:
            child = dead[0]
            raise RuntimeError(f"{child.name} exited with status {child.returncode}; last lines of {child.log_path}:\n"
                               f"{child.log_tail()}")
        if deadline is not None and time.monotonic() > deadline:
            raise RuntimeError(what)

    def await_ranks(self, reported: Callable[[], set[str]], devices: Sequence[str], timeout_s: float) -> None:
        """Wait until every one of `devices` has reported a step (`reported()`: the devices that have)."""
        deadline = time.monotonic() + timeout_s
        while not set(devices) <= reported():
            self.check(deadline, f"the trainer ranks did not report a step within {timeout_s:.0f} s; see "
                                 f"{self.log_dir / 'trainers.log'}")
            time.sleep(0.2)

    def stop(self, name: str, signum: int = signal.SIGTERM, grace: float = 60.0) -> None:
        """Stop the service `name` with `signum`, killing it after `grace` seconds."""
        for child in [c for c in self.children if c.name == name and c.running()]:
            child.stop(signum, grace)

    def stop_all(self) -> None:
        """Producers (SIGINT), then trainers, requests, serve and coordinators (SIGTERM); then kill what is left."""
        for kind, signum in (("producer", signal.SIGINT), ("trainer", signal.SIGTERM), ("requests", signal.SIGTERM),
                             ("serve", signal.SIGTERM), ("coordinator", signal.SIGTERM)):
            self.stop_kind(kind, signum, 60.0)
        self.kill_all()

    def pids(self) -> dict[str, int]:
        """Name → pid of every running child."""
        return {c.name: c.pid for c in self.children if c.running() and c.pid is not None}


def rss_tree(pid: int) -> dict[int, int]:
    """Resident memory in bytes of `pid` and every descendant (pid → bytes); {} when it is gone."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return {}
    out: dict[int, int] = {}
    for proc in tree:
        with contextlib.suppress(psutil.Error):  # a child may exit while it is read
            out[proc.pid] = proc.memory_info().rss
    return out


def watermarks(consumer: Any, kafka: KafkaConfig, devices: Sequence[str], timeout: float = 10.0
               ) -> dict[str, tuple[int, int]]:
    """Per device: (log start offset, high watermark) summed over its topic's partitions."""
    out: dict[str, tuple[int, int]] = {}
    for device in devices:
        topic = kafka.topics.device(device)
        meta = list_topics(consumer, timeout, topic).topics.get(topic)
        if meta is not None and meta.error is None:
            marks = [kafka_watermarks(consumer, TopicPartition(topic, p), timeout) for p in meta.partitions]
            out[device] = (sum(lo for lo, _ in marks), sum(hi for _, hi in marks))
    return out


def assign_topic(consumer: Any, topic: str, offset: int) -> bool:
    """Assign every partition of `topic` from `offset` (OFFSET_BEGINNING / OFFSET_END); False while it does not exist
    yet (a topic its first writer creates)."""
    meta = list_topics(consumer, 5.0, topic).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        return False
    consumer.assign([TopicPartition(topic, p, offset) for p in meta.partitions])
    return True


class FeedbackTail:
    """Every `StepFeedback` of `job` on the feedback topic, from its beginning (the topic may appear later)."""

    def __init__(self, kafka: KafkaConfig, job: str) -> None:
        self.job = job
        self.topic = kafka.topics.feedback
        self.consumer = make_consumer(kafka, f"st-bench-feedback-{os.getpid()}-{time.monotonic_ns()}",
                                      **{"enable.auto.commit": "false"})
        self.assigned = False
        self.latest: dict[str, StepFeedback] = {}
        """Each device's latest feedback read."""

    def poll(self, budget_s: float = 0.2) -> list[StepFeedback]:
        self.assigned = self.assigned or assign_topic(self.consumer, self.topic, OFFSET_BEGINNING)
        if not self.assigned:
            return []
        out: list[StepFeedback] = []
        deadline = time.monotonic() + budget_s
        while time.monotonic() < deadline and (msgs := consume_available(self.consumer, 500, 0.05)):
            for msg in (m for m in msgs if m.error() is None):  # end-of-partition events, transient errors
                with contextlib.suppress(WireError):
                    fb = decode(msg.value(), msg.headers(), StepFeedback)
                    if fb.job == self.job:
                        out.append(fb)
        self.latest.update((fb.device_id, fb) for fb in out)
        return out

    def reporting(self) -> set[str]:
        """Read what is new; the devices that have reported a step so far."""
        self.poll()
        return set(self.latest)

    def close(self) -> None:
        with contextlib.suppress(KafkaException, RuntimeError):
            self.consumer.close()
