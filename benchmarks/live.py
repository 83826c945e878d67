"""What the live benchmarks (`truncation`, `soak`) share: a broker, the services as CLI processes, probes.

The services are the ordinary `streamtrain produce | coordinate | train` commands, each in its own
session (`stack.procs.Child`), started with the parent's `--config` / `--set` options followed by
the benchmark's own `--set` overrides (`common.LaunchOptions.command`). While they run, the
benchmark reads what Kafka itself says: every device topic's log start offset and high watermark
(records the broker retains), the trainers' `StepFeedback` records (step, loss, trainer buffer
depth, samples dropped by truncation), and the resident memory of every process from `/proc` (Linux).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from stack.procs import Child
from stack.services import ServiceSpec
from streamtrain.broker import BrokerError, EmbeddedBroker
from streamtrain.config import KafkaConfig, StreamtrainConfig
from streamtrain.kafka import TopicSpec, consume_available, ensure_topics, list_topics, make_admin, make_consumer
from streamtrain.wire import StepFeedback, WireError, decode

__all__ = ["FeedbackTail", "LiveBroker", "Services", "ensure_device_topics", "live_broker", "rss_tree", "train_command",
           "watermarks"]

logger = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class LiveBroker:
    """The broker a benchmark runs on: its Kafka settings and, when embedded, the JVM's pid."""

    kafka: KafkaConfig
    pid: int | None
    embedded: bool
    heap_mb: float | None = None
    """The embedded broker's Java heap limit (-Xmx) in MiB."""


@contextlib.contextmanager
def live_broker(cfg: StreamtrainConfig, external: bool, tag: str) -> Iterator[LiveBroker]:
    """A private embedded broker (in a temporary directory), or the configured one with a fresh topic prefix.

    Raises:
        RuntimeError: the embedded broker did not start, or no broker answers at the configured address.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if external:
        settings = cfg.kafka.security_settings()
        if not EmbeddedBroker.answers(cfg.kafka.bootstrap_servers, timeout=10.0, settings=settings):
            raise RuntimeError(f"no Kafka broker answers at {cfg.kafka.bootstrap_servers} (kafka.bootstrap_servers)")
        prefix = f"{cfg.kafka.topic_prefix}.{tag}-{stamp}-{os.getpid()}"
        yield LiveBroker(cfg.kafka.model_copy(update={"topic_prefix": prefix}), None, False)
        return
    with tempfile.TemporaryDirectory(prefix=f"st-{tag}-") as tmp:
        broker = EmbeddedBroker(cfg.broker.model_copy(update={"data_dir": Path(tmp) / "kafka", "port": 0,
                                                               "controller_port": 0}))
        try:
            bootstrap = broker.start()
        except BrokerError as exc:
            raise RuntimeError(f"the embedded Kafka broker did not start: {exc}") from None
        try:
            kafka = cfg.kafka.model_copy(update={"bootstrap_servers": bootstrap,
                                                 "topic_prefix": f"{cfg.kafka.topic_prefix}.{tag}"})
            yield LiveBroker(kafka, broker.pid(), True, cfg.broker.heap_mb)
        finally:
            broker.stop()


def train_command(devices: Sequence[str], checkpoint_dir: Path) -> tuple[str, ...]:
    """`train` for `devices`: one rank process when there is one device, else `--local-ranks N` (a launcher)."""
    if len(devices) == 1:
        return ("train", "--device-id", devices[0], "--checkpoint-dir", str(checkpoint_dir))
    return ("train", "--local-ranks", str(len(devices)), "--devices", ",".join(devices), "--checkpoint-dir",
            str(checkpoint_dir))


class Services:
    """The benchmark's child processes, each logging to `log_dir/<name>.log`."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        for stale in log_dir.glob("*.log"):  # a reused --out starts with fresh logs
            stale.unlink()
        self.children: dict[str, Child] = {}
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "160", "OMP_NUM_THREADS": "1"}

    def start(self, name: str, kind: str, argv: Sequence[str]) -> Child:
        child = Child(ServiceSpec(name, kind, tuple(argv), ()), self.log_dir, self.env)
        child.start()
        self.children[name] = child
        return child

    def dead(self) -> list[Child]:
        """Children that exited although nobody stopped them."""
        return [c for c in self.children.values() if not c.running() and not c.stopped_by_us]

    def stop(self, name: str, signum: int = signal.SIGTERM, grace: float = 60.0) -> int | None:
        child = self.children.get(name)
        if child is None:
            return None
        return child.stop(signum, grace) if child.running() else child.returncode

    def stop_all(self) -> None:
        """Producers (SIGINT), then trainers, the request load, serve and coordinators (SIGTERM); anything left is
        killed."""
        for kind, signum in (("producer", signal.SIGINT), ("trainer", signal.SIGTERM), ("requests", signal.SIGTERM),
                             ("serve", signal.SIGTERM), ("coordinator", signal.SIGTERM)):
            for name, child in list(self.children.items()):
                if child.spec.kind == kind and child.running():
                    self.stop(name, signum, 60.0)
        for child in self.children.values():
            if child.running():
                child.kill()
            child.close()

    def pids(self) -> dict[str, int]:
        """Name → pid of every running child."""
        return {name: c.pid for name, c in self.children.items() if c.running() and c.pid is not None}

    def failure(self, child: Child) -> str:
        return (f"{child.name} exited with status {child.returncode}; last lines of {child.log_path}:\n"
                f"{child.log_tail()}")


