"""`DeviceProducer` without a broker: what it refuses before queueing, and how it fails when Kafka is unreachable.

The producer is real (librdkafka), pointed at an address nobody listens on: refusals must happen before
anything is queued or numbered; records that cannot reach Kafka must come back as failures.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamtrain
from streamtrain import Delivery, DeliveryError, DeviceProducer, DeviceProducerError, QueueFullError
from streamtrain.config import ConfigError, KafkaConfig, StreamtrainConfig
from streamtrain.publish import encode_device_sample
from streamtrain.publish.samples import DeviceEncoder, seq_of
from streamtrain.wire import Sample, decode, encode

NOBODY = "127.0.0.1:1"  # connection refused at once: nothing is ever delivered


@pytest.fixture
def producer() -> Iterator[DeviceProducer]:
    made = DeviceProducer(NOBODY, device="0")
    yield made
    with contextlib.suppress(DeliveryError):  # what a test left queued is given up
        made.close(timeout=0)


def test_public_names_are_importable_from_the_package() -> None:
    assert set(streamtrain.__all__) >= {"DeviceProducer", "DeliveryError", "QueueFullError", "DeviceProducerError"}
    assert streamtrain.DeviceProducer is DeviceProducer
    assert issubclass(DeliveryError, DeviceProducerError) and issubclass(QueueFullError, DeviceProducerError)
    with pytest.raises(AttributeError):
        _ = streamtrain.NoSuchName  # type: ignore[attr-defined]


@pytest.mark.parametrize(("array", "words"), [
    (np.zeros((3, 2), dtype=bool), "'bool'"),
    (np.zeros((3, 2), dtype=np.complex64), "'complex64'"),
    (np.zeros(3, dtype=np.uint16), "'uint16'"),
    (np.array([["a"], ["b"]]), "'str32'"),
    (np.array([object(), object()]), "'object'"),
])
def test_a_dtype_the_wire_lacks_is_a_type_error(producer: DeviceProducer, array: np.ndarray, words: str) -> None:
    with pytest.raises(TypeError, match=f"dtype {words} is not one the wire carries"):
        producer.send(array)
    assert (producer.sent, producer.next_seq, producer.queued) == (0, 0, 0)


@pytest.mark.parametrize(("array", "words"), [
    (np.float32(1.0), "0-d"),
    (np.array(3, dtype=np.int64), "0-d"),
    (np.zeros((0, 4), dtype=np.float32), r"empty size axis \(shape\[0\] = 0\)"),
    (np.array([[1.0, np.nan], [2.0, 3.0]], dtype=np.float32),
     r"1 NaN or infinite value\(s\), the first at index \(0, 1\)"),
    (np.array([[1.0], [np.inf], [-np.inf]], dtype=np.float64),
     r"2 NaN or infinite value\(s\), the first at index \(1, 0\)"),
    (np.array([[np.nan]], dtype=np.float16), "NaN or infinite"),
    (np.arange(30, dtype=np.float32), r"shape \(30,\) is 1-D: a sample is \(size, features\).*x.reshape\(-1, 1\)"),
])
def test_an_unusable_array_is_a_value_error(producer: DeviceProducer, array: np.ndarray, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        producer.send(array)
    assert (producer.sent, producer.next_seq) == (0, 0)


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"label": 1.0}, TypeError, "label must be an int .* not float"),
    ({"label": True}, TypeError, "label must be an int .* not bool"),
    ({"label": "3"}, TypeError, "label must be an int .* not str"),
    ({"label": 2**63}, ValueError, "does not fit the wire's 64-bit integer"),
    ({"target": [1.0, float("nan")]}, ValueError, r"target holds 1 NaN or infinite"),
    ({"target": np.array([np.inf])}, ValueError, "target holds 1 NaN or infinite"),
    ({"target": 1e39}, ValueError, "beyond 32-bit float range"),
    ({"target": ["a", "b"]}, TypeError, "target must be a number or a sequence of numbers"),
    ({"metadata": [("k", "v")]}, TypeError, "metadata must be a mapping of str to str, not list"),
    ({"metadata": {"k": 1}}, TypeError, "metadata must map str to str: 'k': 1 is str -> int"),
    ({"metadata": {2: "v"}}, TypeError, "metadata must map str to str"),
    ({"produced_at": 1.7e12}, TypeError, "produced_at must be int milliseconds .* not a float"),
    ({"produced_at": -5}, ValueError, "produced_at -5 is not milliseconds"),
])
def test_bad_label_target_metadata_or_time_are_refused_before_queueing(
        producer: DeviceProducer, kwargs: dict[str, Any], error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words):
        producer.send(np.ones((2, 3), dtype=np.float32), **kwargs)
    assert (producer.sent, producer.next_seq) == (0, 0)


def test_good_samples_are_numbered_in_order_and_wait_in_the_queue(producer: DeviceProducer) -> None:
    seqs = [producer.send(np.ones((n, 2), dtype=np.int16), label=np.int64(n), target=n / 2, metadata={"n": str(n)})
            for n in (1, 5, 9)]
    assert seqs == [0, 1, 2]
    assert (producer.sent, producer.queued, producer.delivered, producer.failed) == (3, 3, 0, 0)
    with pytest.raises(DeliveryError, match="3 x Local: Purged in queue"):
        producer.close(timeout=0)


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"device": "a/b"}, ValueError, "device id 'a/b' must be letters, digits"),
    ({"device": "0", "queue_wait_seconds": -1}, ValueError, "queue_wait_seconds must be a finite number >= 0"),
    ({"device": "0", "settings": {"acks": "1"}}, ValueError, r"settings\['acks'\] cannot be overridden"),
    ({"device": "0", "settings": {"enable.idempotence": False}}, ValueError, "always idempotent"),
])
def test_bad_construction_names_the_argument(kwargs: dict[str, Any], error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words):
        DeviceProducer(NOBODY, **kwargs)


def test_settings_with_a_shared_client_and_a_config_of_the_wrong_type_are_refused(producer: DeviceProducer) -> None:
    with pytest.raises(ValueError, match="a shared client= has its own"):
        DeviceProducer(NOBODY, device="1", client=producer._client, settings={"linger.ms": 1})
    with pytest.raises(TypeError, match="kafka must be a KafkaConfig, a StreamtrainConfig, a bootstrap string or None"):
        DeviceProducer({"bootstrap.servers": NOBODY}, device="1")  # type: ignore[arg-type]


def test_the_topic_follows_the_configured_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMTRAIN_CONFIG", raising=False)
    monkeypatch.delenv("STREAMTRAIN_KAFKA__TOPIC_PREFIX", raising=False)
    plain = DeviceProducer(NOBODY, device="cam-7")
    kafka = KafkaConfig(bootstrap_servers=NOBODY, topic_prefix="plant.a")
    configured = DeviceProducer(kafka, device="cam-7")
    whole = DeviceProducer(StreamtrainConfig(kafka=kafka), device="cam-7")
    assert plain.topic == "streamtrain.device.cam-7"
    assert configured.topic == whole.topic == "plant.a.device.cam-7"
    for made in (plain, configured, whole):
        made.close(timeout=0)


def test_a_bootstrap_string_or_none_takes_the_rest_from_the_services_configuration(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "st.toml").write_text('[kafka]\ntopic_prefix = "plant.b"\nbootstrap_servers = "127.0.0.1:2"\n')
    monkeypatch.setenv("STREAMTRAIN_CONFIG", str(tmp_path / "st.toml"))
    from_file = DeviceProducer(device="0")
    assert (from_file.kafka.bootstrap_servers, from_file.topic) == ("127.0.0.1:2", "plant.b.device.0")
    monkeypatch.setenv("STREAMTRAIN_KAFKA__TOPIC_PREFIX", "plant.c")
    addressed = DeviceProducer(NOBODY, device="0")
    assert (addressed.kafka.bootstrap_servers, addressed.topic) == (NOBODY, "plant.c.device.0")
    monkeypatch.setenv("STREAMTRAIN_KAFKA__PARTITIONS", "zero")
    with pytest.raises(ConfigError, match=r"kafka\.partitions"):
        DeviceProducer(NOBODY, device="0")
    for made in (from_file, addressed):
        made.close(timeout=0)


def test_a_record_over_message_max_bytes_is_refused_unnumbered() -> None:
    producer = DeviceProducer(NOBODY, device="0", settings={"message.max.bytes": 1000})
    with pytest.raises(ValueError, match=r"record is 6,4\d\d bytes, over librdkafka's message.max.bytes"):
        producer.send(np.zeros((100, 16), dtype=np.float32))
    assert producer.send(np.zeros((4, 16), dtype=np.float32)) == 0  # a small one still goes, as number 0
    with pytest.raises(DeliveryError):
        producer.close(timeout=0)


def test_a_full_queue_waits_bounded_then_refuses_without_numbering() -> None:
    producer = DeviceProducer(NOBODY, device="0", queue_wait_seconds=0.3,
                              settings={"queue.buffering.max.messages": 2})
    producer.send(np.zeros((1, 1), dtype=np.float32))
    producer.send(np.zeros((1, 1), dtype=np.float32))
    began = time.monotonic()
    # librdkafka counts its own queued events beside the records (a refused connection's, among them): 2 or more.
    with pytest.raises(QueueFullError, match=r"local queue \([2-9]\d* records\) stayed full for 0.3 s.*not queued"):
        producer.send(np.zeros((1, 1), dtype=np.float32))
    assert time.monotonic() - began >= 0.3
    assert (producer.next_seq, producer.sent, producer.queued) == (2, 2, 2) and producer.queue_waits >= 1
    with pytest.raises(DeliveryError) as raised:  # close gives up what is still queued: counted, named, raised
        producer.close(timeout=0)
    assert raised.value.failed == 2 and raised.value.reasons == {"Local: Purged in queue": 2}
    assert (producer.failed, producer.queued) == (2, 0)
    with pytest.raises(DeviceProducerError, match="closed"):
        producer.send(np.zeros((1, 1), dtype=np.float32))


def test_an_unreachable_broker_fails_deliveries_in_the_callbacks_and_at_flush() -> None:
    every: list[Delivery] = []
    mine: list[Delivery] = []
    producer = DeviceProducer(NOBODY, device="0", on_delivery=every.append, settings={"delivery.timeout.ms": 300})
    producer.send(np.zeros((2, 2), dtype=np.float32))
    producer.send(np.zeros((3, 2), dtype=np.float32), on_delivery=mine.append)
    with pytest.raises(DeliveryError, match=r"2 sample\(s\) of device '0' could not be delivered to "
                                            r"streamtrain.device.0: 2 x Local: Message timed out") as raised:
        producer.flush(10)
    assert raised.value.failed == 2 and raised.value.device == "0"
    assert [(d.seq, d.size, d.ok, d.error, d.offset) for d in every] == [
        (0, 2, False, "Local: Message timed out", None), (1, 3, False, "Local: Message timed out", None)]
    assert mine == every[1:]
    assert producer.flush(1) == 0  # reported once: the next flush has nothing new to raise
    assert (producer.sent, producer.delivered, producer.failed) == (2, 0, 2)
    assert producer.failure_reasons == {"Local: Message timed out": 2}
    producer.close()


def test_the_context_manager_closes_and_keeps_the_callers_exception() -> None:
    with pytest.raises(RuntimeError, match="the caller's"), DeviceProducer(
            NOBODY, device="0", settings={"delivery.timeout.ms": 200}) as producer:
        producer.send(np.zeros((1, 1), dtype=np.uint8))
        raise RuntimeError("the caller's")  # the delivery failure at exit is logged, not raised over it
    assert producer.failed == 1
    with pytest.raises(DeliveryError, match="1 sample"), DeviceProducer(
            NOBODY, device="0", settings={"delivery.timeout.ms": 200}) as producer:
        producer.send(np.zeros((1, 1), dtype=np.uint8))


@settings(max_examples=60, deadline=None)
@given(
    seq=st.integers(0, 2**40), size=st.integers(1, 40), features=st.integers(1, 9),
    dtype=st.sampled_from(["float32", "float16", "int16", "uint8", "float64"]),
    label=st.none() | st.integers(0, 1000), meta=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
    target=st.none() | st.lists(st.floats(-1e6, 1e6, width=32), max_size=4),
)
def test_device_encoding_is_byte_identical_to_the_wire_codec(
    seq: int, size: int, features: int, dtype: str, label: int | None, meta: dict[str, str],
    target: list[float] | None,
) -> None:
    arr = (np.arange(size * features).reshape(size, features) % 200).astype(dtype)
    record = encode_device_sample("dev-1", seq, arr, label=label, target=target, metadata=meta,
                                  produced_at=1_700_000_000_000)
    expected = encode(Sample.from_array("dev-1", seq, arr, label=label, produced_at=1_700_000_000_000, metadata=meta,
                                        target=target))
    assert (record.value, record.headers) == expected and record.size == size
    back = decode(record.value, record.headers, Sample)
    assert np.array_equal(back.array(), arr) and back.seq == seq


def test_device_encoding_handles_views_and_big_endian() -> None:
    arr = np.arange(24, dtype=">f4").reshape(6, 4)[:, ::2]
    record = encode_device_sample("d", 0, arr)
    assert np.array_equal(decode(record.value, record.headers, Sample).array(), arr)


@settings(max_examples=40, deadline=None)
@given(
    sends=st.lists(st.tuples(
        st.integers(0, 2**62), st.integers(1, 300), st.sampled_from([(16,), (3,), (2, 5), (1,)]),
        st.sampled_from(["float32", "<f8", ">f4", "int64", "uint8", "float16"]), st.booleans(),
        st.none() | st.integers(-(2**63), 2**63 - 1), st.none() | st.integers(0, 2**50)), min_size=1, max_size=12),
)
def test_a_devices_encoder_writes_what_the_wire_codec_writes_record_after_record(
    sends: list[tuple[int, int, tuple[int, ...], str, bool, int | None, int | None]],
) -> None:
    """The per-device encoder keeps each layout's bytes after its first record: every later record of any size,
    strided or not, any label and time, is still the wire codec's byte for byte."""
    encoder = DeviceEncoder("cam-7")
    for seq, size, rest, dtype, strided, label, at in sends:
        arr = (np.arange(size * 2 * int(np.prod(rest)), dtype=np.float64).reshape(size * 2, *rest) % 97).astype(dtype)
        arr = arr[::2] if strided else arr[:size]
        at = 1_700_000_000_000 if at is None else at
        record = encoder.encode(seq, arr, label=label, produced_at=at)
        expected = encode(Sample.from_array("cam-7", seq, arr, label=label, produced_at=at))
        assert (record.value, record.headers, record.size) == (*expected, size)
        assert seq_of(record.value, len(encoder.head)) == seq


