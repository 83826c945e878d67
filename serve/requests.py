"""`streamtrain request`: a load generator that sends samples to `<prefix>.requests` at a steady rate.

What it sends: the held-out set the trainers evaluate on (`trainer.eval_packaged` / `trainer.eval_path`, as
`up --dataset` sets it), cycled, each request keeping its true label so predictions can be scored; without
one, samples of the synthetic task of the configured shape. `up --serve` and `bench freshness` run it beside
`serve`, so a new version is answered with as soon as the next request arrives (1 / rate later at most).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from confluent_kafka import KafkaError, Message

from streamtrain.config import StreamtrainConfig
from streamtrain.datasets import DatasetError, load_dataset, packaged_file
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin, make_producer, produce
from streamtrain.synthetic import synthetic_samples
from streamtrain.wire import Sample, encode

__all__ = ["REQUEST_DEVICE", "RequestSender", "request_payloads"]

logger = logging.getLogger(__name__)

#: The `device_id` of every request sample.
REQUEST_DEVICE = "request"


def request_payloads(config: StreamtrainConfig, limit: int = 4096) -> tuple[list[np.ndarray], list[int], str]:
    """The arrays (and labels) requests cycle through, and where they come from.

    Raises:
        DatasetError: the configured held-out set cannot be read.
    """
    trainer = config.trainer
    reading = config.producer.dataset
    path: Path | None = None
    if trainer.eval_packaged is not None:
        path = packaged_file(trainer.eval_packaged, "test")
    elif trainer.eval_path is not None:
        path = trainer.eval_path
    if path is not None:
        data = load_dataset(path, reading.label_column, reading.sample_column, reading.class_names)
        return list(data.samples[:limit]), [int(v) for v in data.labels[:limit]], str(path)
    samples = synthetic_samples([8 + (13 * i) % 57 for i in range(min(limit, 256))], trainer.num_features,
                                trainer.num_classes, seed=7)
    return [s.array() for s in samples], [int(s.label or 0) for s in samples], "the synthetic task"


@dataclass
class RequestSender:
    """Sends request samples at `rate` per second until stopped, the duration is up or `count` are sent.

    Args:
        config: Kafka, topic prefix, and what to send (see `request_payloads`).
        rate: Requests per second.
    """

    config: StreamtrainConfig
    rate: float
    sent: int = 0
    failed: int = 0

    def run(self, duration: float | None = None, count: int | None = None,
            stop: Callable[[], bool] = lambda: False) -> int:
        """Send until `duration` seconds, `count` requests or `stop()`; returns the requests delivered.

        Raises:
            DatasetError: the samples to send cannot be read.
        """
        arrays, labels, source = request_payloads(self.config)
        if not arrays:
            raise DatasetError(f"{source} holds no samples to send")
        topic = self.config.kafka.topics.requests
        ensure_topics(make_admin(self.config.kafka), [TopicSpec.from_config(self.config.kafka, topic)])
        producer = make_producer(self.config.kafka, **{"linger.ms": 0})
        logger.info("sending requests from %s to %s at %g/s", source, topic, self.rate)
        began = time.monotonic()
        try:
            while not stop() and (duration is None or time.monotonic() - began < duration) and (
                    count is None or self.sent < count):
                due = began + self.sent / self.rate
                wait = due - time.monotonic()
                if wait > 0:
                    producer.poll(min(wait, 0.1))  # serves delivery callbacks while it waits
                    continue
                i = self.sent % len(arrays)
                value, headers = encode(Sample.from_array(REQUEST_DEVICE, self.sent, arrays[i], label=labels[i]))
                produce(producer, topic, value, headers, self._delivered)
                self.sent += 1
        finally:
            left = producer.flush(30)
        return self.sent - self.failed - left

    def _delivered(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.failed += 1
            logger.error("a request could not be delivered: %s", err)