# ---------------------------------------------------------------------------------------------
# Probes


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                out += [int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return out


def _rss(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def rss_tree(pid: int) -> dict[int, int]:
    """Resident memory in bytes of `pid` and every descendant (pid → bytes), from /proc; {} when it is gone."""
    out: dict[int, int] = {}
    stack = [pid]
    while stack:
        p = stack.pop()
        rss = _rss(p)
        if rss is None:
            continue
        out[p] = rss
        stack += _children(p)
    return out


def ensure_device_topics(kafka: KafkaConfig, devices: Sequence[str]) -> None:
    """Create the device topics up front (the trainers need them to exist before they start)."""
    admin = make_admin(kafka)
    ensure_topics(admin, [TopicSpec.from_config(kafka, kafka.topics.device(d)) for d in devices])


def watermarks(consumer: Any, kafka: KafkaConfig, devices: Sequence[str], timeout: float = 10.0
               ) -> dict[str, tuple[int, int]]:
    """Per device: (log start offset, high watermark) summed over its topic's partitions."""
    out: dict[str, tuple[int, int]] = {}
    for device in devices:
        topic = kafka.topics.device(device)
        meta = list_topics(consumer, timeout, topic).topics.get(topic)
        if meta is None or meta.error is not None:
            continue
        low = high = 0
        for pid in meta.partitions:
            lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, pid), timeout=timeout)
            low, high = low + lo, high + hi
        out[device] = (low, high)
    return out


class FeedbackTail:
    """Every `StepFeedback` of `job` on the feedback topic, from its beginning (the topic may appear later)."""

    def __init__(self, kafka: KafkaConfig, job: str) -> None:
        self.kafka = kafka
        self.job = job
        self.topic = kafka.topics.feedback
        self.consumer = make_consumer(kafka, f"st-bench-feedback-{os.getpid()}-{time.monotonic_ns()}",
                                      **{"enable.auto.commit": "false"})
        self.assigned = False

    def _assign(self) -> bool:
        meta = list_topics(self.consumer, 5.0, self.topic).topics.get(self.topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return False
        self.consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in meta.partitions])
        self.assigned = True
        return True

    def poll(self, budget_s: float = 0.2) -> list[StepFeedback]:
        if not self.assigned and not self._assign():
            return []
        out: list[StepFeedback] = []
        deadline = time.monotonic() + budget_s
        while time.monotonic() < deadline:
            msgs = consume_available(self.consumer, 500, 0.05)
            if not msgs:
                break
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        logger.debug("feedback read: %s", err)
                    continue
                try:
                    fb = decode(msg.value(), msg.headers(), StepFeedback)
                except WireError:
                    continue
                if fb.job == self.job:
                    out.append(fb)
        return out

    def close(self) -> None:
        with contextlib.suppress(KafkaException, RuntimeError):
            self.consumer.close()
