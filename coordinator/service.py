"""`Coordinator`: the live service that turns trainers' feedback into the next step's plan.

One loop (confluent-kafka style: poll, check the error, process): feedback in, offsets and
arrival rates polled every `poll_interval_seconds`, and as soon as every device reported step t
(or `feedback_wait_seconds` after the first did) the plan for step t+1+`plan_ahead` is built by the
same `plan_step` the simulator runs and published on the assignments topic. With plans one step
ahead (the default) that is the plan for t+2, made while step t+1 runs, so the ranks find it there
when they need it instead of waiting for a round trip through Kafka at every step boundary.
Trainers never wait for a plan beyond their own bounded wait. Before any feedback exists, as soon
as the devices and their lag are known, the plans for step 0 (and, one step ahead, step 1) are
published from the warm-start models, so the first steps do not fall back to local plans either.

It keeps no state that Kafka cannot give back: on start it re-reads the tail of the assignments
and feedback topics, replays each plan after the feedback it was made from, and resumes with the
plan after the last one published, or the step after the last feedback when that is later.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Any

import numpy as np
from confluent_kafka import KafkaError, KafkaException, Message
from prometheus_client import CollectorRegistry

from streamtrain.config import StreamtrainConfig
from streamtrain.kafka import DeadLetterSink, TopicSpec, ensure_topics, make_admin, make_consumer, make_control_producer
from streamtrain.periods import split_wall_period
from streamtrain.wire import Assignment, StepFeedback, WireError, decode, encode, now_ms

from .balance import dif, straggler_effect
from .feedback_checks import feedback_problem
from .fleet import FleetTracker
from .inputs import FeedbackReader, OffsetProbe, read_tail
from .metrics import CoordinatorMetrics
from .policies import plan_step
from .state import plan_to_assignment
from .status import StatusServer

__all__ = ["Coordinator"]

logger = logging.getLogger(__name__)

_STATUS_EVERY_S = 0.5


class Coordinator:
    """The coordinator service.

    Args:
        cfg: the whole configuration (`job`, `kafka`, `metrics`, `coordinator`).
        registry: Prometheus registry; default a fresh one for this instance.
        serve_http: start the `/status` and `/metrics` endpoint on `metrics.bind_address:metrics.port`.
    """

    def __init__(self, cfg: StreamtrainConfig, registry: CollectorRegistry | None = None,
                 serve_http: bool = True) -> None:
        self.cfg = cfg
        self.ccfg = cfg.coordinator
        self.topics = cfg.kafka.topics
        self.metrics = CoordinatorMetrics(registry or CollectorRegistry(), cfg.job)
        self.fleet = FleetTracker(self.ccfg)
        self.serve_http = serve_http
        self.server: StatusServer | None = None
        self.ready = threading.Event()
        self._stop = threading.Event()
        self._carry: Any = None
        self._last_plan: dict[str, Any] | None = None
        self._status: dict[str, Any] = {}
        self._status_at = 0.0
        self._next_probe = 0.0
        self._device_topics: dict[str, str] = {}
        self._delivery_failures = 0
        self._latencies: deque[float] = deque(maxlen=1000)
        self._waiting: dict[int, bool] = {}  # step -> its plan left work waiting on every device
        self._fractions: deque[float] = deque(maxlen=1000)
        self._warm_for: tuple[str, ...] | None = None
        self._producer: Any = None
        self._reader: FeedbackReader | None = None
        self._probe: OffsetProbe | None = None
        for device in self.ccfg.devices:
            self.metrics.add_device(device)

    @property
    def port(self) -> int | None:
        """Port of the status endpoint once started."""
        return self.server.port if self.server is not None else None

    def stop(self) -> None:
        """Ask `run` to finish (safe from any thread or a signal handler)."""
        self._stop.set()

    def run(self) -> None:
        """Start (unless `start` already ran), then plan until `stop()`; every client is closed on the way out."""
        try:
            if not self.ready.is_set():
                self.start()
            while not self._stop.is_set():
                self.run_once(0.1)
        finally:
            self.close()

    def start(self) -> None:
        """Create the topics, the clients and the endpoint, and rebuild state from Kafka."""
        kcfg = self.cfg.kafka
        admin = make_admin(kcfg)
        ensure_topics(admin, [TopicSpec.from_config(kcfg, t) for t in
                              (self.topics.feedback, self.topics.assignments, self.topics.dead_letter)])
        self._producer = make_control_producer(kcfg)
        sink = DeadLetterSink(self._producer, self.topics.dead_letter, "coordinator")
        self._probe = OffsetProbe(admin, self.cfg.trainer_group_id, self.ccfg.kafka_timeout_seconds,
                                  reader=make_consumer(kcfg, self.cfg.trainer_group_id))
        self._reader = FeedbackReader(kcfg, self.topics.feedback, self.cfg.job, sink,
                                      lambda reason: self.metrics.dead_lettered.labels(self.cfg.job, reason).inc(),
                                      check=lambda fb: feedback_problem(fb, self._upcoming_step(), self.ccfg, now_ms()))
        self._recover()
        if self.serve_http:
            self.server = StatusServer(self.cfg.metrics.bind_address, self.cfg.metrics.port, lambda: self._status,
                                       self.metrics.registry)
            self.server.start()
        self._refresh_status(force=True)
        self.ready.set()

    def _recover(self) -> None:
        assert self._reader is not None
        n, timeout = self.ccfg.recovery_records, self.ccfg.kafka_timeout_seconds
        plans: list[Assignment] = []
        for msg in read_tail(self.cfg.kafka, self.topics.assignments, n, timeout):
            try:
                plan = decode(msg.value(), msg.headers(), Assignment)
            except WireError as exc:
                logger.warning("skipping an unreadable assignment at offset %s: %s", msg.offset(), exc)
                continue
            if plan.job == self.cfg.job:
                plans.append(plan)
        self._reader.start(n, timeout)
        feedback: list[StepFeedback] = []
        deadline = time.monotonic() + timeout
        while self._reader.replaying and time.monotonic() < deadline:
            feedback.extend(self._reader.poll(0.2))
        self.fleet.replay(plans, feedback, time.monotonic())
        for device in self.fleet.devices:
            self.metrics.add_device(device)
        if feedback or plans:
            logger.info("rebuilt state from %d feedback and %d plan records; next plan is for step %s",
                        len(feedback), len(plans), self._upcoming_step())

    def _upcoming_step(self) -> int | None:
        last = max((r.last_feedback.step for r in self.fleet.devices.values() if r.last_feedback), default=None)
        candidates = [s for s in (self.fleet.next_plan_step, None if last is None else last + 1) if s is not None]
        return max(candidates, default=None)

    def run_once(self, timeout: float) -> None:
        """One turn of the loop: take feedback, poll offsets when due, publish a plan when one is due."""
        assert self._reader is not None and self._producer is not None
        for fb in self._reader.poll(timeout):
            self._on_feedback(fb)
            # A plan due from this record goes out before the next is applied: a plan made one step ahead is made
            # from what its basis told, not from feedback of the step after it that a late poll brought along.
            self._publish_due()
        now = time.monotonic()
        if self.fleet.update_membership(now):
            self._export_membership()
        if now >= self._next_probe:
            self._next_probe = now + self.ccfg.poll_interval_seconds
            self._poll_offsets()
            devices = tuple(self.fleet.expected)
            if self.fleet.warm_start_step() is not None and devices != self._warm_for:
                # No feedback yet: plan step 0 from warm-start models and lag, again only if the fleet changes.
                # Not the steps ahead of it: a plan ahead rests on predictions, and before any feedback there are
                # only guesses (each device's share of the batch, as static plans it, which on an uneven fleet
                # costs a static step). Step 1 waits one round trip for step 0's feedback; plans run ahead from
                # there.
                self._warm_for = devices
                self._publish(0, complete=False, basis=-1, warm=True)
        self._publish_due()
        self._producer.poll(0)
        self._refresh_status()

    def _publish_due(self) -> None:
        while (due := self.fleet.due_step(time.monotonic())) is not None:
            self._publish(*due)

    def _on_feedback(self, fb: StepFeedback) -> None:
        if fb.device_id not in self.fleet.devices:
            self.metrics.add_device(fb.device_id)
        was_absent = fb.device_id in self.fleet.membership.absent
        self.fleet.ingest_feedback(fb, time.monotonic())
        if was_absent:
            self._export_membership()
        rec = self.fleet.devices[fb.device_id]
        labels = (self.cfg.job, fb.device_id)
        self.metrics.feedback.labels(*labels).inc()
        self.metrics.actual.labels(*labels).set(fb.compute_seconds)
        model = rec.tracker.model
        self.metrics.model_a.labels(*labels).set(model.a)
        self.metrics.model_b.labels(*labels).set(model.b)
        if model.rel_error is not None:
            self.metrics.pred_error.labels(*labels).set(model.rel_error)
        self.metrics.pending.labels(*labels).set(len(rec.book))

    def _export_membership(self) -> None:
        absent = self.fleet.membership.absent
        for device in self.fleet.devices:
            self.metrics.present.labels(self.cfg.job, device).set(0 if device in absent else 1)
        self._refresh_status(force=True)

    def _publish(self, step: int, complete: bool, basis: int, warm: bool = False) -> None:
        started = time.perf_counter()
        state = self.fleet.planning_state(step, time.time(), self._carry)
        plan = plan_step(state, self.ccfg)
        if step > basis + 1 and not plan.worth_ahead:
            # The group drained what it could see (line rate): step `step` is planned from the next feedback.
            self.fleet.defer(step, basis)
            self.metrics.plans_deferred.labels(self.cfg.job).inc()
            return
        assignment = plan_to_assignment(plan, self.cfg.job, basis_step=basis)
        assignment = self._without_guessed_bounds(assignment)
        value, headers = encode(assignment)
        self._producer.produce(self.topics.assignments, key=self.cfg.job.encode(), value=value, headers=headers,
                               on_delivery=self._delivered)
        latency = time.perf_counter() - started
        self._carry = plan.carry
        missing = sorted(set(self.fleet.expected) - self.fleet.reporters(basis))  # before the plan forgets them
        dropped = self.fleet.record_plan(assignment)
        job = self.cfg.job
        m = self.metrics
        m.plan_latency.labels(job).observe(latency)
        self._latencies.append(latency)
        m.plans.labels(job).inc()
        step_seconds = self.fleet.step_seconds(basis)
        fraction = latency / step_seconds if step_seconds else None
        if fraction is not None:
            m.plan_latency_fraction.labels(job).set(fraction)
            self._fractions.append(fraction)
        if warm:
            m.plans_warm.labels(job).inc()
            if self._last_plan is None:
                logger.info("plan for step 0 published from warm-start models and lag for %s",
                            ", ".join(self.fleet.expected))
        elif not complete:
            m.plans_partial.labels(job).inc()
            logger.info("plan for step %d published without step %d's feedback from %s", step, basis,
                        ", ".join(missing) or "nobody")
        last = [r.last_feedback for r in self.fleet.devices.values()
                if r.last_feedback is not None and r.last_feedback.step == basis]
        times = [fb.compute_seconds for fb in last]
        m.straggler_effect.labels(job).set(straggler_effect(times))
        if last and not warm:
            for part, seconds in split_wall_period(last, step_seconds).items():
                m.step_wall.labels(job, part).set(seconds)
        # SE where it measures balance: the basis step's plan left work waiting on every device.
        if self._waiting.pop(basis, False) and len(times) == len(plan.devices) > 1:
            m.straggler_effect_waiting.labels(job).set(straggler_effect(times))
        self._waiting = {s: w for s, w in self._waiting.items() if s > basis}
        self._waiting[step] = all(len(self.fleet.devices[b.device_id].book) > 0 for b in plan.devices)
        if self._waiting[step]:
            m.steps_waiting.labels(job).inc()
        m.batch_dif.labels(job).set(dif([b.count for b in plan.devices]))
        m.global_batch.labels(job).set(plan.global_batch)
        m.lr_scale.labels(job).set(plan.lr_scale)
        m.step_target.labels(job).set(plan.step_time_target)
        m.next_step.labels(job).set(step + 1)
        for b in plan.devices:
            labels = (job, b.device_id)
            m.predicted.labels(*labels).set(b.predicted_seconds)
            m.batch.labels(*labels).set(b.count)
            m.batch_size.labels(*labels).set(b.total_size)
            m.truncated.labels(*labels).inc(dropped.get(b.device_id, 0))
            m.pending.labels(*labels).set(len(self.fleet.devices[b.device_id].book))
        self._last_plan = {
            "step": step, "basis_step": basis, "policy": plan.policy, "complete": complete, "warm_start": warm,
            "latency_ms": latency * 1e3, "latency_step_fraction": fraction,
            "step_time_target": plan.step_time_target, "global_batch": plan.global_batch, "lr_scale": plan.lr_scale,
            "created_at": assignment.created_at,
            "devices": [{"device": b.device_id, "count": b.count, "total_size": b.total_size,
                         "predicted_seconds": b.predicted_seconds, "weight": b.weight,
                         "truncate_before": b.truncate_before, "dropped": b.dropped,
                         "first_offset": None if b.offsets is None or not len(b.offsets) else int(b.offsets[0])}
                        for b in plan.devices],
        }
        logger.debug("plan for step %d: %d samples over %d devices in %.2f ms", step, plan.global_batch,
                     len(plan.devices), latency * 1e3)
        self._refresh_status(force=True)

    def _without_guessed_bounds(self, assignment: Assignment) -> Assignment:
        """The plan without the size budgets that rest on a sample size nobody has reported yet.

        Without an index a plan gives a count and a size budget, one derived from the other through the
        device's mean sample size. Before any of the device's sizes is known that mean is a placeholder in
        units nobody has reported, so only the count is kept (for ett-stream, a device it knows nothing about
        is given its equal share of global_batch by count): what the trainer takes and what the pending book
        claims for it are then the same samples.
        """
        if all(part.offsets or part.size_budget is None for part in assignment.devices):
            return assignment
        parts = []
        for part in assignment.devices:
            rec = self.fleet.devices.get(part.device_id)
            if part.offsets or rec is None or rec.sizes_seen:
                parts.append(part)
            else:
                parts.append(replace(part, size_budget=None))
        return replace(assignment, devices=tuple(parts))

    def _delivered(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self._delivery_failures += 1
            logger.error("a plan could not be delivered (trainers fall back to local plans): %s", err)

    def _poll_offsets(self) -> None:
        assert self._probe is not None
        try:
            self._device_topics = self._probe.device_topics(self.topics.device_of)
            offsets = self._probe.offsets(self._device_topics)
        except (KafkaException, TimeoutError) as exc:
            logger.warning("offsets unavailable this round (%s); lag and rates keep their last values", exc)
            return
        at, wall = time.monotonic(), time.time()
        job = self.cfg.job
        for device, o in offsets.items():
            if device not in self.fleet.devices:
                self.metrics.add_device(device)
            self.fleet.observe_offsets(device, o.log_start, o.end, o.committed, at)
            rec = self.fleet.devices[device]
            if self.ccfg.delete_records:
                self._delete_truncated(device)
            self.metrics.lag.labels(job, device).set(max(0, o.end - (o.committed or 0)))
            self.metrics.lag_seconds.labels(job, device).set(rec.lag_seconds(wall))
            self.metrics.rate.labels(job, device).set(rec.rate.rate)

    def _delete_truncated(self, device: str) -> None:
        assert self._probe is not None
        rec = self.fleet.devices[device]
        # Never past what the trainers committed: records they have not yet skipped stay readable.
        committed = rec.committed or 0
        target = committed if self.ccfg.delete_trained else min(rec.delete_before, committed)
        if rec.log_start is None or target <= rec.log_start:
            return
        try:
            new_start = self._probe.delete_before(self._device_topics[device], target)
        except (KafkaException, TimeoutError) as exc:
            logger.warning("DeleteRecords on %s failed (retried next round): %s", device, exc)
            return
        self.metrics.deleted.labels(self.cfg.job, device).inc(max(0, new_start - rec.log_start))
        logger.info("deleted %s records below offset %d", device, new_start)
        rec.log_start = new_start

    def _refresh_status(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._status_at < _STATUS_EVERY_S:
            return
        self._status_at = now
        wall = time.time()
        devices = []
        for device_id, rec in self.fleet.devices.items():
            model = rec.tracker.model
            devices.append({
                "device": device_id, "rank": rec.rank,
                "model": {"a": model.a, "b": model.b, "fitted": model.fitted, "observations": model.n_obs,
                          "rel_error": model.rel_error},
                "lag_records": rec.lag, "lag_seconds": rec.lag_seconds(wall), "arrival_rate": rec.rate.rate,
                "pending": len(rec.book), "in_flight": rec.book.inflight, "index_complete": rec.book.complete,
                "buffer_depth": rec.book.buffer_depth, "lowest_unprocessed": rec.book.floor,
                "end_offset": rec.end_offset, "log_start_offset": rec.log_start, "committed_offset": rec.committed,
                "last_step": rec.last_feedback.step if rec.last_feedback else None, "mean_size": rec.mean_size,
                "present": device_id not in self.fleet.membership.absent,
            })
        self._status = {
            "job": self.cfg.job, "policy": self.ccfg.policy, "truncation": self.ccfg.truncation,
            "plan_ahead": self.ccfg.plan_ahead,
            "delete_records": self.ccfg.delete_records, "topic_prefix": self.cfg.kafka.topic_prefix,
            "next_plan_step": self._upcoming_step(), "expected_devices": self.fleet.expected,
            "absent_devices": sorted(self.fleet.membership.absent),
            "devices": devices, "last_plan": self._last_plan,
            "plan_latency_ms_median": float(np.median(self._latencies)) * 1e3 if self._latencies else None,
            # Plan latency over the wall time of the step each plan followed: the "< 1% of a step" check.
            "plan_latency_step_fraction_median": float(np.median(self._fractions)) if self._fractions else None,
            "plan_latency_step_fraction_p99": float(np.percentile(self._fractions, 99)) if self._fractions else None,
            "plan_delivery_failures": self._delivery_failures,
        }

    def close(self) -> None:
        """Stop the endpoint and close every client (pending plans are flushed first)."""
        if self.server is not None:
            self.server.close()
            self.server = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._probe is not None:
            self._probe.close()
        if self._producer is not None:
            left = self._producer.flush(10)
            if left:
                logger.warning("%d records were not delivered before shutdown", left)
            self._producer = None

