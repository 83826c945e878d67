"""`ModelServer`: requests in, predictions out, each made by the newest model version that passed the gate.

The loop, between batches: read the announcements on `<prefix>.models` that arrived (a version switch
happens only here, never inside a batch); then take a batch of requests from `<prefix>.requests`, answer each
(`answers.answer_batch`), send the predictions to `<prefix>.predictions`, wait until Kafka has them all, and only
then commit the requests' offsets. A request is therefore never dropped (its offset is committed after its
answer is delivered) and, while serve runs, never answered twice; a serve that is killed between a delivery
and its commit answers those requests again when it restarts (at least once).

An announced version is loaded from its files (`streamtrain.load_model`) and must fit serve's settings
(`gate.misfit`) and pass the promotion gate against the live version (`gate.judge`); otherwise the live
version stays and the log says why, with the figures or the field. Until some version is live, requests wait in
Kafka. Nothing serve keeps grows with the requests it answers: one live model, counters, and the produced_at
histogram of the samples waiting for their first served version (bounded bins).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from prometheus_client import CollectorRegistry

from streamtrain.config import StreamtrainConfig
from streamtrain.kafka import (
    TopicSpec,
    consume_available,
    ensure_topics,
    make_admin,
    make_consumer,
    make_producer,
    produce,
    read_to_end,
    tail_positions,
)
from streamtrain.metrics import serve_metrics
from streamtrain.versions import Predictor, VersionError, load_model
from streamtrain.versions.freshness import ProducedHistogram
from streamtrain.wire import ModelVersion, Prediction, WireError, decode, encode, now_ms

from .answers import RefusalTally, answer_batch
from .broker import PROBE_EVERY_S, BrokerWatch, quiet_connection_failures
from .gate import GateVerdict, judge, misfit
from .metrics import ServeMetrics

__all__ = ["ModelServer"]

logger = logging.getLogger(__name__)

#: Seconds a batch's predictions get to reach Kafka before serve says so (it keeps waiting: nothing is skipped).
DELIVERY_WARN_S = 30.0
#: Longest wait for a batch's first request: between two such waits the loop reads the announcements, so a new
#: version goes live within this much of its announcement when no request comes.
FIRST_REQUEST_WAIT_S = 0.02


@dataclass(frozen=True)
class LiveVersion:
    """The version answering requests, and its announcement."""

    predictor: Predictor
    announced: ModelVersion
    since: float
    """time.monotonic() when it took over."""


class ModelServer:
    """The serve service of one job.

    Args:
        config: The whole configuration (Kafka, job, serve, the trainer settings requests must fit).
        registry: Prometheus registry (a fresh one when not given).
    """

    def __init__(self, config: StreamtrainConfig, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.settings = config.serve
        self.topics = config.kafka.topics
        self.metrics = ServeMetrics(registry if registry is not None else CollectorRegistry(), config.job)
        self.live: LiveVersion | None = None
        self.pending = ProducedHistogram()
        """Samples trained by announced versions that no served version has answered with yet (freshness)."""
        self._first_answer_due = False
        self._gate_refusals: dict[tuple[str | None, int | None, float | None], int] = {}
        """The figure (metric, step measured, value) the last gate refusal was on, and the first version it refused."""
        self.running = True
        self.port: int | None = None
        self.answered = 0
        self.refusals = RefusalTally()
        """Requests answered with an error, told in the log at most every 10 s."""
        self._failed_deliveries = 0
        if self.settings.torch_threads:
            torch.set_num_threads(self.settings.torch_threads)
        self.broker = BrokerWatch(config.kafka.bootstrap_servers, self.settings.broker_timeout_seconds)
        quiet_connection_failures()  # the watch tells an outage once, not librdkafka at every reconnect
        watched = {"error_cb": self.broker.on_error}
        self.producer = make_producer(config.kafka, **{"linger.ms": 0}, **watched)
        self.requests = make_consumer(config.kafka, config.serve_group_id, **watched)
        self.models = make_consumer(config.kafka, f"{config.serve_group_id}.models", **watched)
        self._subscribed = False

    # ---- life cycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Create the topics serve uses, serve /metrics, and take the newest announced version that loads."""
        # Only the topics serve reads or writes: with ACLs on, a topic its role may not see looks missing, and
        # creating it is refused.
        names = [self.topics.requests, self.topics.predictions, self.topics.models]
        ensure_topics(make_admin(self.config.kafka), [TopicSpec.from_config(self.config.kafka, n) for n in names])
        self.port = serve_metrics(self.metrics.registry, self.config.metrics.bind_address, self.config.metrics.port)
        ends = tail_positions(self.models, self.topics.models, None, 30.0)
        announced = [a for a in (self._decode(m) for m in read_to_end(self.config.kafka, [self.topics.models]))
                     if a is not None]
        for record in sorted(announced, key=lambda a: a.version, reverse=True):
            if self._consider(record, catching_up=True):
                break
        self.pending.clear()  # what earlier runs of serve answered is not this one's to measure
        self.models.assign([TopicPartition(self.topics.models, p, high) for p, (_low, high) in ends.items()])
        logger.info("serve: %s; metrics on http://%s:%d/metrics",
                    f"version {self.live.predictor.version} live" if self.live else "no version yet: requests wait",
                    self.config.metrics.bind_address, self.port)

    def stop(self) -> None:
        """Finish the batch in hand, then return from `run` (signal-handler safe)."""
        self.running = False

    def run(self) -> None:
        """Answer requests until `stop`."""
        try:
            while self.running:
                self.broker.check(self._broker_answers)
                self._poll_models(0.0 if self.live is not None else 0.2)
                if self.live is None:
                    continue
                if not self._subscribed:
                    self.requests.subscribe([self.topics.requests])
                    self._subscribed = True
                self._serve_batch()
                self.metrics.version_age.set(max(0.0, time.time() - self.live.announced.created_at / 1000.0))
        finally:
            self.close()

    def close(self) -> None:
        """Deliver what is in flight, leave the group, close the clients (idempotent)."""
        refused = self.refusals.report(force=True)
        if refused is not None:
            logger.warning("%s", refused)
        left = self.producer.flush(30)
        if left:
            logger.error("%d predictions not delivered at shutdown: their requests stay uncommitted", left)
        for consumer in (self.requests, self.models):
            with contextlib.suppress(RuntimeError, KafkaException):  # closed already, or Kafka is gone
                consumer.close()
        quiet_connection_failures(False)

    def _broker_answers(self) -> bool:
        """Whether a broker answers a metadata request now."""
        try:
            self.producer.list_topics(self.topics.requests, timeout=1.0)
        except KafkaException:
            return False
        return True

    # ---- versions -----------------------------------------------------------------------------------

    def _decode(self, msg: Message) -> ModelVersion | None:
        try:
            return decode(msg.value(), msg.headers(), ModelVersion)
        except WireError as exc:
            logger.warning("serve: announcement at %s[%s]@%s is not a ModelVersion (%s): ignored", msg.topic(),
                           msg.partition(), msg.offset(), exc)
            self.metrics.reject("unreadable")
            return None

    def _poll_models(self, timeout: float) -> None:
        """Take the announcements that have arrived: the newest that passes goes live at once, and an older one it
        supersedes is never loaded (its samples wait for the version that goes live, as they would have)."""
        announced: list[ModelVersion] = []
        for msg in consume_available(self.models, 16, timeout):
            err = msg.error()
            if err is not None:
                self._check(err)
                continue
            record = self._decode(msg)
            if record is not None:
                announced.append(record)
        live = self.live.predictor.version if self.live is not None else -1
        newer = sorted((a for a in announced if a.version > live), key=lambda a: a.version, reverse=True)
        for record in newer:
            self._count_pending(record)
        for record in newer:
            if self._consider(record, counted=True):
                return

    def _location(self, record: ModelVersion) -> Path:
        """Where the version's files are: as announced, or by its name under `versions.dir` when this host mounts
        the model directory elsewhere."""
        path = Path(record.location)
        root = self.config.versions.dir
        if not path.exists() and root is not None and (root / path.name).exists():
            return root / path.name
        return path

    def _count_pending(self, record: ModelVersion) -> None:
        """The version's samples wait for the first served version that has them."""
        for device in record.lineage:
            self.pending.add_counts(device.new_samples, record.produced_at_resolution_ms)

    def _consider(self, record: ModelVersion, catching_up: bool = False, counted: bool = False) -> bool:
        """Load, check and judge an announced version (its samples counted as waiting unless `counted` already);
        switch to it when it passes. Returns whether it did."""
        live = self.live
        if live is not None and record.version <= live.predictor.version:
            return False  # announced again, or older than what is live
        if not counted:
            self._count_pending(record)
        try:
            predictor = load_model(self._location(record))
        except VersionError as exc:
            return self._reject("unreadable", record, f"its files cannot be read: {exc}", catching_up)
        problem = misfit(predictor.spec, self.config)
        if problem is not None:
            return self._reject("misfit", record, f"it does not fit serve's settings: {problem}", catching_up)
        verdict = judge(predictor.spec.metrics, live.predictor.spec.metrics if live else None, self.settings,
                        predictor.spec.objective)
        if not verdict.passed:
            return self._refuse_by_gate(record, verdict, catching_up)
        self.live = LiveVersion(predictor, record, time.monotonic())
        self._first_answer_due = True
        self.metrics.version.set(record.version)
        self.metrics.version_step.set(record.step)
        self.metrics.switches.inc()
        logger.info("serve: version %d (step %d) takes over from %s: %s", record.version, record.step,
                    f"version {live.predictor.version}" if live else "none", verdict.reason)
        return True

    def _refuse_by_gate(self, record: ModelVersion, verdict: GateVerdict, quiet: bool) -> bool:
        """Refuse a version the gate refused; one refused on the very figure an earlier one was (the same held-out
        evaluation, carried by every version until the next) is said so, once more quietly."""
        figure = (verdict.metric, verdict.measured_step, verdict.candidate)
        earlier = self._gate_refusals.get(figure)
        self._gate_refusals = {figure: earlier if earlier is not None else record.version}
        if earlier is None:
            return self._reject("gate", record, f"the promotion gate refused it: {verdict.reason}", quiet)
        return self._reject("gate", record, f"the promotion gate refused it on the same figure that refused version "
                            f"{earlier}: {verdict.reason}", True)

    def _reject(self, reason: str, record: ModelVersion, why: str, quiet: bool) -> bool:
        self.metrics.reject(reason)
        keeps = f"version {self.live.predictor.version} stays live" if self.live else "no version is live yet"
        (logger.info if quiet else logger.warning)("serve: version %d (step %d) not served, %s; %s", record.version,
                                                   record.step, why, keeps)
        return False

    # ---- requests -----------------------------------------------------------------------------------

    def _take_batch(self) -> list[Message]:
        batch: list[Message] = []
        deadline: float | None = None
        while len(batch) < self.settings.max_batch:
            wait = FIRST_REQUEST_WAIT_S if deadline is None else deadline - time.monotonic()
            if wait <= 0:
                break
            got = consume_available(self.requests, self.settings.max_batch - len(batch), wait)
            if not got:
                break
            for msg in got:
                err = msg.error()
                if err is not None:
                    self._check(err)
                else:
                    batch.append(msg)
            if batch and deadline is None:
                deadline = time.monotonic() + self.settings.batch_wait_seconds
            if sum(len(m.value() or b"") for m in batch) > 4 * self.settings.max_batch_size:
                break  # a few bytes per frame: enough for one forward pass
        return batch

    def _serve_batch(self) -> None:
        live = self.live
        assert live is not None
        batch = self._take_batch()
        if not batch:
            return
        answered = answer_batch(self.config.job, live.predictor, batch)
        self._deliver(answered.predictions)
        self._commit(batch)
        self.metrics.batch_seconds.set(answered.forward_seconds)
        for prediction in answered.predictions:
            self.metrics.requests.inc()
            if prediction.error is not None:
                self.metrics.error(prediction.error)
            if prediction.request_produced_at is not None:
                self.metrics.latency.observe(max(0.0, (prediction.answered_at - prediction.request_produced_at)
                                                 / 1000.0))
        self.answered += len(answered.predictions)
        self.refusals.count(answered.predictions)
        refused = self.refusals.report()
        if refused is not None:
            logger.warning("%s", refused)
        served = [p for p in answered.predictions if p.error is None]
        if self._first_answer_due and served:
            self.metrics.observe_freshness(self.pending.counts(), self.pending.resolution_ms, served[0].answered_at)
            self.pending.clear()
            self._first_answer_due = False

    def _deliver(self, predictions: list[Prediction]) -> None:
        """Send the predictions and wait until Kafka has every one (the requests' commit depends on it)."""
        failed_before = self._failed_deliveries
        for prediction in predictions:
            value, headers = encode(prediction)
            produce(self.producer, self.topics.predictions, value, headers, self._delivered,
                    f"{prediction.request_partition}:{prediction.request_offset}".encode())
        began = now_ms()
        while self.producer.flush(PROBE_EVERY_S):
            self.broker.check(self._broker_answers)  # gives up after serve.broker_timeout_seconds
            if self.broker.down_since is None and now_ms() - began > DELIVERY_WARN_S * 1000:
                logger.warning("serve: predictions not delivered after %.0f s; still waiting",
                               (now_ms() - began) / 1000.0)
                began = now_ms()
        if self._failed_deliveries != failed_before:
            # The idempotent producer gave up on some (delivery.timeout.ms): stop rather than commit past them.
            raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, "predictions could not be delivered; their "
                                            "requests stay uncommitted and are answered when serve restarts"))

    def _delivered(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self._failed_deliveries += 1
            logger.error("serve: a prediction could not be delivered: %s", err)

    def _commit(self, batch: list[Message]) -> None:
        ends: dict[tuple[str, int], int] = {}
        for msg in batch:
            key = (msg.topic() or "", msg.partition() or 0)
            ends[key] = max(ends.get(key, 0), (msg.offset() or 0) + 1)
        self.requests.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in ends.items()], asynchronous=False)

    def _check(self, err: KafkaError) -> None:
        if err.fatal():
            raise KafkaException(err)
        logger.debug("serve: consumer: %s", err)
