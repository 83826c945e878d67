"""Variable-size samples through the real broker: produced to 4 device topics, read back, every seq checked."""

from __future__ import annotations

import numpy as np
import pytest
from confluent_kafka import KafkaError, Message

from streamtrain.config import KafkaConfig
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin, make_producer, produce, read_to_end
from streamtrain.report.accounting import SeqLedger
from streamtrain.wire import SIZE_HEADER, Sample, decode, encode

pytestmark = pytest.mark.integration

DEVICES = ["cam-0", "cam-1", "lidar-2", "mic-3"]
PER_DEVICE = 2500  # 10,000 samples in all


def test_10k_variable_size_samples_round_trip_with_every_seq_and_size(kafka_cfg: KafkaConfig) -> None:
    topics = {d: kafka_cfg.topics.device(d) for d in DEVICES}
    ensure_topics(make_admin(kafka_cfg), [TopicSpec.from_config(kafka_cfg, t) for t in topics.values()])
    rng = np.random.default_rng(42)
    sizes = {d: np.maximum(1, rng.normal(45, 32, PER_DEVICE).round()).astype(int) for d in DEVICES}
    dtypes = ["float32", "float16", "int16", "uint8"]
    failures: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(err)

    producer = make_producer(kafka_cfg)
    for seq in range(PER_DEVICE):
        for i, device in enumerate(DEVICES):
            arr = rng.integers(0, 100, size=(int(sizes[device][seq]), 1 + i)).astype(dtypes[i])
            value, headers = encode(Sample.from_array(device, seq, arr, label=seq % 7))
            produce(producer, topics[device], value, headers, delivered)
    assert producer.flush(60) == 0
    assert failures == []

    ledger = SeqLedger()
    for msg in read_to_end(kafka_cfg, topics.values()):
        sample = decode(msg.value(), msg.headers(), Sample)
        assert msg.topic() == topics[sample.device_id]  # each device's samples only in its own topic
        assert dict(msg.headers() or [])[SIZE_HEADER] == str(sample.size).encode()
        assert sample.size == sizes[sample.device_id][sample.seq]
        assert sample.shape == (sample.size, 1 + DEVICES.index(sample.device_id))
        assert sample.label == sample.seq % 7
        ledger.add(sample.device_id, sample.seq)
    for device in DEVICES:
        account = ledger.account(device, PER_DEVICE)
        assert account.exact, account
    observed = np.concatenate([sizes[d] for d in DEVICES])
    assert 40 < observed.mean() < 50 and 25 < observed.std() < 35  # the variable sizes really varied
