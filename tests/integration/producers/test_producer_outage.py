"""A broker outage in the middle of a run: the producers wait, retry, and lose nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from streamtrain.config import KafkaConfig, ProducerConfig
from streamtrain.kafka import read_to_end
from streamtrain.producers.service import ProducerSummary, StreamProducer
from streamtrain.report.accounting import SeqLedger
from streamtrain.wire import Sample, decode

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.slow]


def test_broker_killed_and_restarted_mid_run_loses_nothing(broker_factory: Callable[..., Any]) -> None:
    broker = broker_factory()
    kafka = KafkaConfig(bootstrap_servers=broker.start(), topic_prefix="outage")
    cfg = ProducerConfig.model_validate({"devices": 3, "duration_seconds": 14.0, "metrics": False,
                                         "rate": {"kind": "constant", "mean": 100}})
    producer = StreamProducer(kafka, cfg)
    result: dict[str, ProducerSummary] = {}
    worker = threading.Thread(target=lambda: result.setdefault("summary", producer.run()))
    worker.start()
    time.sleep(3.0)
    broker.kill()  # SIGKILL: no clean shutdown
    time.sleep(2.5)
    assert not producer.broker_up or producer.snapshot().queued > 0  # it noticed, and records queue up
    broker.start()  # same data directory and port
    worker.join(timeout=120)
    assert not worker.is_alive()
    summary = result["summary"]
    assert summary.ok, summary.failures[:5]
    assert producer.broker_up

    ledger = SeqLedger()
    for msg in read_to_end(kafka, producer.topics):
        sample = decode(msg.value(), msg.headers(), Sample)
        ledger.add(sample.device_id, sample.seq)
    for d, device in enumerate(producer.ids):
        produced = int(producer.next_seq[d])
        assert produced >= 1300  # the stream went on through the outage (100/s for 14 s)
        account = ledger.account(device, produced)
        assert account.exact, account  # every seq read back exactly once
