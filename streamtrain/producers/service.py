"""`StreamProducer`: publishes every device's stream to its own topic, paced from one loop.

Every sample goes out through `streamtrain.DeviceProducer`, the one path to the wire an application
uses too: one per device, all sharing one idempotent `acks=all` client, so librdkafka's retries
(while the broker is away, for up to `delivery_timeout_seconds`) never duplicate or reorder a
device's records. Delivery reports come back by callback, `poll(0)` every tick serves them, `flush`
at the end. A full local queue is backpressure: publishing waits for deliveries instead of dropping.
Every record that still fails is counted per device and reported.

A seq is given to a sample only once librdkafka has accepted it, so a device's seqs on its topic run
0, 1, 2, ... without gaps; a reader can check one producer's samples for gaps and repeats. The
pipeline's own accounting is by record offset and does not rely on it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from functools import partial

import numpy as np
from confluent_kafka import KafkaError, KafkaException, Producer
from prometheus_client import CollectorRegistry

from streamtrain.config import KafkaConfig, ProducerConfig
from streamtrain.datasets import Dataset, SkippedFile
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin, make_producer
from streamtrain.publish import Delivery, DeliveryCallback, DeviceProducer, QueueFullError
from streamtrain.wire import now_ms

from .injection import InjectionPlanner
from .metrics import ProducerMetrics
from .rates import Pacer, RateProfile, sample_base_rates
from .sources import Draft, SampleSource, build_source, device_rng

__all__ = ["DeliveryFailure", "ProducerError", "ProducerSnapshot", "ProducerSummary", "StreamProducer"]

logger = logging.getLogger(__name__)

_RATE_WINDOW_S = 5.0
_SYNC_EVERY_S = 0.5
_MAX_FAILURES_KEPT = 1000
#: How long one `DeviceProducer.send` waits for room before the loop checks for a stop and waits again.
_WAIT_SLICE_S = 0.05
_BROKER_DOWN = (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT)


class ProducerError(RuntimeError):
    """The run cannot go on (broker unreachable at start, fatal producer error)."""


@dataclass(frozen=True)
class DeliveryFailure:
    """One record that could not be delivered."""

    device: str
    seq: int
    error: str


@dataclass(frozen=True)
class ProducerSnapshot:
    """Per-device counters at one moment (arrays in device order)."""

    elapsed_s: float
    devices: list[str]
    target_rates: np.ndarray
    achieved_rates: np.ndarray
    produced: np.ndarray
    sent: np.ndarray
    sent_own: np.ndarray
    failed: np.ndarray
    injected: np.ndarray
    bytes_sent: np.ndarray
    queued: int
    broker_up: bool
    backpressure_waits: int


@dataclass(frozen=True)
class ProducerSummary:
    """What a run did: the final counters, rates over the whole run, and every problem met."""

    final: ProducerSnapshot
    base_rates: np.ndarray
    mean_rates: np.ndarray
    """Each device's own acknowledged samples per second over the whole run."""
    given_up: np.ndarray
    """Samples of stream each device gave up after stalls longer than rate.catch_up_seconds."""
    failures: list[DeliveryFailure] = field(default_factory=list)
    skipped_files: list[SkippedFile] = field(default_factory=list)
    stopped_by: str = "duration"

    @property
    def ok(self) -> bool:
        """Whether every produced record was delivered."""
        return int(self.final.failed.sum()) == 0


