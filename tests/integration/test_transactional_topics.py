"""Device topics written in Kafka transactions (the bridge writes them so): offsets with no record in them.

A transaction's commit (or abort) marker takes an offset in every partition it wrote, and an aborted
transaction's records take offsets too; a `read_committed` consumer is given neither. Whatever counts by offset
must take those gaps as nothing: not lost, not waited for, not lag.
"""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest
from confluent_kafka import Producer, TopicPartition

from streamtrain.config import KafkaConfig, TrainerConfig
from streamtrain.kafka import TopicSpec, client_settings, ensure_topics, make_admin, read_to_end, watermarks
from streamtrain.report.accounting import account_records
from streamtrain.trainer.consumer import RankConsumer
from streamtrain.trainer.plans import PlanBook
from streamtrain.wire import Sample, encode

pytestmark = pytest.mark.integration

#: Records per transaction, and whether it commits: the topic ends on a commit marker.
TRANSACTIONS = ((3, True), (2, False), (4, True), (1, True), (3, False), (2, True))


def _write_in_transactions(kafka: KafkaConfig, topic: str) -> list[int]:
    """Samples to `topic` in `TRANSACTIONS`; returns the seqs of the committed ones, in order."""
    producer = Producer(client_settings(kafka, **{"transactional.id": f"test-{uuid.uuid4().hex[:8]}"}))
    producer.init_transactions(30)
    seq, committed = 0, []
    for count, commit in TRANSACTIONS:
        producer.begin_transaction()
        for _ in range(count):
            value, headers = encode(Sample.from_array("d0", seq, np.ones((2, 4), np.float32), label=1))
            producer.produce(topic, value=value, headers=headers)
            if commit:
                committed.append(seq)
            seq += 1
        producer.flush(30)  # the aborted ones reach the log too, and take their offsets
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    return committed


def _consumer_end(kafka: KafkaConfig, topic: str) -> int:
    from streamtrain.kafka import make_consumer

    consumer = make_consumer(kafka, f"probe-{uuid.uuid4().hex[:6]}")
    try:
        return watermarks(consumer, TopicPartition(topic, 0))[1]
    finally:
        consumer.close()


def test_gaps_of_a_transactional_topic_are_neither_lost_nor_waited_for_nor_lag(kafka_cfg: KafkaConfig) -> None:
    topics = kafka_cfg.topics
    topic = topics.device("d0")
    ensure_topics(make_admin(kafka_cfg), [TopicSpec.from_config(kafka_cfg, n) for n in (
        topic, topics.assignments, topics.dead_letter)])
    committed = _write_in_transactions(kafka_cfg, topic)
    end = _consumer_end(kafka_cfg, topic)
    assert end == sum(n for n, _ in TRANSACTIONS) + len(TRANSACTIONS)  # one marker per transaction

    began = time.monotonic()
    read = list(read_to_end(kafka_cfg, [topic], timeout=20))  # the last offset is a marker: it must not wait for it
    assert time.monotonic() - began < 10
    offsets = [m.offset() for m in read]
    assert len(read) == len(committed) and offsets == sorted(offsets) and offsets[-1] < end - 1

    producer = Producer(client_settings(kafka_cfg))
    consumer = RankConsumer(kafka_cfg, TrainerConfig(num_features=4), "d0", "g", PlanBook("job"), producer)
    try:
        consumer.start(None)
        deadline = time.monotonic() + 20
        while consumer.buffer.position < end and time.monotonic() < deadline:
            consumer.poll(0.1)
        buffer = consumer.buffer
        assert buffer.position == end  # past the final commit marker, not stuck one short of it
        samples = buffer.take(buffer.offsets())
        buffer.complete_step()
        assert [s.seq for s in samples] == committed  # the aborted samples never reach a step
        assert buffer.lowest_unprocessed() == end and consumer.lag() == 0
        assert consumer.commit(buffer.lowest_unprocessed()) and consumer.committed_offset() == end
    finally:
        consumer.close()

    fates = account_records(offsets, trained=offsets, committed=end)
    assert fates.complete and fates.records == len(committed) and len(fates.lost) == 0
