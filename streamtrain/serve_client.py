"""`ServeClient`: send samples to `streamtrain serve` and read its predictions back.

`serve` reads requests from `<prefix>.requests` (samples on the device topics' wire) and writes one `Prediction`
per request to `<prefix>.predictions`, naming the request's partition and offset. The client sends arrays as
requests, remembers where each landed, and reads the predictions topic until each has its answer:

    from streamtrain import ServeClient

    with ServeClient("localhost:9092") as client:        # the address `up` prints; topic prefix as configured
        predictions = client.predict([series_a, series_b])  # Predictions, as load_model(...).predict answers
        print(predictions.names, predictions.probabilities, predictions.versions)

`predict` answers in the one shape every way to predict has (`Predictions`, one row per array, plus the version
that made each row) and raises if `serve` refused any. `answers(send(arrays))` gives the `Prediction` records
themselves: each the version that made it and the objective's output (`label`, `label_name`, `probabilities`;
`values`; `tags`), or an `error` reason and no output (`wrong-shape`, `invalid-sample`, ...: see
`streamtrain.versions.sample_problem`). `announce_version` puts a version written by
hand (or one to roll back to) before `serve`, as the trainers announce theirs.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

import numpy as np
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from .config import KafkaConfig, StreamtrainConfig, load_config
from .kafka import consume_available, make_consumer, make_producer, produce, tail_positions
from .predictions import Predictions
from .wire import ModelVersion, Prediction, Sample, WireError, decode, encode

__all__ = ["ServeClient", "announce_version"]

logger = logging.getLogger(__name__)

#: A request's place in Kafka: (partition, offset) of `<prefix>.requests`.
Request = tuple[int, int]


def _kafka(kafka: KafkaConfig | StreamtrainConfig | str | None) -> KafkaConfig:
    """The Kafka settings, as `DeviceProducer` takes them (None: the configuration the services load)."""
    if isinstance(kafka, KafkaConfig):
        return kafka
    if isinstance(kafka, StreamtrainConfig):
        return kafka.kafka
    return load_config(overrides={"kafka.bootstrap_servers": kafka}).kafka


class ServeClient:
    """Requests to `serve` and their predictions, by request offset.

    Args:
        kafka: Where Kafka is, as `DeviceProducer` takes it: a `KafkaConfig`, a whole `StreamtrainConfig`, a
            bootstrap address ("localhost:9092": the configuration the services load, with this address), or
            None (that configuration as it is: $STREAMTRAIN_CONFIG, STREAMTRAIN_* variables). The topic prefix is
            its `kafka.topic_prefix`.
        client_id: The `device_id` of the request samples.
        timeout: Seconds to wait for the predictions topic to exist (`serve` creates it when it starts).

    Raises:
        KafkaException: the predictions topic does not exist (is `serve` running on this prefix?) or Kafka does
            not answer.
    """

    def __init__(self, kafka: KafkaConfig | StreamtrainConfig | str | None = None, *, client_id: str = "client",
                 timeout: float = 30.0) -> None:
        self.kafka = _kafka(kafka)
        self.client_id = client_id
        self.topics = self.kafka.topics
        self._seq = 0
        self._producer = make_producer(self.kafka, **{"linger.ms": 0})
        # Its own group id, never committed: it reads the predictions made after it started, by assignment.
        self._consumer = make_consumer(self.kafka, f"streamtrain-client-{uuid.uuid4().hex[:12]}")
        try:
            ends = tail_positions(self._consumer, self.topics.predictions, 0, timeout)
        except KafkaException as exc:
            self._consumer.close()
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART,
                                            f"{self.topics.predictions} cannot be read at "
                                            f"{self.kafka.bootstrap_servers} ({exc}): is serve running with "
                                            f"kafka.topic_prefix={self.kafka.topic_prefix}?")) from None
        self._consumer.assign([TopicPartition(self.topics.predictions, p, high) for p, (_low, high) in ends.items()])
        self._answers: dict[Request, Prediction] = {}

    def send(self, arrays: Sequence[np.ndarray] | np.ndarray, timeout: float = 30.0) -> list[Request]:
        """Send each array (one sample, (size, num_features)) as a request; returns where each landed, in order.

        Raises:
            KafkaException: a request could not be delivered within `timeout`.
        """
        if isinstance(arrays, np.ndarray) and arrays.ndim == 2:
            arrays = [arrays]
        placed: list[Request | None] = [None] * len(arrays)
        failed: list[str] = []

        def delivered(index: int) -> Callable[[KafkaError | None, Message], None]:
            def callback(err: KafkaError | None, msg: Message) -> None:
                if err is not None:
                    failed.append(err.str())
                else:
                    placed[index] = (msg.partition() or 0, msg.offset() or 0)
            return callback

        for i, array in enumerate(arrays):
            value, headers = encode(Sample.from_array(self.client_id, self._seq, np.asarray(array)))
            self._seq += 1
            produce(self._producer, self.topics.requests, value, headers, delivered(i))
        left = self._producer.flush(timeout)
        if left or failed or any(p is None for p in placed):
            raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, f"{left + len(failed)} of {len(arrays)} "
                                            f"requests not delivered to {self.topics.requests}: "
                                            f"{failed[0] if failed else 'timed out'}"))
        return [p for p in placed if p is not None]

    def answers(self, requests: Sequence[Request], timeout: float = 30.0) -> list[Prediction]:
        """The prediction of each request (from `send`), in order, waiting up to `timeout` for the last.

        Raises:
            TimeoutError: some requests had no prediction in time (the message says how many; is a version
                live? `serve` answers only once one is).
        """
        wanted = set(requests)
        deadline = time.monotonic() + timeout
        while not wanted <= self._answers.keys():
            left = deadline - time.monotonic()
            if left <= 0:
                missing = len(wanted - self._answers.keys())
                raise TimeoutError(f"{missing} of {len(wanted)} requests had no prediction on "
                                   f"{self.topics.predictions} within {timeout:g} s: is serve running, and a model "
                                   "version live (serve's log says)?")
            for msg in consume_available(self._consumer, 500, min(left, 0.5)):
                if msg.error() is None:
                    self._keep(msg)
        return [self._answers.pop(r) for r in requests]

    def _keep(self, msg: Message) -> None:
        try:
            answer = decode(msg.value(), msg.headers(), Prediction)
        except WireError as exc:
            logger.warning("%s@%s is not a Prediction: %s", msg.topic(), msg.offset(), exc)
            return
        if answer.request_topic == self.topics.requests:  # other clients' answers are read past, not kept
            self._answers[(answer.request_partition, answer.request_offset)] = answer

    def predict(self, arrays: Sequence[np.ndarray] | np.ndarray, timeout: float = 30.0) -> Predictions:
        """`send` the arrays and return their predictions, one row each in order: the same `Predictions` a loaded
        model's `predict` answers with, plus `versions` (the model version that made each row). `answers` gives
        the `Prediction` records themselves, refusals included.

        Raises:
            KafkaException: a request could not be delivered.
            TimeoutError: some had no prediction within `timeout`.
            ValueError: serve refused some of them (the reason is named: the wrong shape, say).
        """
        return Predictions.from_records(self.answers(self.send(arrays, timeout), timeout))

    def close(self) -> None:
        """Deliver what is queued and leave Kafka."""
        self._producer.flush(10)
        self._consumer.close()

    def __enter__(self) -> ServeClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


def announce_version(kafka: KafkaConfig | StreamtrainConfig | str | None, directory: str | Path,
                     timeout: float = 30.0) -> ModelVersion:
    """Announce a version on `<prefix>.models`, as rank 0 announces the ones it writes, so `serve` considers it
    (it loads it, checks it fits and puts it to the promotion gate): a version written by hand, or an older one
    to roll back to (it must be newer than the live one: serve only moves forward).

    Args:
        kafka: Where Kafka is (as `ServeClient` takes it).
        directory: The version's directory (holding model.json).
        timeout: Seconds for Kafka to take the announcement.

    Raises:
        VersionError: the version cannot be read.
        KafkaException: the announcement was not delivered.
    """
    from .versions import read_version, resolve_version

    where = resolve_version(Path(directory))
    spec, _ = read_version(where)
    cfg = _kafka(kafka)
    record = ModelVersion(job=spec.job, version=spec.version, step=spec.step, location=str(where.resolve()),
                          metrics=dict(spec.metrics))
    producer = make_producer(cfg)
    value, headers = encode(record)
    failed: list[KafkaError] = []
    produce(producer, cfg.topics.models, value, headers, lambda err, _msg: failed.extend([err] if err else []),
            key=spec.job.encode())
    if producer.flush(timeout) or failed:
        raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, f"version {spec.version} not announced on "
                                        f"{cfg.topics.models}: {failed[0].str() if failed else 'timed out'}"))
    return record
