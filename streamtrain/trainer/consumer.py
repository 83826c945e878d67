"""The Kafka side of one rank: its device topic into a bounded buffer, and the job's Assignments.

One consumer, manually assigned (no group rebalancing) to partition 0 of the rank's own device
topic and to every partition of `<prefix>.assignments`. Offsets are committed under the trainers'
group id for the device partition only, so the coordinator sees each device's lag as
high watermark - committed. Records that cannot be trained go to the dead-letter topic with a
reason; nothing here raises on bad input.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from streamtrain.authz import raise_if_refused
from streamtrain.config import KafkaConfig, TrainerConfig
from streamtrain.dead_letters import DeadLetterSink
from streamtrain.kafka import (
    consume_available,
    make_consumer,
    tail_positions,
    topic_metadata,
    transient,
    watermarks,
)
from streamtrain.models.batching import payload_problem, sample_problems
from streamtrain.objectives import Objective, build_objective
from streamtrain.wire import Assignment, Sample, WireError, decode, encode

from .buffer import BufferedSample, SampleBuffer
from .errors import TrainerSetupError
from .plans import PlanBook

__all__ = ["RankConsumer"]

logger = logging.getLogger(__name__)

#: Assignment records read back on start, so a plan published just before this rank came up counts.
PLAN_LOOKBACK = 64


class RankConsumer:
    """Consumes one device's samples into a `SampleBuffer` and the job's plans into a `PlanBook`.

    Args:
        kafka: Kafka settings (topic names come from its prefix).
        trainer: Trainer settings (buffer bounds, features, classes).
        device_id: The device this rank trains.
        group_id: Consumer group the device offsets are committed under.
        plans: Where decoded Assignments go.
        producer: Producer the dead letters are sent with (the caller flushes it).
        dead_letter_plans: Also dead-letter bad Assignment records (one rank should, not all).
        objective: Says which samples lack the target it trains on (default: the one `trainer.objective` names).
    """

    def __init__(
        self,
        kafka: KafkaConfig,
        trainer: TrainerConfig,
        device_id: str,
        group_id: str,
        plans: PlanBook,
        producer: Producer,
        dead_letter_plans: bool = False,
        *,
        objective: Objective | None = None,
    ) -> None:
        self.config = trainer
        self.objective = objective if objective is not None else build_objective(trainer)
        self.kafka = kafka
        self.group_id = group_id
        self.device_id = device_id
        self.topic = kafka.topics.device(device_id)
        self.assignments_topic = kafka.topics.assignments
        self.partition = TopicPartition(self.topic, 0)
        self.kafka = kafka
        self.group_id = group_id
        self.plans = plans
        self.dead_letter_plans = dead_letter_plans
        self.sink = DeadLetterSink(producer, kafka.topics.dead_letter, "trainer")
        self.dead_lettered = 0
        self.dead_letter_reasons: dict[str, int] = {}
        self.paused = False
        self.keep_first = 0
        """Keep up to this many of the first samples buffered in `first_samples` (a start-up profile's; 0: none)."""
        self.first_samples: list[Sample] = []
        # librdkafka prefetches up to this much per partition on top of the buffer: keep it in proportion.
        queued_kb = max(1024, min(65536, trainer.buffer_max_bytes // 4096))
        self.consumer: Consumer = make_consumer(kafka, group_id, **{"queued.max.messages.kbytes": queued_kb})
        self.buffer = SampleBuffer(trainer.buffer_max_samples, trainer.buffer_max_bytes, trainer.buffer_resume_ratio)
        meta = topic_metadata(self.consumer, self.topic)  # just created, perhaps: not on every broker yet
        if len(meta.partitions) != 1:
            # Typically created by the broker on a device's first send, with its num.partitions: it must be remade.
            raise TrainerSetupError(f"device topic {self.topic} has {len(meta.partitions)} partitions; a rank trains a "
                                    "device's stream in order from exactly one: delete the topic and create it with "
                                    "one partition (streamtrain creates it so when it is missing, kafka.partitions=1)")

    def committed_offset(self, timeout: float = 30.0) -> int | None:
        """The group's committed offset of the device partition, or None when nothing was committed."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                (tp,) = self.consumer.committed([TopicPartition(self.topic, 0)], timeout=timeout)
                return None if tp.offset == OFFSET_INVALID or tp.offset < 0 else int(tp.offset)
            except KafkaException as exc:
                # A fresh broker answers "not coordinator" / "load in progress" until __consumer_offsets is up.
                err = exc.args[0]
                if not transient(err) or time.monotonic() > deadline:
                    raise
                logger.info("committed offset of %s not available yet (%s); retrying", self.topic, err.str())
                self._refused_group(self.consumer.poll(0.5))  # nothing is assigned yet: only error events come

    def start(self, offset: int | None) -> int:
        """Assign the partitions: the device topic from `offset` (None: its log start), plans near their end.

        Returns:
            The offset consumption of the device topic starts at.
        """
        low, high = watermarks(self.consumer, self.partition)  # retried: the topic may be a moment old
        start = low if offset is None else min(max(offset, low), high)
        if offset is not None and offset < low:
            logger.warning("%s: resume offset %d was deleted by retention; starting at %d", self.topic, offset, low)
        self.buffer.position = start
        assignment = [TopicPartition(self.topic, 0, start)]
        for pid, (near_end, _high) in tail_positions(self.consumer, self.assignments_topic, PLAN_LOOKBACK, 30).items():
            assignment.append(TopicPartition(self.assignments_topic, pid, near_end))
        self.consumer.assign(assignment)
        logger.info("consuming %s from offset %d (log %d..%d)", self.topic, start, low, high)
        return start

    def poll(self, timeout: float, max_records: int = 500) -> int:
        """Fetch and route what is available (waiting at most `timeout`); returns records handled."""
        messages = consume_available(self.consumer, max_records, timeout)
        rewind: int | None = None
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise KafkaException(err)
                self._refused_group(msg)
                raise_if_refused(self.kafka, err, "READ", msg.topic(), "topic")
                if err.code() != KafkaError._PARTITION_EOF:
                    logger.warning("consumer error (retrying): %s", err)
                continue
            if msg.topic() != self.topic:
                self._on_plan(msg)
            elif self.paused:
                # Full in the middle of a fetched batch: leave the rest in Kafka, not in memory.
                rewind = int(msg.offset() or 0) if rewind is None else rewind
            else:
                self._on_sample(msg)
                self._flow_control()
        if rewind is not None:
            self.consumer.seek(TopicPartition(self.topic, 0, rewind))
        else:
            self._pass_gaps()
        self._flow_control()
        return len(messages)

    def _pass_gaps(self) -> None:
        """Move the buffer's position to the consumer's: past the offsets of a transactional topic that hold no
        record for this consumer (markers, aborted records), which it passes without handing anything over."""
        (where,) = self.consumer.position([self.partition])
        if where.offset >= 0:
            self.buffer.pass_to(where.offset)

    def _refused_group(self, event: Message | None) -> None:
        """Raise when `event` says this principal may not use the trainers' group (commits would only time out)."""
        err = event.error() if event is not None else None
        if err is not None and err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            raise_if_refused(self.kafka, err, "READ", self.group_id, "group")

    def _flow_control(self) -> None:
        if not self.paused and self.buffer.full:
            self.consumer.pause([self.partition])
            self.paused = True
            logger.debug("%s: buffer full (%d samples, %d bytes), fetching paused",
                         self.topic, len(self.buffer), self.buffer.nbytes)
        elif self.paused and self.buffer.can_resume:
            self.consumer.resume([self.partition])
            self.paused = False

    def _on_sample(self, msg: Message) -> None:
        offset = int(msg.offset() or 0)
        if self.buffer.seen(offset):
            return  # re-delivered after pause/resume: already buffered or processed
        if self.buffer.done_ahead(offset):
            self.buffer.skip(offset)  # trained (or dropped, dead-lettered) by the run this one resumes
            return
        value = msg.value()
        nbytes = len(value) if value is not None else 0
        if nbytes > self.config.buffer_max_bytes:
            self.dead_letter(msg, "oversize", f"record of {nbytes} bytes exceeds trainer.buffer_max_bytes")
            self.buffer.skip(offset)
            return
        try:
            sample = decode(value, msg.headers(), Sample, device=self.device_id)
        except WireError as exc:
            self.dead_letter(msg, exc.reason, str(exc))
            self.buffer.skip(offset)
            return
        problems = sample_problems(sample, self.config.num_features, wire_checked=True)  # decode validated it
        if problems:
            self.dead_letter(msg, "untrainable", f"sample {sample.device_id}#{sample.seq}: " + "; ".join(problems))
            self.buffer.skip(offset)
            return
        lacking = self.objective.target_problem(sample)  # what the loss needs must be there before it is buffered
        if lacking is not None:
            self.dead_letter(msg, lacking.reason, f"sample {sample.device_id}#{sample.seq}: {lacking.detail}")
            self.buffer.skip(offset)
            return
        refused = payload_problem(sample, self.config)
        if refused is not None:
            self.dead_letter(msg, refused[0], f"sample {sample.device_id}#{sample.seq}: {refused[1]}")
            self.buffer.skip(offset)
            return
        if len(self.first_samples) < self.keep_first:
            self.first_samples.append(sample)
        self.buffer.add(offset, sample, nbytes)

    def _on_plan(self, msg: Message) -> None:
        try:
            plan = decode(msg.value(), msg.headers(), Assignment)
        except WireError as exc:
            if self.dead_letter_plans:
                self.dead_letter(msg, exc.reason, str(exc))
            else:
                logger.debug("skipping a bad assignment record: %s", exc)
            return
        rejected = self.plans.add(plan, msg)
        if rejected is None:
            return
        # Every rank rejects the same plan the same way: one dead letter for the group, a warning from each.
        if self.dead_letter_plans:
            self.dead_letter(msg, rejected.reason, rejected.detail)
        else:
            logger.warning("plan rejected at %s@%s: %s (%s)", msg.topic(), msg.offset(), rejected.reason,
                           rejected.detail)

    def dead_letter(self, msg: Message, reason: str, detail: str) -> None:
        """Send a consumed record to the dead-letter topic with `reason`, count it and say so at WARNING."""
        self.sink.send(msg, reason, detail)
        self._count_dead(reason)
        logger.warning("dead-lettered %s@%s: %s (%s)", msg.topic(), msg.offset(), reason, detail)

    def _count_dead(self, reason: str, n: int = 1) -> None:
        self.dead_lettered += n
        self.dead_letter_reasons[reason] = self.dead_letter_reasons.get(reason, 0) + n

    def dead_letter_buffered(self, entries: Sequence[BufferedSample], reason: str, detail: str,
                             timeout: float = 30.0) -> None:
        """Dead-letter samples that were buffered (those of a skipped step), each as the record it arrived in.

        The buffer keeps decoded samples only, so the original records are read back from the topic (they are
        below no commit yet, so still there); one that cannot be read back any more is re-encoded from its
        decoded sample, and its detail says so. Returns once the dead letters are delivered (or `timeout`
        passes): their offsets are committed past right after, and must be accounted for by then.
        """
        if not entries:
            return
        originals = self._read_back([e.offset for e in entries], timeout)
        for entry in entries:
            msg = originals.get(entry.offset)
            if msg is not None:
                self.sink.send(msg, reason, detail)
                continue
            value, headers = encode(entry.sample)
            self.sink.send_parts(self.topic, 0, entry.offset, reason, f"{detail} (re-encoded: the record could not "
                                 "be read back)", value=value, headers=headers)
        self._count_dead(reason, len(entries))
        left = self.sink.producer.flush(timeout)
        if left:
            logger.error("%d dead letters of %s not delivered within %.0f s", left, self.topic, timeout)

    def _read_back(self, offsets: Sequence[int], timeout: float) -> dict[int, Message]:
        """The records of the device topic at `offsets`, by offset (those that could be read within `timeout`)."""
        wanted, last = set(offsets), max(offsets)
        reader = make_consumer(self.kafka, self.group_id)  # assigned, not subscribed: never joins nor commits
        found: dict[int, Message] = {}
        try:
            reader.assign([TopicPartition(self.topic, 0, min(offsets))])
            deadline = time.monotonic() + timeout
            while len(found) < len(wanted) and time.monotonic() < deadline:
                for msg in consume_available(reader, 500, 0.2):
                    offset = msg.offset()
                    if msg.error() is None and offset in wanted:
                        found[int(offset)] = msg
                    if offset is not None and offset >= last:
                        deadline = 0.0  # past the last one: whatever is missing is not coming
        finally:
            reader.close()
        return found

    def wait_until(self, done: Callable[[], bool], deadline: float, slice_s: float = 0.05) -> bool:
        """Poll until `done()` is true or `deadline` (perf_counter) passes; returns whether it became true."""
        while True:
            if done():
                return True
            left = deadline - time.perf_counter()
            if left <= 0:
                return done()
            self.poll(min(slice_s, left))

    def commit(self, offset: int) -> bool:
        """Commit `offset` (the next one to process) for the device partition; False when the commit failed."""
        try:
            self.consumer.commit(offsets=[TopicPartition(self.topic, 0, offset)], asynchronous=False)
        except KafkaException as exc:
            logger.warning("commit of %s@%d failed (retried at the next commit): %s", self.topic, offset, exc)
            return False
        return True

    def high_watermark(self, fresh: bool = False) -> int:
        """The device topic's end offset: the last one fetched (cheap), or with `fresh` the broker's now."""
        high = -1
        try:
            _low, high = self.consumer.get_watermark_offsets(self.partition, timeout=10.0, cached=not fresh)
            if high < 0:  # nothing fetched yet: no cached value
                _low, high = self.consumer.get_watermark_offsets(self.partition, timeout=10.0)
        except KafkaException as exc:  # the broker is away: what this rank has seen is all it can vouch for
            logger.warning("%s: end offset unavailable (%s)", self.topic, exc)
        return max(int(high), self.buffer.position)

    def lag(self) -> int:
        """High watermark minus the lowest unprocessed offset (records not yet trained or dropped)."""
        _low, high = self.consumer.get_watermark_offsets(self.partition, cached=True)
        return max(0, int(high) - self.buffer.lowest_unprocessed()) if high >= 0 else 0

    def close(self) -> None:
        """Leave without committing anything (commits are explicit)."""
        self.consumer.close()
