"""A rank's consumer on the real broker: the buffer bound pauses fetching, resuming loses and repeats nothing."""

from __future__ import annotations

import time

import numpy as np
import pytest

from streamtrain.config import KafkaConfig, TrainerConfig
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin, make_producer
from streamtrain.trainer.consumer import RankConsumer
from streamtrain.trainer.errors import TrainerSetupError
from streamtrain.trainer.plans import PlanBook
from streamtrain.wire import Assignment, Sample, encode

pytestmark = pytest.mark.integration


def test_pause_when_full_and_resume_without_loss_or_duplicates(kafka_cfg: KafkaConfig) -> None:
    topics = kafka_cfg.topics
    ensure_topics(make_admin(kafka_cfg), [TopicSpec.from_config(kafka_cfg, n) for n in (
        topics.device("d0"), topics.assignments, topics.dead_letter)])
    producer = make_producer(kafka_cfg)
    for seq in range(100):
        value, headers = encode(Sample.from_array("d0", seq, np.ones((2, 16), np.float32), label=1))
        producer.produce(topics.device("d0"), value=value, headers=headers)
    value, headers = encode(Assignment("job", 3, "p", 0.0, 1, 1.0, ()))
    producer.produce(topics.assignments, value=value, headers=headers)
    assert producer.flush(30) == 0

    config = TrainerConfig(buffer_max_samples=20, buffer_resume_ratio=0.5)
    plans = PlanBook("job")
    consumer = RankConsumer(kafka_cfg, config, "d0", "g", plans, producer)
    trained: list[int] = []
    max_depth = 0
    paused_seen = False
    try:
        assert consumer.committed_offset() is None
        assert consumer.start(None) == 0
        deadline = time.monotonic() + 60
        while len(trained) < 100 and time.monotonic() < deadline:
            consumer.poll(0.1)
            max_depth = max(max_depth, len(consumer.buffer))
            paused_seen |= consumer.paused
            if consumer.paused:  # train a few, as a step would, until fetching resumes
                samples = consumer.buffer.take(consumer.buffer.select_oldest(count=5))
                trained += [s.seq for s in samples]
                consumer.buffer.complete_step()
            elif consumer.buffer.position == 100:
                trained += [s.seq for s in consumer.buffer.take(consumer.buffer.offsets())]
                consumer.buffer.complete_step()
        assert consumer.commit(consumer.buffer.lowest_unprocessed())
        assert consumer.committed_offset() == 100
    finally:
        consumer.close()
    assert trained == list(range(100))
    assert paused_seen and max_depth == 20  # the bound holds even inside one fetched batch
    assert plans.get(3) is not None


def test_a_device_topic_of_several_partitions_is_refused_with_the_fix(kafka_cfg: KafkaConfig) -> None:
    """A broker that creates topics on first use gives a device's topic its num.partitions; a rank that
    read only partition 0 would silently skip the others, so it refuses to start and says how to remake it."""
    topics = kafka_cfg.topics
    ensure_topics(make_admin(kafka_cfg), [TopicSpec(topics.device("d3"), 3),
                                          *(TopicSpec.from_config(kafka_cfg, n) for n in (topics.assignments,
                                                                                          topics.dead_letter))])
    producer = make_producer(kafka_cfg)
    with pytest.raises(TrainerSetupError, match=rf"{topics.device('d3')} has 3 partitions.*delete the topic"):
        RankConsumer(kafka_cfg, TrainerConfig(), "d3", "g", PlanBook("job"), producer)
