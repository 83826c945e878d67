"""`DeviceProducer`: an application publishes its device's samples to streamtrain.

It has the shape of confluent-kafka's `Producer` without the wire: `send` an array (non-blocking),
delivery outcomes by callback, `flush`, `close`, a context manager. Under it is an idempotent
producer with `acks=all` (`streamtrain.kafka.producer_settings`), so retries while the broker is away
never duplicate or reorder a device's samples, and a record acknowledged is a record kept.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any

import numpy as np
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ..authz import AuthorizationError, raise_if_refused
from ..config import KafkaConfig, StreamtrainConfig, load_config
from ..kafka import TopicSpec, ensure_topics, make_admin, producer_settings
from .errors import DeliveryError, DeviceProducerError, QueueFullError
from .samples import DeviceEncoder, EncodedSample, seq_of

__all__ = ["Delivery", "DeliveryCallback", "DeviceProducer"]

logger = logging.getLogger(__name__)

#: Longest single wait for room in a full queue: callbacks are served and the deadline checked this often.
_POLL_S = 0.05
_monotonic = time.monotonic
#: Shortest time between two polls for delivery reports from `send`.
_SEND_POLL_S = 0.001
#: Failures logged one by one before only the count is kept (a dead broker fails every record).
_LOGGED_FAILURES = 10
_GUARANTEES = ("enable.idempotence", "acks")
_TOO_LARGE = (KafkaError.MSG_SIZE_TOO_LARGE,)
_BROKER_DOWN = (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT)
#: Codes of the fatal errors `streamtrain.kafka_errors` makes of a setting the broker refuses (login, TLS).
_REFUSED_SETTINGS = (KafkaError._AUTHENTICATION, KafkaError._SSL, KafkaError._TRANSPORT)


@dataclass(frozen=True)
class Delivery:
    """The outcome of one sent sample, as the delivery callbacks receive it."""

    device: str
    seq: int
    """The number `send` gave the sample (and returned)."""
    size: int
    """Its size, `array.shape[0]`."""
    topic: str
    partition: int | None
    """Where it was written; None when it failed."""
    offset: int | None
    """Its offset in that partition (the record's identity in every streamtrain account); None when it failed."""
    nbytes: int
    """Bytes of the record's value."""
    error: str | None
    """Why it failed (librdkafka's error text), None when it was delivered."""

    @property
    def ok(self) -> bool:
        """Whether Kafka acknowledged the sample."""
        return self.error is None


#: A function told each sample's outcome.
DeliveryCallback = Callable[[Delivery], None]


class DeviceProducer:
    """Publishes one device's samples to its topic `<prefix>.device.<id>`.

    ```python
    with DeviceProducer("localhost:9092", device="0") as producer:
        producer.send(np.random.rand(120, 16).astype(np.float32), label=3)
    ```

    `send` checks the sample, numbers it, encodes it (`streamtrain.wire.encode`) and queues it;
    Kafka's acknowledgement arrives later. Each outcome goes to the `on_delivery` callbacks (the
    producer's and the send's), and the counters (`sent`, `delivered`, `failed`, `queued`) follow
    them. A failure is never silent: `flush` and `close` raise `DeliveryError` naming how many
    samples failed since the last such error, and why.

    Thread-safety: `send`, `poll`, `flush`, `close` and the counters may be used from several
    threads; the samples sent from several threads are numbered without gaps in the order they were
    queued. Callbacks run in whichever thread is inside `send`, `poll`, `flush` or `close` when the
    outcome arrives, and must not call `send` themselves (a callback served while `send` waits for
    room in a full queue would wait for itself). Several producers may share one client (`client=`):
    each numbers and counts only its own samples.

    Args:
        kafka: where Kafka is and how to reach it, as every service is told: a `KafkaConfig` (topic prefix and
            security settings included), a whole `StreamtrainConfig` (its `kafka` section, and the `producer`
            section's `delivery_timeout_seconds` and `client` settings), or None: the configuration the services
            load (the TOML file of $STREAMTRAIN_CONFIG, then STREAMTRAIN_* environment variables, then
            defaults). A bootstrap string such as "localhost:9092" is that loaded configuration with this
            address.
        device: the device id (letters, digits, '_', '-', single dots); the topic's last part.
        on_delivery: called with each sample's `Delivery` (also when `send` got its own callback).
        queue_wait_seconds: how long `send` waits for room when the local queue is full (Kafka is slower
            than the sender, or away) before raising `QueueFullError`; callbacks are served meanwhile.
        settings: extra librdkafka producer settings by dotted key (`linger.ms`, `queue.buffering.max.messages`,
            `delivery.timeout.ms`, ...) for the client this producer makes; idempotence and acks stay.
        client: a producer made by `streamtrain.kafka.make_producer` to share with other device producers
            (it is flushed, not closed, by `close`; its owner serves its errors and closes it).
        create_topic: create the device's topic when it does not exist yet (with the configuration's
            `kafka.partitions`, `replication_factor` and `retention_seconds`), as `streamtrain produce` does.
            Off by default: `streamtrain up` and the deployment's set-up create topics, and a device's
            principal on a cluster with ACLs may write its topic but not create it.

    Raises:
        ValueError: an illegal device id, a negative wait, `settings` that would weaken the guarantees,
            or `settings` given with `client`.
        ConfigError: the loaded configuration has a bad setting (the error names it and where it came from).
        DeviceProducerError: `create_topic` could not create the topic.
        AuthorizationError: `create_topic` was refused by the cluster's ACLs (the message names the permission).
    """

    def __init__(
        self,
        kafka: KafkaConfig | StreamtrainConfig | str | None = None,
        *,
        device: str,
        on_delivery: DeliveryCallback | None = None,
        queue_wait_seconds: float = 60.0,
        settings: Mapping[str, Any] | None = None,
        client: Producer | None = None,
        create_topic: bool = False,
    ) -> None:
        cfg, defaults = _resolve(kafka)
        self.kafka = cfg
        self.device = device
        self.topic = cfg.topics.device(device)
        if not (queue_wait_seconds >= 0 and math.isfinite(queue_wait_seconds)):
            raise ValueError(f"queue_wait_seconds must be a finite number >= 0, not {queue_wait_seconds}")
        self.queue_wait_seconds = float(queue_wait_seconds)
        self._on_delivery = on_delivery
        overrides = dict(settings or {})
        for key in _GUARANTEES:
            if key in overrides:
                raise ValueError(f"settings[{key!r}] cannot be overridden: device producers are always idempotent "
                                 "with acks=all")
        if client is not None and overrides:
            raise ValueError("settings configure the client a DeviceProducer makes; a shared client= has its own")
        if create_topic:
            _create_topic(cfg, self.topic)
        self._fatal: KafkaError | None = None
        self._broker_up = True
        self._owns_client = client is None
        # confluent-kafka's own Producer rather than make_producer's GuardedProducer: `_reported` checks every
        # report for an ACL refusal itself, and the guard's wrapper would cost a Python call per sample.
        self._client = client if client is not None else Producer(
            producer_settings(cfg, **{**defaults, **overrides, "error_cb": self._on_error}))
        self._encoder = DeviceEncoder(device)
        self._encode = self._encoder.encode
        self._count = self._counted  # bound once: send hands it to every record
        self._send_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._next_seq = 0
        self._next_poll = 0.0
        self._delivered = self._failed = self._queue_waits = 0
        self._reasons: Counter[str] = Counter()
        self._unraised: Counter[str] = Counter()
        self._closed = False

    # ---- sending -----------------------------------------------------------------------------

    def send(
        self,
        array: np.ndarray,
        *,
        label: int | None = None,
        target: Sequence[float] | np.ndarray | float | None = None,
        metadata: Mapping[str, str] | None = None,
        produced_at: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> int:
        """Queue one sample for delivery; returns at once with the sample's number (seq).

        Args:
            array: the payload, a numpy array whose first axis is the size axis (frames, tokens, rows):
                its size is `array.shape[0]`. dtype float32, float16, float64, int8, int16, int32, int64
                or uint8; any byte order or memory layout (it is sent little-endian, row-major).
            label: class index (classification), or None.
            target: float target (regression values, multi-label 0/1 tags: a number or a sequence,
                flattened row-major), or None.
            metadata: extra str -> str metadata kept with the sample.
            produced_at: when the sample was produced, ms since the Unix epoch; None stamps now.
            on_delivery: called with this sample's `Delivery`, after the producer's own callback.

        Returns:
            The sample's seq: 0, 1, 2, ... in the order samples were queued (a refused sample takes none).

        Raises:
            TypeError: a dtype the wire lacks, a label that is not an int, metadata that is not str -> str,
                a target that is not numbers, a produced_at that is not int milliseconds.
            ValueError: a 0-d array, an empty size axis, NaN or infinity in a float array or the target, or
                a record over librdkafka's `message.max.bytes`.
            QueueFullError: the local queue stayed full for `queue_wait_seconds` (nothing was queued).
            DeviceProducerError: the producer is closed, its client failed fatally, or the cluster refused a
                setting (a login, TLS: the message names it and the setting to change).
        """
        if self._closed or self._fatal is not None:
            self._check_usable()
        lock = self._send_lock
        lock.acquire()
        try:
            seq = self._next_seq
            record = self._encode(seq, array, label=label, target=target, metadata=metadata, produced_at=produced_at)
            # Without callbacks to tell, one bound method counts every report (no per-record closure to make).
            callback = (self._count if on_delivery is None and self._on_delivery is None else
                        partial(self._reported, seq, record.size, on_delivery))
            try:
                self._client.produce(self.topic, record.value, headers=record.headers, on_delivery=callback)
            except BufferError:
                self._enqueue(record, callback)
            except KafkaException as exc:
                raise _refused(exc.args[0], record, self) from None
            self._next_seq = seq + 1  # also the count sent: every sample queued took the next number
        finally:
            lock.release()
        # Serve the delivery reports that have arrived (the confluent-kafka pattern), at most once a millisecond:
        # a sender at line rate serves them in batches rather than paying an empty poll per record.
        now = _monotonic()
        if now >= self._next_poll:
            self._next_poll = now + _SEND_POLL_S
            self._client.poll(0)
        return seq

    def _enqueue(self, record: EncodedSample, callback: Callable[[KafkaError | None, Message], None]) -> None:
        """Hand the record to librdkafka, waiting (bounded, serving callbacks) while its queue is full."""
        deadline: float | None = None
        while True:
            try:
                self._client.produce(self.topic, record.value, headers=record.headers, on_delivery=callback)
                return
            except BufferError:
                now = time.monotonic()
                deadline = now + self.queue_wait_seconds if deadline is None else deadline
                if now >= deadline:
                    raise QueueFullError(
                        f"device {self.device!r}: the local queue ({len(self._client)} records) stayed full for "
                        f"{self.queue_wait_seconds:g} s: Kafka at {self.kafka.bootstrap_servers} takes records more "
                        "slowly than they are sent, or is unreachable. The sample was not queued; send it again "
                        "later, or allow a longer queue_wait_seconds") from None
                with self._count_lock:
                    self._queue_waits += 1
                self._client.poll(min(_POLL_S, deadline - now))
                self._check_usable()
            except KafkaException as exc:
                raise _refused(exc.args[0], record, self) from None

    def _counted(self, err: KafkaError | None, msg: Message) -> None:
        """A delivery report when no callback is to be told: a delivery is counted, a failure goes the full way."""
        if err is None:
            lock = self._count_lock
            lock.acquire()
            try:
                self._delivered += 1
            finally:
                lock.release()
        else:
            self._reported(seq_of(msg.value() or b"", len(self._encoder.head)), -1, None, err, msg)

    def _reported(self, seq: int, size: int, own: DeliveryCallback | None, err: KafkaError | None,
                  msg: Message) -> None:
        """librdkafka's delivery report of sample `seq`: count it, then tell the callbacks."""
        failed = 0
        with self._count_lock:
            if err is None:
                self._delivered += 1
            else:
                reason = err.str()
                self._failed += 1
                self._reasons[reason] += 1
                self._unraised[reason] += 1
                failed = self._failed
        if err is not None and failed <= _LOGGED_FAILURES:
            logger.error("device %s: sample %d could not be delivered to %s: %s%s", self.device, seq, self.topic,
                         err.str(), " (further failures are counted, not logged)" if failed == _LOGGED_FAILURES
                         else "")
        if self._on_delivery is not None or own is not None:
            if err is None:
                delivery = Delivery(self.device, seq, size, self.topic, msg.partition(), msg.offset(), len(msg), None)
            else:
                delivery = Delivery(self.device, seq, size, self.topic, None, None, len(msg), err.str())
            if self._on_delivery is not None:
                self._on_delivery(delivery)
            if own is not None:
                own(delivery)
        if err is not None:
            # A write the ACLs refuse is a deployment error, not a lost sample: it stops the sender (raised from
            # send, poll or flush), naming the principal and the ACL it lacks.
            raise_if_refused(self.kafka, err, "WRITE", self.topic)

    def _on_error(self, err: KafkaError) -> None:
        """Client-level errors of a client this producer made (a shared client's owner serves its own).

        A setting the broker refuses (credentials, TLS: `streamtrain.kafka_errors` explains it) ends the call
        that served it (`send`, `poll`, `flush`) with a `DeviceProducerError` saying which, as does every later
        call: librdkafka would retry it for good, and the samples would only time out.
        """
        if err.fatal():
            refused = err.code() in _REFUSED_SETTINGS
            if self._fatal is None:
                logger.error("device %s: %s%s", self.device, "" if refused else "the producer failed fatally: ",
                             err.str())
            self._fatal = err
            if refused:
                raise DeviceProducerError(f"device {self.device!r}: {err.str()}")
        elif err.code() in _BROKER_DOWN:
            if self._broker_up:
                logger.warning("device %s: Kafka unreachable (%s): samples wait in the local queue and are retried",
                               self.device, err.str())
            self._broker_up = False
        else:
            logger.info("device %s: %s", self.device, err.str())

    # ---- finishing ---------------------------------------------------------------------------

    def poll(self, timeout: float = 0.0) -> None:
        """Serve the delivery reports that have arrived (waiting up to `timeout` seconds for one).

        `send` does this at most once a millisecond; call it when sending rarely, or before reading the counters, to
        have callbacks and counters up to date.
        """
        self._client.poll(timeout)

    def flush(self, timeout: float | None = None) -> int:
        """Wait until every queued sample is delivered or failed, or `timeout` seconds have passed.

        Args:
            timeout: seconds to wait; None waits until librdkafka gives each record its outcome (at most
                its `delivery.timeout.ms`, 120 s by default).

        Returns:
            This producer's samples still queued (0 when all have their outcome).

        Raises:
            DeliveryError: samples failed since the last `DeliveryError` (how many, and why).
            DeviceProducerError: the client failed fatally.
        """
        self._client.flush(-1 if timeout is None else timeout)
        self._raise_failures()
        return self.queued

    def close(self, timeout: float | None = None) -> None:
        """Flush, then stop: samples still queued after `timeout` are given up and count as failed.

        Closing twice does nothing. A shared client (`client=`) is flushed, not purged: its owner ends it.

        Raises:
            DeliveryError: samples failed since the last `DeliveryError`, those given up here included.
        """
        if self._closed:
            return
        self._closed = True
        left = self._client.flush(-1 if timeout is None else timeout)
        if left and self._owns_client:
            logger.error("device %s: %d sample(s) still undelivered after %.0f s; giving them up", self.device, left,
                         timeout or 0.0)
            self._client.purge()  # their delivery reports come back failed: counted, and raised below
            self._client.flush(5.0)
        self._raise_failures()

    def __enter__(self) -> DeviceProducer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Close (flushing every sample); a `DeliveryError` is raised unless another exception is already."""
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except DeviceProducerError as error:  # the exception on its way out matters more; this one is logged
            logger.error("%s", error)

    def _check_usable(self) -> None:
        if self._closed:
            raise DeviceProducerError(f"device {self.device!r}: the producer is closed")
        if self._fatal is not None:
            raise DeviceProducerError(self._fatal_message())

    def _fatal_message(self) -> str:
        assert self._fatal is not None
        if self._fatal.code() in _REFUSED_SETTINGS:
            return f"device {self.device!r}: {self._fatal.str()}"
        return f"device {self.device!r}: the producer failed fatally: {self._fatal.str()}"

    def _raise_failures(self) -> None:
        with self._count_lock:
            unraised, self._unraised = self._unraised, Counter()
        if self._fatal is not None:
            raise DeviceProducerError(self._fatal_message())
        if unraised:
            raise DeliveryError(self.device, self.topic, unraised)

    # ---- counters ----------------------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        """The seq the next sample will get."""
        return self._next_seq

    @property
    def sent(self) -> int:
        """Samples queued by `send` so far."""
        return self._next_seq

    @property
    def delivered(self) -> int:
        """Samples Kafka acknowledged."""
        return self._delivered

    @property
    def failed(self) -> int:
        """Samples that could not be delivered."""
        return self._failed

    @property
    def queued(self) -> int:
        """Samples sent whose outcome has not arrived yet."""
        with self._count_lock:
            return self._next_seq - self._delivered - self._failed

    @property
    def queue_waits(self) -> int:
        """Times `send` found the local queue full and waited (back-pressure; ~50 ms each)."""
        return self._queue_waits

    @property
    def failure_reasons(self) -> dict[str, int]:
        """Every failure so far: librdkafka's error text -> how many samples."""
        with self._count_lock:
            return dict(self._reasons)


def _resolve(kafka: KafkaConfig | StreamtrainConfig | str | None) -> tuple[KafkaConfig, dict[str, Any]]:
    """The Kafka settings, and the producer-section defaults a whole configuration brings."""
    if isinstance(kafka, KafkaConfig):
        return kafka, {}
    if kafka is None or isinstance(kafka, str):
        # As every service loads it: $STREAMTRAIN_CONFIG, then STREAMTRAIN_* variables (topic prefix, security).
        kafka = load_config(overrides={"kafka.bootstrap_servers": kafka})
    if isinstance(kafka, StreamtrainConfig):
        producer = kafka.producer
        return kafka.kafka, {"delivery.timeout.ms": round(producer.delivery_timeout_seconds * 1000), **producer.client}
    raise TypeError(f"kafka must be a KafkaConfig, a StreamtrainConfig, a bootstrap string or None, not "
                    f"{type(kafka).__name__}")


def _create_topic(cfg: KafkaConfig, topic: str) -> None:
    try:
        ensure_topics(make_admin(cfg), [TopicSpec.from_config(cfg, topic)])
    except AuthorizationError:
        raise
    except KafkaException as exc:
        raise DeviceProducerError(f"could not create topic {topic} on {cfg.bootstrap_servers}: {exc}") from None


def _refused(error: KafkaError, record: EncodedSample, producer: DeviceProducer) -> Exception:
    """The error to raise when librdkafka refuses a record outright (nothing was queued)."""
    if error.code() in _TOO_LARGE:
        return ValueError(f"device {producer.device!r}: the sample's record is {len(record.value):,} bytes, over "
                          f"librdkafka's message.max.bytes ({error.str()}): send smaller samples, or raise "
                          "message.max.bytes in settings= and the topic's max.message.bytes")
    return DeviceProducerError(f"device {producer.device!r}: librdkafka refused the sample: {error.str()}")
