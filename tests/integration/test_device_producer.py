"""`DeviceProducer` against the real broker: what is sent arrives intact, and what fails is never silent."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from streamtrain import Delivery, DeliveryError, DeviceProducer
from streamtrain.config import KafkaConfig, StreamtrainConfig
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin, make_producer, read_to_end
from streamtrain.wire import Sample, decode

pytestmark = pytest.mark.integration


def _create(cfg: KafkaConfig, *devices: str, **config: str) -> None:
    ensure_topics(make_admin(cfg), [TopicSpec.from_config(cfg, cfg.topics.device(d), **config) for d in devices])


def _read(cfg: KafkaConfig, device: str) -> list[tuple[int, Sample]]:
    """(offset, sample) of every record on the device's topic."""
    return [(m.offset() or 0, decode(m.value(), m.headers(), Sample, device=device))
            for m in read_to_end(cfg, [cfg.topics.device(device)])]


def test_samples_arrive_decodable_with_everything_they_were_sent_with(kafka_cfg: KafkaConfig) -> None:
    _create(kafka_cfg, "cam-1")
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((5, 3)).astype(np.float32),
              np.arange(12, dtype=">i4").reshape(4, 3),  # big-endian: sent little-endian
              np.asfortranarray(rng.standard_normal((7, 2))),  # column-major float64: sent row-major
              np.arange(60, dtype=np.uint8).reshape(10, 6)[::3, ::2]]  # a strided view
    deliveries: list[Delivery] = []
    with DeviceProducer(StreamtrainConfig(kafka=kafka_cfg), device="cam-1", on_delivery=deliveries.append) as producer:
        for i, arr in enumerate(arrays):
            producer.send(arr, label=i if i % 2 else None, target=[i, 0.5] if i < 3 else None,
                          metadata={"frame": str(i)}, produced_at=1_700_000_000_000 + i)
    assert (producer.sent, producer.delivered, producer.failed, producer.queued) == (4, 4, 0, 0)
    read = _read(kafka_cfg, "cam-1")
    assert [(d.seq, d.offset, d.partition, d.size) for d in deliveries] == [
        (s.seq, offset, 0, s.size) for offset, s in read]
    for i, ((_, sample), arr) in enumerate(zip(read, arrays, strict=True)):
        assert sample.seq == i and sample.device_id == "cam-1" and sample.size == arr.shape[0]
        assert sample.dtype == arr.dtype.name and np.array_equal(sample.array(), arr)
        assert sample.label == (i if i % 2 else None)
        assert sample.target == ((float(i), 0.5) if i < 3 else None)
        assert sample.metadata == {"frame": str(i)} and sample.produced_at == 1_700_000_000_000 + i
        assert not sample.problems()


def test_create_topic_makes_the_device_topic_with_the_configured_settings(kafka_cfg: KafkaConfig) -> None:
    kafka = kafka_cfg.model_copy(update={"partitions": 2})
    with DeviceProducer(kafka, device="new", create_topic=True) as producer:
        producer.send(np.ones((2, 2), dtype=np.float32))
    again = DeviceProducer(kafka, device="new", create_topic=True)  # an existing topic is left as it is
    again.close()
    meta = make_admin(kafka).list_topics(kafka.topics.device("new"), timeout=10).topics[kafka.topics.device("new")]
    assert len(meta.partitions) == 2
    assert [s.seq for _, s in _read(kafka, "new")] == [0]


def test_a_topic_that_does_not_exist_fails_in_the_callback_and_at_flush(kafka_cfg: KafkaConfig) -> None:
    # The embedded broker does not create topics on first write: nobody made this one.
    failures: list[Delivery] = []
    producer = DeviceProducer(kafka_cfg, device="ghost", on_delivery=failures.append,
                              settings={"topic.metadata.propagation.max.ms": 500, "delivery.timeout.ms": 3000})
    for _ in range(3):
        producer.send(np.ones((2, 2), dtype=np.float32))
    with pytest.raises(DeliveryError, match=r"3 sample\(s\) of device 'ghost' could not be delivered to "
                                            rf"{kafka_cfg.topic_prefix}.device.ghost: 3 x .*nknown topic") as raised:
        producer.flush(30)
    assert raised.value.failed == 3 and len(raised.value.reasons) == 1
    assert [(f.seq, f.ok, f.offset) for f in failures] == [(0, False, None), (1, False, None), (2, False, None)]
    assert (producer.delivered, producer.failed, producer.queued) == (0, 3, 0)
    producer.close()


def test_records_the_broker_refuses_fail_at_close_with_count_and_reason(kafka_cfg: KafkaConfig) -> None:
    _create(kafka_cfg, "big", **{"max.message.bytes": "2048"})
    producer = DeviceProducer(kafka_cfg, device="big", settings={"compression.type": "none"})
    producer.send(np.ones((2, 2), dtype=np.float32))
    producer.flush(30)  # a small one is delivered ...
    for _ in range(2):
        producer.send(np.ones((4000, 1), dtype=np.float32))  # ... 16 kB ones are over the topic's limit
    with pytest.raises(DeliveryError, match=r"2 sample\(s\) .*: 2 x Broker: Message size too large"):
        producer.close()
    assert (producer.delivered, producer.failed) == (1, 2)
    assert [s.seq for _, s in _read(kafka_cfg, "big")] == [0]


def test_a_full_local_queue_waits_then_everything_is_delivered(kafka_cfg: KafkaConfig) -> None:
    _create(kafka_cfg, "0")
    with DeviceProducer(kafka_cfg, device="0", queue_wait_seconds=30,
                        settings={"queue.buffering.max.messages": 5, "linger.ms": 20}) as producer:
        for i in range(300):
            assert producer.send(np.full((3, 4), i, dtype=np.int32)) == i
        waited = producer.queue_waits
    assert waited > 0  # it really found the queue full ...
    assert (producer.delivered, producer.failed) == (300, 0)  # ... and lost nothing waiting
    assert [s.seq for _, s in _read(kafka_cfg, "0")] == list(range(300))


def test_leaving_the_context_flushes_what_lingers(kafka_cfg: KafkaConfig) -> None:
    _create(kafka_cfg, "0")
    with DeviceProducer(kafka_cfg, device="0", settings={"linger.ms": 60_000}) as producer:
        for _ in range(50):
            producer.send(np.zeros((1, 8), dtype=np.float16))
        lingering = producer.delivered
    assert lingering == 0  # still waiting to fill a batch for a minute ...
    assert producer.delivered == 50  # ... until leaving the block flushed them
    assert len(_read(kafka_cfg, "0")) == 50


def test_threads_and_shared_clients_number_each_device_without_gaps(kafka_cfg: KafkaConfig) -> None:
    _create(kafka_cfg, "a", "b")
    client = make_producer(kafka_cfg)
    a = DeviceProducer(kafka_cfg, device="a", client=client)
    b = DeviceProducer(kafka_cfg, device="b", client=client)

    def send(producer: DeviceProducer) -> None:
        for _ in range(200):
            producer.send(np.zeros((2, 1), dtype=np.int8))

    threads = [threading.Thread(target=send, args=(p,)) for p in (a, a, b, b, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a.close()
    b.close()
    assert (a.delivered, b.delivered) == (400, 600)
    assert sorted(s.seq for _, s in _read(kafka_cfg, "a")) == list(range(400))
    assert sorted(s.seq for _, s in _read(kafka_cfg, "b")) == list(range(600))
