"""The coordinator's Kafka inputs: feedback, recent history on start, and offsets (lag, DeleteRecords).

Nothing here commits an offset: the coordinator keeps no consumer-group state of its own. On start
it re-reads the tail of the feedback and assignments topics (`read_tail`) and then follows the
feedback topic from where that read stopped (`FeedbackReader`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from streamtrain.authz import raise_if_refused
from streamtrain.config import KafkaConfig
from streamtrain.dead_letters import DeadLetterSink
from streamtrain.kafka import make_consumer, read_to_end, tail_positions
from streamtrain.wire import DeviceProfile, SchemaMismatchError, StepFeedback, WireError, decode

from .feedback_checks import FeedbackRejection

__all__ = ["FeedbackReader", "OffsetProbe", "TopicOffsets", "read_tail"]

logger = logging.getLogger(__name__)

_BATCH = 500


def read_tail(cfg: KafkaConfig, topic: str, count: int, timeout: float = 30.0) -> list[Message]:
    """The last `count` records of each partition of `topic` (as they are now), oldest first per partition."""
    return list(read_to_end(cfg, [topic], timeout, last=count))


class FeedbackReader:
    """Follows the feedback topic, decoding records; undecodable ones go to the dead-letter topic.

    Besides steps' `StepFeedback` the topic carries the ranks' start-up `DeviceProfile`s: they go to `on_profile`
    (without one they are dead-lettered as the wrong schema, as a coordinator that does not know them does).

    Args:
        cfg: Kafka settings.
        topic: the feedback topic.
        job: only this job's feedback is returned (others share the topic legitimately).
        dead_letters: where undecodable and rejected records go.
        on_dead_letter: called with the reason of each dead-lettered record (metrics).
        check: why a decoded record of this job must not be used (`feedback_problem`), or None when it may.
        on_profile: called with each credible start-up profile of this job.
    """

    def __init__(self, cfg: KafkaConfig, topic: str, job: str, dead_letters: DeadLetterSink,
                 on_dead_letter: Callable[[str], None] | None = None,
                 check: Callable[[StepFeedback], FeedbackRejection | None] | None = None,
                 on_profile: Callable[[DeviceProfile], None] | None = None) -> None:
        self.topic = topic
        self.job = job
        self.dead_letters = dead_letters
        self.on_dead_letter = on_dead_letter
        self.check = check
        self.on_profile = on_profile
        self.kafka = cfg
        self._consumer = make_consumer(cfg, f"{job}.coordinator")
        self._replay_end: dict[int, int] = {}

    def start(self, recent: int, timeout: float) -> None:
        """Assign every partition at its last `recent` records; those are replayed first (`replaying`)."""
        spans = tail_positions(self._consumer, self.topic, recent, timeout)
        self._replay_end = {pid: high for pid, (start, high) in spans.items() if high > start}
        self._consumer.assign([TopicPartition(self.topic, pid, start) for pid, (start, _high) in spans.items()])

    @property
    def replaying(self) -> bool:
        """True until the records present at `start` have all been read."""
        return bool(self._replay_end)

    def poll(self, timeout: float) -> list[StepFeedback]:
        """Feedback that arrived: waits up to `timeout` for the first record, then takes what is ready."""
        out: list[StepFeedback] = []
        msg = self._consumer.poll(timeout)
        while msg is not None and len(out) < _BATCH:
            self._handle(msg, out)
            msg = self._consumer.poll(0)
        if msg is not None:
            self._handle(msg, out)
        return out

    def _handle(self, msg: Message, out: list[StepFeedback]) -> None:
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                return  # its group is never used (no commits): a principal without rights on it reads just the same
            raise_if_refused(self.kafka, err, "READ", msg.topic() or self.topic, "topic")
            if err.code() != KafkaError._PARTITION_EOF:
                logger.warning("feedback consumer error: %s", err)
            return
        pid, offset = msg.partition() or 0, msg.offset() or 0
        replay = pid in self._replay_end
        if replay and offset >= self._replay_end[pid] - 1:
            del self._replay_end[pid]
        try:
            fb = decode(msg.value(), msg.headers(), StepFeedback)
        except SchemaMismatchError as exc:
            if self.on_profile is None or not self._profile(msg, replay):
                self._reject(msg, exc.reason, str(exc), replay)
            return
        except WireError as exc:
            self._reject(msg, exc.reason, str(exc), replay)
            return
        if fb.job != self.job:
            return
        rejected = self.check(fb) if self.check is not None else None
        if rejected is not None:
            self._reject(msg, rejected.reason, f"{fb.device_id} step {fb.step}: {rejected.detail}", replay)
            return
        out.append(fb)

    def _profile(self, msg: Message, replay: bool) -> bool:
        """Hand a start-up profile to `on_profile` (a broken one is dead-lettered); False when `msg` is not one."""
        assert self.on_profile is not None
        try:
            profile = decode(msg.value(), msg.headers(), DeviceProfile)
        except SchemaMismatchError:
            return False
        except WireError as exc:
            self._reject(msg, exc.reason, str(exc), replay)
            return True
        if profile.job != self.job:
            return True
        problem = profile.problem()
        if problem is not None:
            self._reject(msg, "feedback-impossible", f"{profile.device_id} start-up profile: {problem}", replay)
            return True
        self.on_profile(profile)
        return True

    def _reject(self, msg: Message, reason: str, detail: str, replay: bool) -> None:
        if replay:
            return  # dead-lettered by the run that first read it
        logger.warning("feedback at %s[%d]@%d dead-lettered (%s): %s", self.topic, msg.partition() or 0,
                       msg.offset() or 0, reason, detail)
        self.dead_letters.send(msg, reason, detail)
        if self.on_dead_letter is not None:
            self.on_dead_letter(reason)

    def close(self) -> None:
        self._consumer.close()


@dataclass(frozen=True)
class TopicOffsets:
    """Partition 0 of a device topic: log start, high watermark, and the trainers' committed offset."""

    log_start: int
    end: int
    committed: int | None