def test_a_devices_encoder_refuses_what_the_general_checks_refuse_after_the_layout_is_known() -> None:
    encoder = DeviceEncoder("d")
    good = np.ones((4, 3), dtype=np.float32)
    encoder.encode(0, good, label=1, produced_at=5)
    bad = good.copy()
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"1 NaN or infinite value\(s\), the first at index \(2, 1\)"):
        encoder.encode(1, bad)
    big = np.full((4, 3), 3e38, dtype=np.float32)  # finite, though its sum of squares is not
    record = encoder.encode(1, big)
    assert np.array_equal(decode(record.value, record.headers, Sample).array(), big)
    for kwargs, error in [({"label": True}, TypeError), ({"label": 2**63}, ValueError),
                          ({"produced_at": 1.5}, TypeError), ({"produced_at": -1}, ValueError)]:
        with pytest.raises(error):
            encoder.encode(1, good, **kwargs)
    with pytest.raises(ValueError, match="empty size axis"):
        encoder.encode(1, good[:0])


def test_without_callbacks_a_failed_delivery_is_logged_with_its_seq(caplog: pytest.LogCaptureFixture) -> None:
    producer = DeviceProducer(NOBODY, device="0", settings={"delivery.timeout.ms": 300})
    for _ in range(3):
        producer.send(np.zeros((2, 2), dtype=np.float32), label=300)
    with pytest.raises(DeliveryError, match=r"3 sample\(s\)"):
        producer.flush(10)
    logged = sorted(r.getMessage() for r in caplog.records if "could not be delivered" in r.getMessage())
    assert [m.split(": sample ")[1].split(" ")[0] for m in logged] == ["0", "1", "2"]
    assert (producer.sent, producer.delivered, producer.failed) == (3, 0, 3)
    producer.close()
