"""`bench ingest`'s producers on the real broker: all four send every record, and the pair compared sends the same
bytes."""

from __future__ import annotations

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from streamtrain.benchmarks.ingest import _DEVICE, _PRODUCERS, producer_rates
from streamtrain.broker import find_kafka_libs
from streamtrain.config import KafkaConfig
from streamtrain.kafka import make_consumer, watermarks

pytestmark = pytest.mark.integration


@pytest.mark.timeout(180)
def test_every_producer_delivers_every_record_and_the_pair_writes_the_same_records(kafka_cfg: KafkaConfig) -> None:
    records = 2_000
    rates, record_bytes, cpu = producer_rates(kafka_cfg, records, 2, find_kafka_libs())

    assert list(rates) == list(_PRODUCERS)
    assert all(len(runs) == 2 and min(runs) > 0 for runs in rates.values())
    assert set(cpu) == {"bare_loop", "device_producer"} and all(len(us) == 2 and min(us) > 0 for us in cpu.values())
    assert 2_800 < record_bytes < 3_100  # 45 x 16 float32 and the record's own fields
    consumer = make_consumer(kafka_cfg, "bench-ingest-check")
    try:
        topic = {kind: f"{kafka_cfg.topic_prefix}.{kind}-1".replace("_", "-") + f".device.{_DEVICE}"
                 for kind in ("bare_loop", "device_producer", "kafka_perf_tool")}
        for name in topic.values():  # every record delivered once (idempotent producers, no retries counted twice)
            assert watermarks(consumer, TopicPartition(name, 0), 10.0) == (0, records)
        values = {}
        for kind in ("bare_loop", "device_producer"):
            consumer.assign([TopicPartition(topic[kind], 0, OFFSET_BEGINNING)])
            got: list[bytes] = []
            while len(got) < 50:
                got += [m.value() for m in consumer.consume(50 - len(got), 5.0) if m.error() is None]
            values[kind] = got
        assert values["bare_loop"] == values["device_producer"]
        # The replay producers: four streams of records // 4 samples each, on their own topics.
        for device in range(4):
            name = f"{kafka_cfg.topic_prefix}.replay-1.device.{device}"
            assert watermarks(consumer, TopicPartition(name, 0), 10.0) == (0, records // 4)
    finally:
        consumer.close()
