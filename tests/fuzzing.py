"""Bad-input corpora: records every way the wire contract can be broken, each with the reason it must get.

Used by the fuzz fault tests and reusable by benchmarks and soaks: write `device_corpus(...)` into a
device topic (interleaved with `good_sample`s) and every bad record must come back on the dead-letter
topic with exactly its `reason`, while the good ones are trained. `feedback_corpus` and
`assignment_corpus` do the same for the coordinator's and the trainers' control topics.

Reasons are the `WireError.reason` codes of `streamtrain.wire`, plus the trainer consumer's own
`oversize` (record bytes above trainer.buffer_max_bytes) and `untrainable` (a valid sample the model
cannot take: wrong feature count, label out of range).

`forged_feedback` and `forged_plans` are the other half: records that decode, but that no trainer or
coordinator could have written (NaN or negative timings and weights, compute longer than the step, a
plan a billion steps ahead), with the `feedback-*` / `plan-*` reason the coordinator and the ranks give.
`extreme_sample` is another kind of hard input: valid samples at the far end of what their dtype
holds, which must be trained without the model's loss or weights ever leaving the finite.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from streamtrain.wire import Assignment, DevicePlan, PendingSample, Sample, StepFeedback, encode, now_ms
from streamtrain.wire.codec import SCHEMA_HEADER, SIZE_HEADER, HeaderList
from streamtrain.wire.layout import MARKER, PREFIX_SIZE, load_schema
from streamtrain.wire.legacy import encode_previous

__all__ = [
    "FuzzRecord",
    "assignment_corpus",
    "device_corpus",
    "extreme_sample",
    "feedback_corpus",
    "forged_feedback",
    "forged_plans",
    "good_sample",
    "reason_counts",
]


@dataclass(frozen=True)
class FuzzRecord:
    """One record to write, and the dead-letter reason a reader must give it."""

    kind: str
    reason: str
    value: bytes | None
    headers: HeaderList


def good_sample(device_id: str, seq: int, num_features: int = 16, num_classes: int = 10, size: int = 3) -> Sample:
    """A sample every reader accepts (finite float32 payload of shape (size, num_features))."""
    rng = np.random.default_rng(seq)
    return Sample.from_array(device_id, seq, rng.standard_normal((size, num_features)).astype(np.float32),
                             label=seq % num_classes)


def extreme_sample(device_id: str, seq: int, dtype: str, rng: np.random.Generator, size: int,
                   num_features: int = 16, num_classes: int = 10) -> Sample:
    """A valid sample of `dtype` at the far end of its range, finite: integers over their whole range (int64 up to
    ±2^62), float16 near its maximum, float32 and float64 around ±1e30."""
    kind = np.dtype(dtype)
    if kind.kind in "iu":
        info = np.iinfo(kind)
        low, high = (int(info.min), int(info.max)) if info.bits < 64 else (-(2**62), 2**62)
        payload = rng.integers(low, high, size=(size, num_features), dtype=kind, endpoint=True)
    else:
        scale = 6e4 if dtype == "float16" else 1e30
        payload = (rng.uniform(-1.0, 1.0, size=(size, num_features)) * scale).astype(kind)
    return Sample.from_array(device_id, seq, payload, label=int(rng.integers(num_classes)))


def _raw_sample(size: int, shape: tuple[int, ...], data: bytes, label: int | None = 1, seq: int = 0,
                device_id: str = "fuzz", header_size: int | None = None) -> tuple[bytes, HeaderList]:
    """Encode a Sample exactly as given (no validation), with an st-size header of `header_size` or `size`."""
    sample = Sample(device_id=device_id, seq=seq, produced_at=0, size=size, shape=shape, dtype="float32", data=data,
                    label=label)
    value, headers = encode(sample)
    if header_size is not None:
        headers = [(k, v) for k, v in headers if k != SIZE_HEADER] + [(SIZE_HEADER, str(header_size).encode())]
    return value, headers


def device_corpus(count: int, device_id: str = "fuzz", seed: int = 0, num_features: int = 16,
                  num_classes: int = 10, oversize_bytes: int | None = None) -> Iterator[FuzzRecord]:
    """`count` bad records for a device topic, cycling through every kind of damage.

    Args:
        count: records to generate.
        device_id: the device topic's device, written into every sample (one kind claims another device).
        seed: seed of every random choice (same seed, same corpus).
        num_features: the trainer's features per frame (one kind has one too many).
        num_classes: the trainer's classes (one kind has a label out of range).
        oversize_bytes: the trainer's buffer_max_bytes; when given, one kind is a record larger than it.
    """
    rng = np.random.default_rng(seed)
    sample_prefix = load_schema("Sample").prefix
    feats = num_features

    def rows(n: int, fill: float | None = None) -> bytes:
        arr = rng.standard_normal((n, feats)).astype(np.float32)
        if fill is not None:
            arr[rng.integers(n), rng.integers(feats)] = fill
        return arr.tobytes()

    def valid(i: int) -> tuple[bytes, HeaderList]:
        n = int(rng.integers(1, 6))
        return _raw_sample(n, (n, feats), rows(n), seq=i, device_id=device_id)

    def random_body(i: int) -> FuzzRecord:
        # A zigzag varint of -1 as device_id's length: no Avro reader can take a string of negative length,
        # so random bytes after it are corrupt whatever they are (pure random bytes might decode by luck).
        body = sample_prefix + b"\x01" + rng.bytes(int(rng.integers(0, 300)))
        return FuzzRecord("random-bytes", "corrupt", body, [(SIZE_HEADER, b"3")])

    def truncated(i: int) -> FuzzRecord:
        value, headers = valid(i)
        return FuzzRecord("truncated-avro", "corrupt", value[:int(rng.integers(0, len(value) - 1))], headers)

    def trailing(i: int) -> FuzzRecord:
        value, headers = valid(i)
        return FuzzRecord("trailing-bytes", "corrupt", value + rng.bytes(int(rng.integers(1, 20))), headers)

    def tombstone(i: int) -> FuzzRecord:
        _value, headers = valid(i)
        return FuzzRecord("tombstone", "corrupt", None, headers)

    def unknown_fp(i: int) -> FuzzRecord:
        value, headers = valid(i)
        fake = int(rng.integers(0, 2**62)).to_bytes(8, "little")
        return FuzzRecord("unknown-fingerprint", "unknown-schema", MARKER + fake + value[PREFIX_SIZE:], headers)

    def previous_unknown_fp(i: int) -> FuzzRecord:
        # The previous layout (bare body, fingerprint hex in a header), still read: with a fingerprint nobody has.
        value, headers = valid(i)
        fake = f"{int(rng.integers(0, 2**62)):016x}".encode()
        return FuzzRecord("unknown-fingerprint-previous-layout", "unknown-schema", value[PREFIX_SIZE:],
                          [(SCHEMA_HEADER, fake), *headers])

    def bare_body(i: int) -> FuzzRecord:
        # A bare Avro body (no single-object prefix, no previous-layout header): what a writer that skipped
        # the single-object encoder sends.
        value, headers = valid(i)
        return FuzzRecord("bare-avro-body", "corrupt", value[PREFIX_SIZE:], headers)

    def previous_truncated(i: int) -> FuzzRecord:
        n = int(rng.integers(1, 6))
        value, headers = encode_previous(Sample(device_id=device_id, seq=i, produced_at=0, size=n, shape=(n, feats),
                                                dtype="float32", data=rows(n), label=1))
        return FuzzRecord("truncated-avro-previous-layout", "corrupt", value[:int(rng.integers(0, len(value) - 1))],
                          headers)

    def wrong_schema(i: int) -> FuzzRecord:
        value, headers = encode(_feedback(i))
        return FuzzRecord("wrong-schema", "wrong-schema", value, headers)

    def no_headers(i: int) -> FuzzRecord:
        value, _headers = valid(i)
        return FuzzRecord("missing-headers", "missing-header", value, [])

    def no_size_header(i: int) -> FuzzRecord:
        value, headers = valid(i)
        return FuzzRecord("missing-size-header", "missing-header", value, [h for h in headers if h[0] != SIZE_HEADER])

    def size_header_wrong(i: int) -> FuzzRecord:
        n = int(rng.integers(1, 6))
        value, headers = _raw_sample(n, (n, feats), rows(n), seq=i, device_id=device_id,
                                     header_size=n + int(rng.integers(1, 1000)))
        return FuzzRecord("size-header-mismatch", "size-mismatch", value, headers)

    def size_header_garbage(i: int) -> FuzzRecord:
        value, headers = valid(i)
        headers = [(k, v) for k, v in headers if k != SIZE_HEADER] + [(SIZE_HEADER, rng.bytes(4).hex().encode())]
        return FuzzRecord("size-header-not-a-number", "size-mismatch", value, headers)

    def negative_size(i: int) -> FuzzRecord:
        n = -int(rng.integers(1, 2**31 - 1))
        value, headers = _raw_sample(n, (n, feats), rows(1), seq=i, device_id=device_id)
        return FuzzRecord("negative-size", "invalid-sample", value, headers)

    def zero_size(i: int) -> FuzzRecord:
        value, headers = _raw_sample(0, (0, feats), b"", seq=i, device_id=device_id)
        return FuzzRecord("zero-size", "invalid-sample", value, headers)

    def huge_size(i: int) -> FuzzRecord:
        n = int(rng.integers(2**24, 2**31 - 1))  # claims gigabytes, carries a few rows
        value, headers = _raw_sample(n, (n, feats), rows(2), seq=i, device_id=device_id)
        return FuzzRecord("huge-size", "invalid-sample", value, headers)

    def shape_vs_data(i: int) -> FuzzRecord:
        n = int(rng.integers(2, 6))
        data = rows(n)[: -4 * int(rng.integers(1, feats + 1))]
        value, headers = _raw_sample(n, (n, feats), data, seq=i, device_id=device_id)
        return FuzzRecord("shape-not-data-length", "invalid-sample", value, headers)

    def non_finite(i: int) -> FuzzRecord:
        n = int(rng.integers(1, 6))
        fill = (math.nan, math.inf, -math.inf)[i % 3]
        value, headers = _raw_sample(n, (n, feats), rows(n, fill), seq=i, device_id=device_id)
        return FuzzRecord("nan-inf-payload", "invalid-sample", value, headers)

    def wrong_features(i: int) -> FuzzRecord:
        n = int(rng.integers(1, 6))
        arr = rng.standard_normal((n, feats + 1)).astype(np.float32)
        value, headers = _raw_sample(n, (n, feats + 1), arr.tobytes(), seq=i, device_id=device_id)
        return FuzzRecord("wrong-feature-count", "untrainable", value, headers)

    def bad_label(i: int) -> FuzzRecord:
        n = int(rng.integers(1, 6))
        value, headers = _raw_sample(n, (n, feats), rows(n), label=num_classes + int(rng.integers(0, 99)), seq=i,
                                     device_id=device_id)
        return FuzzRecord("label-out-of-range", "untrainable", value, headers)

    def other_device(i: int) -> FuzzRecord:
        n = int(rng.integers(1, 6))
        value, headers = _raw_sample(n, (n, feats), rows(n), seq=i, device_id=f"{device_id}-other")
        return FuzzRecord("other-device", "device-mismatch", value, headers)

    makers: list[Callable[[int], FuzzRecord]] = [
        random_body, truncated, trailing, tombstone, unknown_fp, wrong_schema, no_headers, no_size_header,
        size_header_wrong, size_header_garbage, negative_size, zero_size, huge_size, shape_vs_data, non_finite,
        wrong_features, bad_label, other_device, previous_unknown_fp, bare_body, previous_truncated,
    ]
    oversize_every = 0
    if oversize_bytes is not None:
        # Rare (each is bigger than the buffer bound), but always at least one.
        oversize_every = max(1, count // 50)
        n_rows = oversize_bytes // (4 * feats) + 2
        big = _raw_sample(n_rows, (n_rows, feats), rows(n_rows), device_id=device_id)
    for i in range(count):
        if oversize_every and i % oversize_every == oversize_every - 1:
            yield FuzzRecord("oversized-payload", "oversize", big[0], big[1])
        else:
            yield makers[i % len(makers)](i)


def _feedback(i: int, job: str = "fuzz") -> StepFeedback:
    return StepFeedback(job=job, step=i, device_id="d0", rank=0, plan_step=i, samples=1, total_size=1,
                        compute_seconds=0.1, data_wait_seconds=0.0, comm_seconds=0.0, step_seconds=0.1,
                        memory_bytes=0, lowest_unprocessed_offset=0, buffer_depth=0, sent_at=0)


def _control_corpus(count: int, seed: int, good: Callable[[int], tuple[bytes, HeaderList]],
                    other: Callable[[int], tuple[bytes, HeaderList]]) -> Iterator[FuzzRecord]:
    """Bad records for a control topic (feedback, assignments): damage that any decoder must catch."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        value, headers = good(i)
        prefix, body = value[:PREFIX_SIZE], value[PREFIX_SIZE:]
        match i % 7:
            case 0:
                yield FuzzRecord("random-bytes", "corrupt", prefix + b"\x01" + rng.bytes(int(rng.integers(0, 200))),
                                 headers)
            case 1:
                yield FuzzRecord("truncated-avro", "corrupt", value[:int(rng.integers(0, len(value) - 1))], headers)
            case 2:
                yield FuzzRecord("trailing-bytes", "corrupt", value + b"\x00" * int(rng.integers(1, 9)), headers)
            case 3:
                yield FuzzRecord("bare-avro-body", "corrupt", body, headers)
            case 4:
                yield FuzzRecord("unknown-fingerprint", "unknown-schema", MARKER + b"\x00" * 8 + body, headers)
            case 5:
                wrong_value, wrong_headers = other(i)
                yield FuzzRecord("wrong-schema", "wrong-schema", wrong_value, wrong_headers)
            case _:
                yield FuzzRecord("tombstone", "corrupt", None, headers)


