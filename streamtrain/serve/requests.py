"""`streamtrain request`: a load generator that sends samples to `<prefix>.requests` at a steady rate.

What it sends, cycled, each request keeping its true label so predictions can be scored: the held-out set the
trainers evaluate on (`trainer.eval_packaged` / `trainer.eval_path`, as `up --dataset` sets it); else the data
the configuration replays (`producer.dataset.packaged`: its test split; `producer.dataset.path`); else samples
of the synthetic task of the configured shape (`trainer.num_features`). When `versions.dir` holds a version, the
samples must fit it ((size, its num_features)): requests `serve` could only refuse as `wrong-shape` are not
sent, and the error names the settings to change. `up --serve` and `bench freshness` run it beside `serve`, so
a new version is answered with as soon as the next request arrives (1 / rate later at most).
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
from streamtrain.versions import VersionError, read_version, version_dirs
from streamtrain.wire import Sample, encode

__all__ = ["REQUEST_DEVICE", "RequestSender", "request_payloads"]

logger = logging.getLogger(__name__)

#: The `device_id` of every request sample.
REQUEST_DEVICE = "request"


def _dataset_file(config: StreamtrainConfig) -> tuple[Path | None, str]:
    """The file requests come from, and the setting that names it (None: no dataset is configured)."""
    trainer, dataset = config.trainer, config.producer.dataset
    if trainer.eval_packaged is not None:
        return packaged_file(trainer.eval_packaged, "test"), "trainer.eval_packaged"
    if trainer.eval_path is not None:
        return trainer.eval_path, "trainer.eval_path"
    if dataset.packaged is not None:
        return packaged_file(dataset.packaged, "test"), "producer.dataset.packaged"
    return dataset.path, "producer.dataset.path"


def request_payloads(config: StreamtrainConfig, limit: int = 4096) -> tuple[list[np.ndarray], list[int | None], str]:
    """The arrays (and labels) requests cycle through, and where they come from (see the module doc).

    Raises:
        DatasetError: the configured data cannot be read, or its samples do not fit the newest version in
            `versions.dir` (the message names the settings).
    """
    trainer, reading = config.trainer, config.producer.dataset
    path, setting = _dataset_file(config)
    if path is not None:
        data = load_dataset(path, reading.label_column, reading.sample_column, reading.class_names,
                            reading.target_columns)
        arrays = list(data.samples[:limit])
        labels = [int(v) if v >= 0 else None for v in data.labels[:limit]]
        source = f"{path} ({setting})"
    else:
        samples = synthetic_samples([8 + (13 * i) % 57 for i in range(min(limit, 256))], trainer.num_features,
                                    trainer.num_classes, seed=7)
        arrays, labels = [s.array() for s in samples], [s.label for s in samples]
        source = f"the synthetic task (trainer.num_features={trainer.num_features})"
    _check_fit(config, arrays, source)
    return arrays, labels, source


def _check_fit(config: StreamtrainConfig, arrays: list[np.ndarray], source: str) -> None:
    """Refuse samples that do not fit the newest version in `versions.dir` (nothing to check without one)."""
    root = config.versions.dir
    found = version_dirs(root) if root is not None else []
    if not found or not arrays:
        return
    try:
        spec, _ = read_version(found[-1][1])
    except VersionError:
        return  # serve says what is wrong with it
    width = arrays[0].shape[1] if arrays[0].ndim == 2 else None
    if width != spec.num_features:
        raise DatasetError(f"the samples of {source} are (size, {width}), but version {spec.version} in "
                           f"{root} (versions.dir) takes (size, {spec.num_features}): serve would refuse every "
                           "request as wrong-shape. Name the data the model was trained on: --set "
                           "trainer.eval_packaged=NAME (plaid, tecator, ...), trainer.eval_path=FILE or "
                           "producer.dataset.packaged, or the --config the run used")


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
