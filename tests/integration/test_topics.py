"""Topic creation is idempotent and applies partitions and retention; dead letters keep their reason."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from streamtrain.config import KafkaConfig
from streamtrain.dead_letters import REASON_HEADER, DeadLetterSink
from streamtrain.kafka import (
    TopicSpec,
    consume_available,
    ensure_topics,
    make_admin,
    make_consumer,
    make_producer,
    read_to_end,
    topic_config,
    topic_metadata,
    watermarks,
)
from streamtrain.wire import DeadLetter, Sample, WireError, decode, encode, fingerprint_of
from streamtrain.wire.layout import MARKER

pytestmark = pytest.mark.integration


def test_creating_topics_is_idempotent_with_partitions_and_retention(kafka_cfg: KafkaConfig) -> None:
    cfg = kafka_cfg.model_copy(update={"partitions": 3, "retention_seconds": 3600.0})
    names = cfg.topics
    specs = [TopicSpec.from_config(cfg, t) for t in (names.device("a"), names.feedback, names.assignments,
                                                       names.dead_letter)]
    admin = make_admin(cfg)
    assert sorted(ensure_topics(admin, specs)) == sorted(s.name for s in specs)
    assert ensure_topics(admin, specs) == []  # second call: nothing to do, no error
    meta = admin.list_topics(timeout=10).topics
    assert len(meta[names.device("a")].partitions) == 3
    assert topic_config(admin, names.feedback)["retention.ms"] == "3600000"


def test_broker_refuses_to_invent_topics(kafka_cfg: KafkaConfig) -> None:
    """Topics come from one place: producing to a misspelt topic fails instead of creating it."""
    producer = make_producer(kafka_cfg, **{"delivery.timeout.ms": 3000, "message.timeout.ms": 3000})
    errors = []
    producer.produce(kafka_cfg.topics.device("typo"), value=b"x", on_delivery=lambda err, _m: errors.append(err))
    producer.flush(10)
    assert errors and errors[0] is not None
    assert kafka_cfg.topics.device("typo") not in make_admin(kafka_cfg).list_topics(timeout=10).topics


def _metadata(consumer: Consumer, topic: str, timeout: float) -> None:
    meta = topic_metadata(consumer, topic, timeout)
    assert len(meta.partitions) == 1 and all(p.leader >= 0 for p in meta.partitions.values())


def _watermarks(consumer: Consumer, topic: str, timeout: float) -> None:
    assert watermarks(consumer, TopicPartition(topic, 0), timeout) == (0, 0)


@pytest.mark.parametrize("lookup", [_metadata, _watermarks], ids=["metadata", "watermarks"])
def test_a_topic_created_a_moment_ago_is_waited_for_then_refused_by_name(
        kafka_cfg: KafkaConfig, lookup: Callable[[Consumer, str, float], None]) -> None:
    """A rank reads its device topic's metadata, then its watermarks, right after creating it. A broker that has
    not caught up with the metadata log says "unknown topic"; the metadata can name a new partition's leader
    before that broker has applied the partition (a rank on the multi-host bed died on "Failed to get watermark
    offsets: unknown topic or partition"). Both lookups wait for the topic to appear, and name the error when
    it never does."""
    name = kafka_cfg.topics.device(f"late{lookup.__name__}")
    consumer = make_consumer(kafka_cfg, f"late{lookup.__name__}-reader")
    creator = threading.Timer(1.5, lambda: ensure_topics(make_admin(kafka_cfg), [TopicSpec.from_config(kafka_cfg,
                                                                                                        name)]))
    try:
        started = time.monotonic()
        creator.start()
        lookup(consumer, name, 30)
        assert time.monotonic() - started >= 1.0  # it was not there at first
        started = time.monotonic()
        with pytest.raises(KafkaException) as refused:
            lookup(consumer, kafka_cfg.topics.device(f"never{lookup.__name__}"), 2)
        assert refused.value.args[0].code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION,
                                                KafkaError._TIMED_OUT)
        assert 2 <= time.monotonic() - started < 10
    finally:
        creator.join()
        consumer.close()


def test_dead_letter_sink_keeps_the_record_and_the_reason(kafka_cfg: KafkaConfig) -> None:
    names = kafka_cfg.topics
    admin = make_admin(kafka_cfg)
    ensure_topics(admin, [TopicSpec.from_config(kafka_cfg, t) for t in (names.device("d"), names.dead_letter)])
    producer = make_producer(kafka_cfg)
    _, headers = encode(Sample.from_array("d", 0, np.ones((3, 2), "float32")))
    garbage = fingerprint_of(Sample).join((MARKER, b"\x01garbage"))  # a string of length -1 after a valid prefix
    producer.produce(names.device("d"), value=garbage, headers=headers)
    producer.flush(10)
    (msg,) = list(read_to_end(kafka_cfg, [names.device("d")]))
    sink = DeadLetterSink(producer, names.dead_letter, service="trainer")
    with pytest.raises(WireError) as rejected:
        decode(msg.value(), msg.headers(), Sample)
    sink.send_error(msg, rejected.value)
    assert producer.flush(10) == 0 and sink.sent == 1
    (letter_msg,) = list(read_to_end(kafka_cfg, [names.dead_letter]))
    assert dict(letter_msg.headers() or [])[REASON_HEADER] == b"corrupt"
    letter = decode(letter_msg.value(), letter_msg.headers(), DeadLetter)
    assert (letter.topic, letter.offset, letter.reason, letter.service) == (names.device("d"), 0, "corrupt", "trainer")
    assert letter.value == garbage and letter.headers["st-size"] == b"3"
    assert "not valid Avro" in letter.detail


def test_consume_available_returns_as_soon_as_records_are_there(kafka_cfg: KafkaConfig) -> None:
    """A few records, a long timeout: they come back at once, not when the timeout runs out."""
    topic = kafka_cfg.topics.device("avail")
    ensure_topics(make_admin(kafka_cfg), [TopicSpec.from_config(kafka_cfg, topic)])
    consumer = make_consumer(kafka_cfg, f"{kafka_cfg.topic_prefix}-avail", **{"enable.auto.commit": "false"})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        began = time.monotonic()
        assert consume_available(consumer, 500, 1.0) == []  # nothing yet: waits the timeout, returns nothing
        assert time.monotonic() - began >= 0.9
        producer = make_producer(kafka_cfg)
        for i in range(3):
            producer.produce(topic, f"r{i}".encode())
        producer.flush(10)
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < 3 and time.monotonic() < deadline:
            began = time.monotonic()
            batch = consume_available(consumer, 500, 5.0)
            assert time.monotonic() - began < 2.0  # Consumer.consume(500, 5.0) would sit out the 5 s
            got += [m.value() for m in batch if m.error() is None]
        assert got == [b"r0", b"r1", b"r2"]
    finally:
        consumer.close()