class StreamProducer:
    """Publishes one stream of samples per device to `<prefix>.device.<id>` at controlled rates.

    Args:
        kafka: how to reach Kafka and name topics.
        cfg: the producer settings.
        registry: Prometheus registry for the metrics (a fresh one when not given).
        source: where samples come from (built from `cfg` when not given).
    """

    def __init__(
        self,
        kafka: KafkaConfig,
        cfg: ProducerConfig,
        *,
        registry: CollectorRegistry | None = None,
        source: SampleSource | None = None,
    ) -> None:
        self.kafka = kafka
        self.cfg = cfg
        self.ids = cfg.ids()
        self.topics = [kafka.topics.device(d) for d in self.ids]
        n = len(self.ids)
        self.base_rates = sample_base_rates(cfg.rate, n, device_rng(cfg.seed, 0, 4))
        self.profile = RateProfile(cfg.rate, self.base_rates)
        self.pacer = Pacer(self.profile, cfg.rate.catch_up_seconds)
        self.dataset: Dataset | None = None
        if source is None:
            source, self.dataset = build_source(cfg)
        self.source = source
        self.injection = InjectionPlanner(cfg.injection, n, device_rng(cfg.seed, 0, 2))
        self.metrics = ProducerMetrics(registry if registry is not None else CollectorRegistry(), self.ids)
        if self.dataset is not None:
            self.metrics.skipped_files.set(len(self.dataset.skipped))
        self.next_seq = np.zeros(n, dtype=np.int64)
        self.own = np.zeros(n, dtype=np.int64)
        self.injected = np.zeros(n, dtype=np.int64)
        self.sent = np.zeros(n, dtype=np.int64)
        self.sent_own = np.zeros(n, dtype=np.int64)
        self.failed = np.zeros(n, dtype=np.int64)
        self.bytes_sent = np.zeros(n, dtype=np.int64)
        self.size_sent = np.zeros(n, dtype=np.int64)
        self.failures: list[DeliveryFailure] = []
        self.broker_up = True
        self._fatal: KafkaError | None = None
        self._producer: Producer | None = None
        self._devices: list[DeviceProducer] = []
        self._reports: dict[bool, list[DeliveryCallback]] = {}
        self._t0 = time.monotonic()
        self._started = False
        self._loop_s: float | None = None
        self._history: deque[tuple[float, np.ndarray]] = deque()
        self._synced: dict[str, np.ndarray] = {}
        self._synced_waits = 0
        self.stop_event = threading.Event()
        self.stop_reason = "stop"

    def request_stop(self, reason: str = "stop") -> None:
        """End the run at the next tick (thread- and signal-safe); `reason` becomes the summary's `stopped_by`."""
        self.stop_reason = reason
        self.stop_event.set()

    # ---- running -------------------------------------------------------------------------

    def ensure_topics(self, timeout: float = 30.0) -> None:
        """Create the device topics that do not exist yet.

        Raises:
            ProducerError: when the broker cannot be reached or refuses.
        """
        try:
            ensure_topics(make_admin(self.kafka), [TopicSpec.from_config(self.kafka, t) for t in self.topics], timeout)
        except KafkaException as exc:
            raise ProducerError(f"cannot create device topics on {self.kafka.bootstrap_servers}: {exc}") from None

    def run(self, stop: threading.Event | None = None) -> ProducerSummary:
        """Publish until the duration, max_samples, the end of every stream, or `stop` is set.

        Returns:
            The run's summary (also when stopped early); failed deliveries are in it, not raised.

        Raises:
            ProducerError: when topics cannot be created or the producer fails fatally.
        """
        stop = stop or self.stop_event
        if self.cfg.create_topics:
            self.ensure_topics()
        self._open()
        stopped_by = "duration"
        try:
            stopped_by = self._loop(stop)
        except KeyboardInterrupt:
            stopped_by = "interrupt"
        finally:
            self._loop_s = time.monotonic() - self._t0
            self._finish()
        if self._fatal is not None:
            raise ProducerError(f"the producer failed fatally: {self._fatal.str()}")
        return self.summary(stopped_by)

    def _open(self) -> None:
        """One client for every device, and a `DeviceProducer` per device sending through it."""
        settings = {"delivery.timeout.ms": int(self.cfg.delivery_timeout_seconds * 1000), "error_cb": self._on_error,
                    **self.cfg.client}
        self._producer = make_producer(self.kafka, **settings)
        self._devices = [DeviceProducer(self.kafka, device=dev, client=self._producer, queue_wait_seconds=_WAIT_SLICE_S)
                         for dev in self.ids]
        self._reports = {injected: [partial(self._delivered, d, injected) for d in range(len(self.ids))]
                         for injected in (False, True)}

    def _loop(self, stop: threading.Event) -> str:  # noqa: C901  the pacing loop's tick: each branch a stop condition or a backpressure case
        cfg = self.cfg
        producer = self._producer
        assert producer is not None
        n = len(self.ids)
        active = np.ones(n, dtype=bool)
        self._t0 = time.monotonic()
        self._started = True
        self.pacer.start(0.0)
        last_sync = -1.0
        while True:
            t = time.monotonic() - self._t0
            if stop.is_set():
                return self.stop_reason
            if self._fatal is not None:
                return "fatal error"
            if cfg.duration_seconds is not None and t >= cfg.duration_seconds:
                return "duration"
            for d in np.flatnonzero(active):
                reached = cfg.max_samples is not None and self.own[d] >= cfg.max_samples
                if reached or self.source.exhausted(int(d)):
                    active[d] = False
            if not active.any():
                return "max_samples" if cfg.max_samples is not None else "end of data"
            due = self.pacer.due(t, active)
            if cfg.max_samples is not None:
                due = np.minimum(due, cfg.max_samples - self.own)
            now = now_ms()
            for dev in np.flatnonzero(due > 0):
                for draft in self.source.take(int(dev), int(due[dev])):
                    if not self._publish(int(dev), draft, now, stop):
                        return self.stop_reason
            producer.poll(0)
            if t - last_sync >= _SYNC_EVERY_S:
                self._sync_metrics(t)
                last_sync = t
            pause = cfg.tick_seconds - (time.monotonic() - self._t0 - t)
            if pause > 0:
                time.sleep(pause)

    def _publish(self, d: int, draft: Draft, now: int, stop: threading.Event) -> bool:
        if not self._send(d, draft, draft.metadata, now, stop, injected=False):
            return False
        self.own[d] += 1
        targets = self.injection.targets(d)
        if len(targets):
            origin = {**draft.metadata, "injected_from": self.ids[d], "origin_seq": str(self.next_seq[d] - 1)}
            for r in targets:
                if not self._send(int(r), draft, origin, now, stop, injected=True):
                    return False
                self.injected[r] += 1
        return True

    def _send(self, d: int, draft: Draft, metadata: dict[str, str], now: int, stop: threading.Event, *,
              injected: bool) -> bool:
        device = self._devices[d]
        while True:
            try:
                seq = device.send(draft.array, label=draft.label, target=draft.target, metadata=metadata,
                                  produced_at=now, on_delivery=self._reports[injected][d])
                break
            except QueueFullError:
                # Backpressure: the shared queue is full (broker slow or away). Wait on, in slices, until stopped.
                if stop.is_set() or self._fatal is not None:
                    return False
        self.next_seq[d] = seq + 1
        return True

    def _delivered(self, d: int, injected: bool, delivery: Delivery) -> None:
        if delivery.ok:
            self.sent[d] += 1
            if not injected:
                self.sent_own[d] += 1
            self.bytes_sent[d] += delivery.nbytes
            self.size_sent[d] += delivery.size
            if not self.broker_up:
                self.broker_up = True
                logger.warning("broker reachable again: deliveries resumed")
            return
        self.failed[d] += 1
        if len(self.failures) < _MAX_FAILURES_KEPT:
            self.failures.append(DeliveryFailure(delivery.device, delivery.seq, delivery.error or ""))

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._fatal = err
            logger.error("fatal producer error: %s", err.str())
        elif err.code() in _BROKER_DOWN:
            if self.broker_up:
                logger.warning("broker unreachable (%s): records wait in the local queue and are retried "
                               "for up to %.0f s", err.str(), self.cfg.delivery_timeout_seconds)
            self.broker_up = False
        else:
            logger.info("producer: %s", err.str())

    def _finish(self) -> None:
        producer = self._producer
        if producer is None:
            return
        left = producer.flush(self.cfg.flush_timeout_seconds)
        if left:
            logger.error("%d records still undelivered after %.0f s; they are counted as failed", left,
                         self.cfg.flush_timeout_seconds)
            producer.purge()  # their delivery callbacks report them as failed
            producer.flush(5.0)
        self._sync_metrics(time.monotonic() - self._t0)

    @property
    def backpressure_waits(self) -> int:
        """Times a send found the local queue full and waited (~50 ms each)."""
        return sum(device.queue_waits for device in self._devices)

    def wait_started(self, timeout: float = 60.0) -> bool:
        """Block until `run` has started pacing (topics created, producer built); False on timeout."""
        deadline = time.monotonic() + timeout
        while not self._started and time.monotonic() < deadline:
            time.sleep(0.01)
        return self._started

    # ---- observing -----------------------------------------------------------------------

    def _achieved(self, t: float) -> np.ndarray:
        self._history.append((t, self.sent_own.copy()))
        while len(self._history) > 2 and self._history[1][0] <= t - _RATE_WINDOW_S:
            self._history.popleft()
        t_old, old = self._history[0]
        return (self.sent_own - old) / (t - t_old) if t > t_old else np.zeros(len(self.ids))

    def _sync_metrics(self, t: float) -> None:
        m = self.metrics
        achieved = self._achieved(t)
        targets = self.profile.rates(t)
        counters = {"sent": (m.sent, self.sent), "failed": (m.failed, self.failed),
                    "injected": (m.injected, self.injected), "bytes": (m.bytes_sent, self.bytes_sent),
                    "size": (m.size_sent, self.size_sent)}
        for key, (metric, values) in counters.items():
            now = values.copy()
            delta = now - self._synced.get(key, np.zeros_like(now))
            self._synced[key] = now
            for i in np.flatnonzero(delta):
                metric.labels(device=self.ids[i]).inc(int(delta[i]))
        for d, dev in enumerate(self.ids):
            m.target_rate.labels(device=dev).set(float(targets[d]) if np.isfinite(targets[d]) else -1.0)
            m.achieved_rate.labels(device=dev).set(float(achieved[d]))
        m.queued.set(len(self._producer) if self._producer is not None else 0)
        m.broker_up.set(1 if self.broker_up else 0)
        m.backpressure.inc(self.backpressure_waits - self._synced_waits)
        self._synced_waits = self.backpressure_waits

    def snapshot(self) -> ProducerSnapshot:
        """The counters now (safe to call from another thread, e.g. a progress display)."""
        t = time.monotonic() - self._t0 if self._started else 0.0
        hist = list(self._history)
        achieved = np.zeros(len(self.ids))
        if hist and t > hist[0][0]:
            achieved = (self.sent_own - hist[0][1]) / (t - hist[0][0])
        return ProducerSnapshot(
            elapsed_s=t, devices=self.ids, target_rates=self.profile.rates(t), achieved_rates=achieved,
            produced=self.own + self.injected, sent=self.sent.copy(), sent_own=self.sent_own.copy(),
            failed=self.failed.copy(), injected=self.injected.copy(), bytes_sent=self.bytes_sent.copy(),
            queued=len(self._producer) if self._producer is not None else 0, broker_up=self.broker_up,
            backpressure_waits=self.backpressure_waits,
        )

    def summary(self, stopped_by: str = "duration") -> ProducerSummary:
        """The summary of the run so far."""
        final = self.snapshot()
        elapsed = max(self._loop_s if self._loop_s is not None else final.elapsed_s, 1e-9)
        return ProducerSummary(
            final=final, base_rates=self.base_rates.copy(), mean_rates=final.sent_own / elapsed,
            given_up=np.floor(self.pacer.given_up).astype(np.int64), failures=list(self.failures),
            skipped_files=list(self.dataset.skipped) if self.dataset is not None else [], stopped_by=stopped_by,
        )
