"""The wire contract: every record round-trips, and every kind of bad record raises its typed error.

The byte layout itself (Avro's single-object encoding as an independent reader sees it, the previous
layout, the docs' test vector) is tested in test_wire_layout.py.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain.wire import (
    DTYPES,
    SCHEMA_HEADER,
    SIZE_HEADER,
    Assignment,
    CorruptRecordError,
    DeadLetter,
    DeviceLineage,
    DeviceMismatchError,
    DevicePlan,
    DeviceProfile,
    Evaluation,
    InvalidSampleError,
    InvalidTargetError,
    MissingHeaderError,
    ModelVersion,
    PendingSample,
    Prediction,
    ProducedCount,
    Sample,
    SchemaMismatchError,
    SizeMismatchError,
    StepFeedback,
    UnknownSchemaError,
    WireError,
    decode,
    encode,
    fingerprint_of,
    known_fingerprints,
)
from streamtrain.wire.codec import HeaderList
from streamtrain.wire.layout import MARKER, PREFIX_SIZE
from streamtrain.wire.legacy import encode_previous


def _sample(size: int = 5, features: int = 3, dtype: str = "float32", seq: int = 7) -> Sample:
    rng = np.random.default_rng(seq)
    arr = (rng.standard_normal((size, features)) * 10).astype(dtype)
    return Sample.from_array("dev-1", seq, arr, label=3, metadata={"src": "unit"})


def _feedback() -> StepFeedback:
    return StepFeedback(
        job="job", step=12, device_id="dev-1", rank=1, plan_step=12, samples=30, total_size=1350,
        compute_seconds=0.25, data_wait_seconds=0.01, comm_seconds=0.03, step_seconds=0.3,
        memory_bytes=123456789, lowest_unprocessed_offset=1000, buffer_depth=40, loss=1.25, dropped=2,
        new_samples=(PendingSample(1001, 45), PendingSample(1002, 3)), plan_wait_seconds=0.002, hold_seconds=0.1,
        plan_round_trip_seconds=0.03,
    )


def _assignment() -> Assignment:
    return Assignment(
        job="job", step=13, policy="ett-stream", step_time_target=0.3, global_batch=70, lr_scale=1.5,
        devices=(
            DevicePlan("dev-1", predicted_seconds=0.29, weight=0.6, offsets=(1001, 1002, 1005), truncate_before=990),
            DevicePlan("dev-2", predicted_seconds=0.31, weight=0.4, count=40, size_budget=1800),
        ),
        basis_step=11,
    )


def _dead_letter() -> DeadLetter:
    return DeadLetter(topic="p.device.d", partition=0, offset=17, reason="corrupt", detail="bad body",
                      service="trainer", headers={"st-schema": b"00"}, key=None, value=b"\x00\xff")


@pytest.mark.parametrize("record", [_sample(), _feedback(), _assignment(), _dead_letter()],
                         ids=["Sample", "StepFeedback", "Assignment", "DeadLetter"])
def test_every_record_round_trips(record: Sample | StepFeedback | Assignment | DeadLetter) -> None:
    value, headers = encode(record)
    assert value[:PREFIX_SIZE] == MARKER + fingerprint_of(type(record))
    assert SCHEMA_HEADER not in dict(headers)  # the previous layout's header is read, never written
    assert decode(value, headers, type(record)) == record
    # The previous layout (bare body, fingerprint hex in st-schema) of the same record reads the same.
    assert decode(*encode_previous(record), type(record)) == record


def test_sample_carries_its_size_in_a_header_and_its_array_survives() -> None:
    sample = _sample(size=11, features=4, dtype="int16")
    value, headers = encode(sample)
    assert dict(headers)[SIZE_HEADER] == b"11"
    back = decode(value, headers, Sample)
    np.testing.assert_array_equal(back.array(), sample.array())
    assert back.array().shape == (11, 4) and back.array().dtype == np.int16


def test_evaluation_round_trip() -> None:
    record = Evaluation(job="j", step=40, dataset="plaid", samples=537, accuracy=0.75, loss=0.8, seconds=0.2)
    value, headers = encode(record)
    assert decode(value, headers, Evaluation) == record
    with pytest.raises(SchemaMismatchError):
        decode(value, headers, StepFeedback)


def test_model_version_and_prediction_round_trip() -> None:
    version = ModelVersion(job="j", version=3, step=120, location="/models/v000003",
                           lineage=(DeviceLineage("0", 57, (ProducedCount(1_700_000_000_000, 4),)),
                                    DeviceLineage("1", 12)),
                           metrics={"heldout_accuracy": 0.75, "heldout_step": 120.0})
    value, headers = encode(version)
    assert decode(value, headers, ModelVersion) == version
    assert version.offsets == {"0": 57, "1": 12}
    answer = Prediction(job="j", request_topic="st.requests", request_partition=0, request_offset=9, version=3,
                        request_produced_at=5, label=2, label_name="fan", probabilities=(0.1, 0.2, 0.7))
    value, headers = encode(answer)
    assert decode(value, headers, Prediction) == answer
    refused = Prediction(job="j", request_topic="st.requests", request_partition=0, request_offset=10, version=-1,
                         error="corrupt", error_detail="not valid Avro")
    value, headers = encode(refused)
    assert decode(value, headers, Prediction) == refused
    with pytest.raises(SchemaMismatchError):
        decode(value, headers, ModelVersion)


def test_fingerprints_are_distinct_and_stable() -> None:
    fps = known_fingerprints()
    current = {fingerprint_of(t) for t in (Sample, StepFeedback, Assignment, DeadLetter, Evaluation, ModelVersion,
                                           Prediction, DeviceProfile)}
    assert len(current) == 8 and current <= set(fps)
    # The first versions of StepFeedback and Assignment stay readable beside the current ones.
    assert sorted(fps.values()) == ["Assignment", "Assignment", "DeadLetter", "DeviceProfile", "Evaluation",
                                    "Evaluation", "ModelVersion", "Prediction", "Prediction", "Sample", "Sample",
                                    "StepFeedback", "StepFeedback", "StepFeedback"]
    assert all(len(fp) == 8 for fp in fps)


def _first_version(record: StepFeedback | Assignment | Sample, layout: str) -> tuple[bytes, HeaderList]:
    """`record` written with the first version of its schema, as a service of that version sent it, in `layout`."""
    value, headers = encode_previous(record, version=1)
    if layout == "single-object":  # the same body behind the v1 fingerprint's prefix, no st-schema
        fp = bytes.fromhex(dict(headers).pop(SCHEMA_HEADER).decode())
        return MARKER + fp + value, [h for h in headers if h[0] != SCHEMA_HEADER]
    return value, list(headers)


@pytest.mark.parametrize("layout", ["single-object", "previous"])
def test_records_of_the_first_schema_versions_are_read_with_the_new_fields_defaulted(layout: str) -> None:
    fb = _feedback()
    new_fields = ("plan_wait_seconds", "hold_seconds", "plan_round_trip_seconds")
    value, headers = _first_version(fb, layout)
    assert fingerprint_of(StepFeedback) not in value
    back = decode(value, headers, StepFeedback)
    assert back == StepFeedback(**{**fb.__dict__, **dict.fromkeys(new_fields, 0.0)})
    assert back.wait_seconds == fb.data_wait_seconds  # the first version counted both waits there
    plan = _assignment()
    read = decode(*_first_version(plan, layout), Assignment)
    assert read == replace(plan, basis_step=None) and read.seen_through == plan.step - 1
    assert plan.seen_through == 11
    with pytest.raises(SchemaMismatchError, match="StepFeedback"):
        decode(*_first_version(fb, layout), Assignment)


def test_feedback_and_evaluations_before_objectives_read_with_empty_metrics() -> None:
    fb = replace(_feedback(), prequential={"count": 3.0, "loss_sum": 2.5, "correct": 2.0})
    assert decode(*encode(fb), StepFeedback) == fb
    assert decode(*encode_previous(fb, version=2), StepFeedback) == replace(fb, prequential={})
    held = Evaluation(job="j", step=4, dataset="d", samples=9, accuracy=None, loss=0.3, seconds=0.1,
                      objective="regression", metrics={"rmse": 0.5, "baseline_rmse": 0.9})
    assert decode(*encode(held), Evaluation) == held
    old = Evaluation(job="j", step=4, dataset="d", samples=9, accuracy=0.7, loss=0.3, seconds=0.1)
    assert decode(*encode_previous(old, version=1), Evaluation) == old
    assert old.objective == "classification" and old.metrics == {}


@pytest.mark.parametrize("layout", ["single-object", "previous"])
def test_samples_of_the_first_schema_read_without_a_target_and_new_ones_carry_theirs(layout: str) -> None:
    sample = Sample.from_array("3", 7, np.arange(12, dtype=np.float32).reshape(4, 3), label=2)
    value, headers = _first_version(sample, layout)
    assert dict(headers)[SIZE_HEADER] == b"4"
    assert decode(value, headers, Sample, device="3") == sample and sample.target is None
    with_target = Sample.from_array("3", 8, np.ones((2, 1), dtype=np.float32), target=[[0.5, -1.25], [2.0, 0.0]])
    assert with_target.target == (0.5, -1.25, 2.0, 0.0)
    assert decode(*encode(with_target), Sample).target == with_target.target
    assert "target holds NaN" in "; ".join(replace(with_target, target=(1.0, float("nan"))).problems())
    bad_target = replace(with_target, target=(1.0, float("inf")))
    with pytest.raises(InvalidTargetError, match="target holds NaN or infinity") as caught:
        decode(*encode(bad_target), Sample)
    assert caught.value.reason == "invalid-target"  # the reason names the field
    bad_both = replace(bad_target, data=np.full((2, 1), np.nan, np.float32).tobytes())
    with pytest.raises(InvalidSampleError) as either:
        decode(*encode(bad_both), Sample)
    assert either.value.reason == "invalid-sample"


@settings(max_examples=150, deadline=None)
@given(
    dims=st.lists(st.integers(min_value=0, max_value=6), min_size=0, max_size=3),
    size=st.integers(min_value=1, max_value=300),
    dtype=st.sampled_from(DTYPES),
    seq=st.integers(min_value=0, max_value=2**62),
    label=st.none() | st.integers(min_value=-(2**40), max_value=2**40),
)
def test_sample_round_trip_over_random_shapes_dtypes_sizes(
    dims: list[int], size: int, dtype: str, seq: int, label: int | None
) -> None:
    rng = np.random.default_rng(size)
    shape = (size, *dims)
    arr = rng.integers(-100, 100, size=shape).astype(dtype)
    sample = Sample.from_array("d", seq, arr, label=label)
    value, headers = encode(sample)
    back = decode(value, headers, Sample)
    assert back == sample
    assert back.size == size and back.shape == shape
    np.testing.assert_array_equal(back.array(), arr)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=50),
    offsets=st.lists(st.integers(min_value=0, max_value=2**50), max_size=200),
    weight=st.floats(min_value=0, max_value=1),
)
def test_feedback_and_assignment_round_trip_over_random_contents(n: int, offsets: list[int], weight: float) -> None:
    fb = StepFeedback(
        job="j", step=n, device_id="d", rank=0, plan_step=-1, samples=n, total_size=n * 3, compute_seconds=weight,
        data_wait_seconds=0.0, comm_seconds=0.0, step_seconds=weight, memory_bytes=0,
        lowest_unprocessed_offset=min(offsets, default=0), buffer_depth=len(offsets), loss=None,
        new_samples=tuple(PendingSample(o, 1 + o % 97) for o in offsets),
    )
    plan = Assignment(job="j", step=n, policy="static", step_time_target=1.0, global_batch=len(offsets),
                      lr_scale=1.0, devices=(DevicePlan("d", 1.0, weight, offsets=tuple(offsets)),))
    for record in (fb, plan):
        value, headers = encode(record)
        assert decode(value, headers, type(record)) == record


# --- bad records -------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["single-object", "previous"])
def test_missing_size_header_is_rejected(layout: str) -> None:
    value, headers = encode(_sample()) if layout == "single-object" else encode_previous(_sample())
    with pytest.raises(MissingHeaderError, match="st-size"):
        decode(value, [h for h in headers if h[0] != SIZE_HEADER], Sample)
    # Other records need no header at all.
    fb = _feedback()
    assert decode(encode(fb)[0], None, StepFeedback) == fb


def test_unknown_fingerprint_is_rejected_in_either_layout() -> None:
    value, headers = encode(_sample())
    with pytest.raises(UnknownSchemaError, match="deadbeefdeadbeef"):
        decode(MARKER + bytes.fromhex("deadbeefdeadbeef") + value[PREFIX_SIZE:], headers, Sample)
    with pytest.raises(UnknownSchemaError, match="deadbeefdeadbeef"):
        decode(value[PREFIX_SIZE:], [(SCHEMA_HEADER, b"deadbeefdeadbeef"), (SIZE_HEADER, b"5")], Sample)


def test_record_of_another_schema_is_rejected() -> None:
    value, headers = encode(_feedback())
    with pytest.raises(SchemaMismatchError, match="StepFeedback"):
        decode(value, headers, Assignment)


@pytest.mark.parametrize("cut", [0, 1, 5, 9, 10, 20])
def test_truncated_body_is_corrupt(cut: int) -> None:
    value, headers = encode(_sample())
    with pytest.raises(CorruptRecordError):
        decode(value[:cut], headers, Sample)


def test_trailing_bytes_are_corrupt() -> None:
    value, headers = encode(_sample())
    with pytest.raises(CorruptRecordError, match="trailing"):
        decode(value + b"\x00\x01", headers, Sample)


@settings(max_examples=300, deadline=None)
@given(junk=st.binary(max_size=400))
def test_random_bytes_raise_only_typed_errors(junk: bytes) -> None:
    _, headers = encode(_sample())
    # The only acceptable failure: a typed error a service can dead-letter; after the single-object prefix too,
    # and in the previous layout.
    for value, with_headers in ((junk, headers), (MARKER + fingerprint_of(Sample) + junk, headers),
                                (junk, [*headers, (SCHEMA_HEADER, fingerprint_of(Sample).hex().encode())])):
        with contextlib.suppress(WireError):
            decode(value, with_headers, Sample)


def test_size_header_that_disagrees_is_rejected() -> None:
    value, headers = encode(_sample(size=5))
    bad = [(k, b"6" if k == SIZE_HEADER else v) for k, v in headers]
    with pytest.raises(SizeMismatchError, match="says 6 but the record's size is 5"):
        decode(value, bad, Sample)


def test_size_header_that_is_not_a_number_is_rejected() -> None:
    value, headers = encode(_sample(size=5))
    bad = [(k, b"five" if k == SIZE_HEADER else v) for k, v in headers]
    with pytest.raises(SizeMismatchError, match="not an integer"):
        decode(value, bad, Sample)


def _forged(**changes: object) -> tuple[bytes, HeaderList]:
    """Encode a sample whose fields were changed after construction (as a buggy producer would)."""
    d = _sample().to_dict() | changes
    forged = Sample.from_dict(d)
    return encode(forged)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"size": 0, "shape": [0, 3], "data": b""}, "size 0 < 1"),
        ({"size": -4}, "size -4 < 1"),
        ({"data": b"\x00" * 7}, "needs 60"),
        ({"shape": [5, 4]}, "needs 80"),
        ({"shape": []}, "shape is empty"),
        ({"size": 6, "shape": [6, 3], "data": b"\x00" * 72}, None),
        ({"size": 5, "shape": [4, 3]}, "size 5 != shape"),
        ({"data": np.full((5, 3), np.nan, dtype="float32").tobytes()}, "NaN or infinity"),
        ({"data": np.full((5, 3), np.inf, dtype="float32").tobytes()}, "NaN or infinity"),
    ],
)
def test_untrainable_samples_are_rejected_with_the_reason(changes: dict[str, object], message: str | None) -> None:
    value, headers = _forged(**changes)
    if message is None:
        assert decode(value, headers, Sample).size == 6
        return
    with pytest.raises(InvalidSampleError, match=message):
        decode(value, headers, Sample)
    # A reader that only routes records (no training) may skip the content checks.
    if "size" not in changes or changes["size"] == decode(value, headers, Sample, validate=False).size:
        assert decode(value, headers, Sample, validate=False).device_id == "dev-1"


def test_error_reason_codes_are_distinct() -> None:
    codes = [cls.reason for cls in (MissingHeaderError, UnknownSchemaError, SchemaMismatchError,
                                    CorruptRecordError, SizeMismatchError, InvalidSampleError, DeviceMismatchError)]
    assert len(set(codes)) == len(codes)


def test_a_sample_claiming_another_device_is_refused_where_the_topic_is_known() -> None:
    value, headers = encode(_sample())  # device dev-1
    assert decode(value, headers, Sample, device="dev-1").device_id == "dev-1"
    assert decode(value, headers, Sample).device_id == "dev-1"  # a reader that knows no topic device
    with pytest.raises(DeviceMismatchError, match="claims device 'dev-1' but was read from device 'dev-3'") as err:
        decode(value, headers, Sample, device="dev-3")
    assert err.value.reason == "device-mismatch"
    # A sample that is also broken gets the more basic reason: it could not be trained on any device.
    broken, broken_headers = _forged(size=-4)
    with pytest.raises(InvalidSampleError):
        decode(broken, broken_headers, Sample, device="dev-3")


def test_from_array_rejects_unsupported_dtypes_and_scalars() -> None:
    with pytest.raises(ValueError, match="complex128"):
        Sample.from_array("d", 0, np.zeros((2, 2), dtype=complex))
    with pytest.raises(ValueError, match="size axis"):
        Sample.from_array("d", 0, np.float32(1.0))  # type: ignore[arg-type]


def test_big_endian_input_is_stored_little_endian() -> None:
    arr = np.arange(12, dtype=">i4").reshape(4, 3)
    sample = Sample.from_array("d", 0, arr)
    assert sample.data == arr.astype("<i4").tobytes()
    np.testing.assert_array_equal(sample.array(), arr)
    assert math.prod(sample.shape) * 4 == len(sample.data)