def feedback_corpus(count: int, job: str = "fuzz", seed: int = 0) -> Iterator[FuzzRecord]:
    """`count` bad records for the feedback topic (for the coordinator's FeedbackReader)."""
    yield from _control_corpus(count, seed, lambda i: encode(_feedback(i, job)),
                               lambda i: encode(Assignment(job, i, "p", 0.0, 0, 1.0, (), created_at=0)))


def assignment_corpus(count: int, job: str = "fuzz", seed: int = 0) -> Iterator[FuzzRecord]:
    """`count` bad records for the assignments topic (for the trainers' PlanBook)."""
    plan = DevicePlan("d0", 0.1, 1.0, count=1)
    yield from _control_corpus(count, seed,
                               lambda i: encode(Assignment(job, i, "p", 0.1, 1, 1.0, (plan,), created_at=0)),
                               lambda i: encode(_feedback(i, job)))


def forged_feedback(count: int, job: str = "fuzz", device_id: str = "d0", step: int = 0) -> Iterator[FuzzRecord]:
    """`count` decodable feedback records for `step` with timings or counts no trainer reports."""
    base = _feedback(step, job)
    base = replace(base, device_id=device_id, step=step, plan_step=step, sent_at=now_ms())
    kinds: list[tuple[str, str, dict[str, Any]]] = [
        ("nan-compute", "feedback-non-finite", {"compute_seconds": math.nan}),
        ("inf-step", "feedback-non-finite", {"step_seconds": math.inf}),
        ("negative-wait", "feedback-negative", {"data_wait_seconds": -1.0}),
        ("negative-samples", "feedback-negative", {"samples": -3}),
        ("compute-longer-than-step", "feedback-impossible", {"compute_seconds": 5.0, "step_seconds": 1.0}),
        ("a-billion-seconds", "feedback-impossible", {"compute_seconds": 1e9, "step_seconds": 1e9}),
        ("size-below-count", "feedback-impossible", {"samples": 5, "total_size": 2}),
        ("foreign-plan-step", "feedback-impossible", {"plan_step": step + 7}),
        ("buffered-below-floor", "feedback-impossible",
         {"lowest_unprocessed_offset": 10, "new_samples": (PendingSample(3, 4),)}),
    ]
    for i in range(count):
        kind, reason, changes = kinds[i % len(kinds)]
        yield FuzzRecord(kind, reason, *encode(replace(base, **changes)))


