"""`up --bridge` stops the bridge once it has caught up with its sources: an empty partition (never committed) and
the end of a transactional source (commit and abort markers, aborted records: offsets no reader is given) are
caught up, not waited for until the drain timeout."""

from __future__ import annotations

import json
import uuid

import pytest
from bridge_helpers import bridge_until_caught_up, create_source
from confluent_kafka import Producer, TopicPartition

from streamtrain.config import KafkaConfig, StreamtrainConfig
from streamtrain.kafka import client_settings, make_consumer, make_producer
from streamtrain.stack.bridging import sources_caught_up

pytestmark = pytest.mark.integration


def _config(kafka: KafkaConfig, topic: str, **bridge: object) -> StreamtrainConfig:
    return StreamtrainConfig.model_validate({
        "job": kafka.topic_prefix, "kafka": kafka.model_dump(),
        "bridge": {"sources": [{"topic": topic}], "devices": ["d0"], "metrics": False, **bridge}})


def _line(i: int) -> bytes:
    return json.dumps({"data": [[0.5, 1.5]] * (1 + i % 3)}).encode()


def test_empty_partitions_count_as_caught_up(kafka_cfg: KafkaConfig) -> None:
    topic = f"{kafka_cfg.topic_prefix}-keyed"
    create_source(kafka_cfg, topic, 3)
    producer = make_producer(kafka_cfg)
    for i in range(20):  # every record in partition 0: partitions 1 and 2 stay empty
        producer.produce(topic, key=b"d0", value=_line(i), partition=0)
    assert producer.flush(30) == 0
    cfg = _config(kafka_cfg, topic, transaction_seconds=0.2)
    assert not sources_caught_up(cfg)  # nothing bridged yet
    bridge_until_caught_up(cfg, 20)
    assert sources_caught_up(cfg)


def test_the_markers_a_transactional_source_ends_with_count_as_caught_up(kafka_cfg: KafkaConfig) -> None:
    topic = f"{kafka_cfg.topic_prefix}-txn"
    create_source(kafka_cfg, topic, 1)
    txn = Producer(client_settings(kafka_cfg, **{"transactional.id": f"src-{uuid.uuid4().hex[:8]}"}))
    txn.init_transactions(30)
    for commit in (True, False):  # offsets 0-4 records, 5 a commit marker, 6-10 aborted records, 11 an abort marker
        txn.begin_transaction()
        for i in range(5):
            txn.produce(topic, key=b"d0", value=_line(i))
        txn.commit_transaction(30) if commit else txn.abort_transaction(30)
    cfg = _config(kafka_cfg, topic, group_id="caught-up")
    group = make_consumer(kafka_cfg, "caught-up")
    try:
        for committed, caught_up in ((4, False), (5, True)):  # a bridge commits past the last record it was given
            group.commit(offsets=[TopicPartition(topic, 0, committed)], asynchronous=False)
            assert sources_caught_up(cfg) is caught_up, committed
    finally:
        group.close()
