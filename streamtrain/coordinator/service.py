"""`Coordinator`: the live service that turns trainers' feedback into the next step's plan.

One loop (confluent-kafka style: poll, check the error, process): feedback in, offsets and
arrival rates polled every `poll_interval_seconds`, and as soon as every device reported step t
(or `feedback_wait_seconds` after the first did) the plan for step t+1+`plan_ahead` is built by the
same `plan_step` the simulator runs and published on the assignments topic. With plans one step
ahead (the default) that is the plan for t+2, made while step t+1 runs, so the ranks find it there
when they need it instead of waiting for a round trip through Kafka at every step boundary.
Trainers never wait for a plan beyond their own bounded wait. Before any feedback exists, as soon
as the devices and their lag are known, the plans for step 0 (and, one step ahead, step 1) are
published from the warm-start models, so the first steps do not fall back to local plans either. Each rank
profiles its own speed at start-up and reports it (`DeviceProfile`, LBB's profiling phase): once every device's
profile is in (or `profile_wait_seconds` after the first), step 0 is planned again from the profiles, so it is
balanced like the steps after it.

It keeps no state that Kafka cannot give back: on start it re-reads the tail of the assignments
and feedback topics, replays each plan after the feedback it was made from, and resumes with the
plan after the last one published, or the step after the last feedback when that is later.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message
from prometheus_client import CollectorRegistry

from streamtrain.config import StreamtrainConfig
from streamtrain.dead_letters import DeadLetterSink
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin, make_consumer, make_control_producer
from streamtrain.wire import Assignment, DeviceProfile, StepFeedback, WireError, decode, encode, now_ms

from .feedback_checks import feedback_problem
from .fleet import FleetTracker
from .inputs import FeedbackReader, OffsetProbe, read_tail
from .metrics import CoordinatorMetrics
from .observer import PlanObserver, Published
from .policies import plan_step
from .state import Plan, plan_to_assignment
from .status import StatusServer, device_status

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
        self.observer = PlanObserver(self.metrics, cfg.job)
        self._carry: Any = None
        self._plans_published = 0
        self._status: dict[str, Any] = {}
        self._status_at = 0.0
        self._next_probe = 0.0
        self._device_topics: dict[str, str] = {}
        self._delivery_failures = 0
        self._warm_for: tuple[tuple[str, ...], frozenset[str]] | None = None
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
                                      check=lambda fb: feedback_problem(fb, self._upcoming_step(), self.ccfg, now_ms()),
                                      on_profile=self._on_profile)
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
        self._publish_warm(now)
        self._publish_due()
        self._producer.poll(0)
        self._refresh_status()

    def _publish_warm(self, now: float) -> None:
        """No feedback yet: plan step 0 from the start-up profiles there are, warm-start models for the rest, and lag;
        again only if the fleet or the profiles settled change.

        Not the steps ahead of it: a plan ahead rests on predictions, and before any feedback there are only guesses
        and profiles. Step 1 waits one round trip for step 0's feedback; plans run ahead from there.
        """
        if self.fleet.warm_start_step() is None:
            return
        profiled = self.fleet.profiles_settled(now)
        if profiled is None:  # some profiles in, the others' wait not over: the ranks wait for this plan
            return
        key = (tuple(self.fleet.expected), profiled)
        if key != self._warm_for:
            self._warm_for = key
            self._publish(0, complete=False, basis=-1, warm=True)

    def _on_profile(self, profile: DeviceProfile) -> None:
        if self.fleet.ingest_profile(profile, time.monotonic()):
            logger.info("start-up profile of %s (rank %d, %.2f s): T = %.4g s x size + %.4g s over total sizes %s, "
                        "mean sample size %.1f", profile.device_id, profile.rank, profile.profile_seconds,
                        profile.slope, profile.intercept, list(profile.sizes), profile.mean_sample_size)
        else:
            logger.info("start-up profile of %s not used (%s)", profile.device_id, "coordinator.use_profiles is off"
                        if not self.ccfg.use_profiles else "it has reported a step already")

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
        self.observer.feedback(fb, self.fleet.devices[fb.device_id])

    def _export_membership(self) -> None:
        self.observer.membership(list(self.fleet.devices), self.fleet.membership.absent)
        self._refresh_status(force=True)

    def _publish(self, step: int, complete: bool, basis: int, warm: bool = False) -> None:
        started = time.perf_counter()
        plan = self._plan(step, basis)
        if plan is None:
            return
        assignment = self._send(plan, basis)
        latency = time.perf_counter() - started
        self._carry = plan.carry
        missing = sorted(set(self.fleet.expected) - self.fleet.reporters(basis))  # before the plan forgets them
        dropped = self.fleet.record_plan(assignment)
        self.observer.published(Published(plan, assignment, basis, complete, warm, latency, dropped), self.fleet)
        if warm:
            logger.info("plan for step 0 published before any feedback, from lag and each device's start-up profile or "
                        "warm start: %s", "; ".join(
                f"{p.device_id} {self._basis_of(p.device_id)}: {p.count} samples, predicted {p.predicted_seconds:.3f} s"
                for p in plan.devices))
        elif not warm and not complete:
            logger.info("plan for step %d published without step %d's feedback from %s", step, basis,
                        ", ".join(missing) or "nobody")
        self._plans_published += 1
        logger.debug("plan for step %d: %d samples over %d devices in %.2f ms", step, plan.global_batch,
                     len(plan.devices), latency * 1e3)
        self._refresh_status(force=True)

    def _basis_of(self, device: str) -> str:
        """What step 0's model of `device` came from, for the log."""
        rec = self.fleet.devices[device]
        model = rec.model
        return (f"{'profile' if rec.profile is not None else 'warm start'} a={model.a:.4g} b={model.b:.4g} "
                f"mean size {rec.mean_size:.1f}")

    def _plan(self, step: int, basis: int) -> Plan | None:
        """The plan for `step` from the fleet as it stands; None when a plan ahead would train nothing."""
        plan = plan_step(self.fleet.planning_state(step, time.time(), self._carry), self.ccfg)
        if step > basis + 1 and not plan.worth_ahead:
            # The group drained what it could see (line rate): step `step` is planned from the next feedback.
            self.fleet.defer(step, basis)
            self.observer.deferred()
            return None
        return plan

    def _send(self, plan: Plan, basis: int) -> Assignment:
        """Publish `plan` on the assignments topic (delivery is reported to `_delivered`)."""
        assignment = self._without_guessed_bounds(plan_to_assignment(plan, self.cfg.job, basis_step=basis))
        value, headers = encode(assignment)
        self._producer.produce(self.topics.assignments, key=self.cfg.job.encode(), value=value, headers=headers,
                               on_delivery=self._delivered)
        return assignment

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
        for device, o in offsets.items():
            if device not in self.fleet.devices:
                self.metrics.add_device(device)
            self.fleet.observe_offsets(device, o.log_start, o.end, o.committed, at)
            rec = self.fleet.devices[device]
            if self.ccfg.delete_records:
                self._delete_truncated(device)
            self.observer.offsets(device, rec, max(0, o.end - (o.committed or 0)), wall)

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
        wall, absent = time.time(), self.fleet.membership.absent
        self._status = {
            "job": self.cfg.job, "policy": self.ccfg.policy, "truncation": self.ccfg.truncation,
            "plan_ahead": self.ccfg.plan_ahead,
            "delete_records": self.ccfg.delete_records, "topic_prefix": self.cfg.kafka.topic_prefix,
            "next_plan_step": self._upcoming_step(), "expected_devices": self.fleet.expected,
            "absent_devices": sorted(absent),
            "devices": [device_status(d, rec, wall, d not in absent) for d, rec in self.fleet.devices.items()],
            "last_plan": self.observer.last_plan,
            **self.observer.latency_figures(),
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