class OffsetProbe:
    """Watermarks of device topics and the trainers' committed offsets, through the admin API.

    Device topics have one partition (per-device order); only partition 0 is read and truncated.

    Args:
        admin: an admin client (see `streamtrain.kafka.make_admin`).
        group: the trainers' consumer group (`StreamtrainConfig.trainer_group_id`).
        timeout: seconds per admin request.
        reader: a consumer of `group` (never subscribed) that reads its committed offsets. Preferred over
            the admin API: librdkafka's admin ListConsumerGroupOffsets times out for good (or aborts the
            process) once the broker connection drops, e.g. across a broker restart; a consumer's
            OffsetFetch recovers as soon as the broker is back.
    """

    def __init__(self, admin: AdminClient, group: str, timeout: float, reader: Consumer | None = None) -> None:
        self.admin = admin
        self.group = group
        self.timeout = timeout
        self.reader = reader

    def device_topics(self, prefix_filter: Callable[[str], str | None]) -> dict[str, str]:
        """Existing topics that `prefix_filter` maps to a device id, as device -> topic."""
        topics = self.admin.list_topics(timeout=self.timeout).topics
        found = {}
        for name in topics:
            device = prefix_filter(name)
            if device is not None:
                found[device] = name
        return found

    def offsets(self, topics: dict[str, str]) -> dict[str, TopicOffsets]:
        """Log start, high watermark and committed offset of each device's topic (by device id)."""
        if not topics:
            return {}
        parts = {device: TopicPartition(topic, 0) for device, topic in topics.items()}
        ends = self._list({TopicPartition(tp.topic, 0): OffsetSpec.latest() for tp in parts.values()})
        starts = self._list({TopicPartition(tp.topic, 0): OffsetSpec.earliest() for tp in parts.values()})
        committed = self._committed(list(parts.values()))
        out = {}
        for device, tp in parts.items():
            if tp.topic in ends and tp.topic in starts:
                out[device] = TopicOffsets(starts[tp.topic], ends[tp.topic], committed.get(tp.topic))
        return out

    def _list(self, specs: dict[TopicPartition, OffsetSpec]) -> dict[str, int]:
        futures = self.admin.list_offsets(specs, request_timeout=self.timeout)
        out = {}
        for tp, fut in futures.items():
            try:
                out[tp.topic] = int(fut.result(timeout=self.timeout).offset)
            except (KafkaException, TimeoutError) as exc:
                logger.warning("offsets of %s unavailable: %s", tp.topic, exc)
        return out

    def _committed(self, parts: list[TopicPartition]) -> dict[str, int]:
        if self.reader is not None:
            try:
                found = self.reader.committed(parts, timeout=self.timeout)
            except KafkaException as exc:
                logger.warning("committed offsets of group %s unavailable: %s", self.group, exc)
                return {}
            return {tp.topic: tp.offset for tp in found if tp.error is None and tp.offset >= 0}
        request = [ConsumerGroupTopicPartitions(self.group, parts)]
        try:
            result = self.admin.list_consumer_group_offsets(request, request_timeout=self.timeout)[self.group]
            found = result.result(timeout=self.timeout)
        except (KafkaException, TimeoutError) as exc:
            logger.warning("committed offsets of group %s unavailable: %s", self.group, exc)
            return {}
        # A partition with no commit reports a negative offset (OFFSET_INVALID).
        return {tp.topic: tp.offset for tp in found.topic_partitions if tp.error is None and tp.offset >= 0}

    def close(self) -> None:
        """Close the committed-offset reader (it never joined the group: nothing to leave)."""
        if self.reader is not None:
            self.reader.close()
            self.reader = None

    def delete_before(self, topic: str, offset: int) -> int:
        """Delete partition 0's records below `offset` on the broker (DeleteRecords); returns the new log start."""
        futures = self.admin.delete_records([TopicPartition(topic, 0, offset)], request_timeout=self.timeout,
                                            operation_timeout=self.timeout)
        (fut,) = futures.values()
        result = fut.result(timeout=self.timeout)
        return int(getattr(result, "low_watermark", offset))