def forged_plans(count: int, job: str = "fuzz", devices: tuple[str, ...] = ("d0",),
                 step: int = 0) -> Iterator[FuzzRecord]:
    """`count` decodable plans (for `step` unless forged further) every rank must refuse whatever its state."""
    parts = tuple(DevicePlan(d, 0.1, 1.0 / len(devices), count=1) for d in devices)
    base = Assignment(job, step, "forged", 0.1, len(devices), 1.0, parts)

    def each(**changes: Any) -> tuple[DevicePlan, ...]:
        return tuple(replace(p, **changes) for p in parts)

    kinds: list[tuple[str, str, dict[str, Any]]] = [
        ("nan-weights", "plan-non-finite", {"devices": each(weight=math.nan)}),
        ("inf-step-target", "plan-non-finite", {"step_time_target": math.inf}),
        ("nan-lr-scale", "plan-non-finite", {"lr_scale": math.nan}),
        ("negative-weights", "plan-negative", {"devices": each(weight=-1.0)}),
        ("negative-truncate-before", "plan-negative", {"devices": each(truncate_before=-5)}),
        ("negative-count", "plan-negative", {"devices": each(count=-2)}),
        ("a-billion-steps-ahead", "plan-step-window", {"step": step + 1_000_000_000}),
    ]
    for i in range(count):
        kind, reason, changes = kinds[i % len(kinds)]
        yield FuzzRecord(kind, reason, *encode(replace(base, **changes)))


def reason_counts(records: list[FuzzRecord]) -> Counter[str]:
    """How many records of each reason a corpus holds (what the dead-letter topic must show)."""
    return Counter(r.reason for r in records)

