"""The decoder contract: what a decoder is given (`SourceRecord`), what it returns (`SampleFields`), and how the
bridge turns that into a checked `Sample` (`to_sample`).

A decoder is any callable `decode(record: SourceRecord) -> SampleFields | None`:

- it returns the sample's fields (a dict; only `data` is required), or None to skip the record on purpose;
- it raises `Rejected(reason, detail)` for a record it cannot use (any other exception is a rejection too, with
  reason `decoder-error`): the record goes to the dead-letter topic with that reason, and the bridge goes on.

Whatever it returns is checked before it is written: a payload of a wire dtype with at least one axis, finite
values, a label that is an integer, a device that is one of the job's. Every bridged sample records where it
came from in its metadata (`source` = `topic/partition/offset`): accounting and duplicate checks are by it.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from ..wire import DTYPES, Sample, now_ms
from ..wire.codec import header_items
from ..wire.topics import validate_name_part

__all__ = ["FIELDS", "SKIPPED_REASON", "SOURCE_KEY", "ContractError", "Rejected", "SampleFields", "SourceRecord",
           "as_array", "frames", "source_of", "to_sample"]

#: Metadata key of a bridged sample's origin, `topic/partition/offset` (topic names hold no "/").
SOURCE_KEY = "source"

#: Dead-letter reason of a record its decoder skipped on purpose (returned None): its fate is in Kafka too.
SKIPPED_REASON = "skipped"

_REASON = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")


class Rejected(ValueError):
    """A record a decoder cannot use: it goes to the dead-letter topic with `reason` and `detail`.

    Args:
        reason: a short code (lower case, digits and -), e.g. "missing-field"; the dead letter's reason.
        detail: what is wrong, for a person.
        setting: the setting that decides what went wrong, when one does (e.g. "mapping.data"): named when a
            source's first records all fail at start-up.
    """

    def __init__(self, reason: str, detail: str, setting: str | None = None) -> None:
        super().__init__(detail)
        self.reason = reason if _REASON.match(reason) else "rejected"
        self.detail = detail
        self.setting = setting


class ContractError(Rejected):
    """A decoder returned something the contract does not allow (not a dict or None, an unknown field, no
    `data`): the decoder is wrong rather than the record (reason `decoder-contract`)."""

    def __init__(self, detail: str) -> None:
        super().__init__("decoder-contract", detail)


@dataclass(frozen=True)
class SourceRecord:
    """One record of a source topic, as a decoder is given it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    """Every header, in order (a name may repeat)."""
    timestamp_ms: int | None = None
    """The record's Kafka timestamp (create or append time), milliseconds since the Unix epoch; None if unset."""

    @classmethod
    def from_message(cls, msg: Message) -> SourceRecord:
        """The record a consumed message holds."""
        kind, stamp = msg.timestamp()
        return cls(topic=msg.topic() or "", partition=msg.partition() or 0, offset=msg.offset() or 0, key=msg.key(),
                   value=msg.value(), headers=tuple(header_items(msg.headers())),
                   timestamp_ms=stamp if kind != TIMESTAMP_NOT_AVAILABLE and stamp >= 0 else None)

    def header(self, name: str) -> bytes | None:
        """The last value of header `name`, or None."""
        found = None
        for key, value in self.headers:
            if key == name:
                found = value
        return found

    @property
    def key_text(self) -> str | None:
        """The key as text (UTF-8), or None when there is none or it is not UTF-8."""
        try:
            return self.key.decode() if self.key else None
        except UnicodeDecodeError:
            return None

    @property
    def source(self) -> str:
        """`topic/partition/offset`: where the record is, as a bridged sample's metadata names it."""
        return f"{self.topic}/{self.partition}/{self.offset}"


class SampleFields(TypedDict, total=False):
    """What a decoder returns for a record: the sample's fields (only `data` is required)."""

    data: Any
    """The payload: a numpy array or nested lists of numbers, first axis the sample's size (frames, tokens)."""
    dtype: str
    """Payload dtype (float32, float16, float64, int8, int16, int32, int64, uint8); default the array's own
    (float32 for lists)."""
    device: str
    """The device whose topic the sample goes to; default the record's key."""
    label: int | None
    """Class label."""
    target: float | Sequence[float] | None
    """Float target (regression values, multi-label tags)."""
    produced_at: int
    """When the sample was produced, ms since the Unix epoch; default the record's timestamp."""
    seq: int
    """The producer's number of the sample; default the record's offset."""
    metadata: Mapping[str, str]
    """Extra text metadata (`source` is always set by the bridge)."""


#: The fields a decoder may return.
FIELDS = frozenset(SampleFields.__annotations__)


def source_of(sample: Sample) -> tuple[str, int, int] | None:
    """(topic, partition, offset) of the source record a bridged sample came from, or None when not bridged."""
    text = sample.metadata.get(SOURCE_KEY)
    if text is None:
        return None
    topic, _, rest = text.rpartition("/")
    topic, _, partition = topic.rpartition("/")
    try:
        return topic, int(partition), int(rest)
    except ValueError:
        return None


def to_sample(fields: object, record: SourceRecord, devices: Collection[str]) -> Sample:
    """The checked sample a decoder's fields describe.

    Args:
        fields: what the decoder returned (not None: a skip is the caller's to handle).
        record: the source record (defaults for device, time and seq; the `source` metadata).
        devices: the job's devices; a sample for another one is rejected.

    Raises:
        ContractError: `fields` is not a dict of known fields with `data`.
        Rejected: the sample cannot be trained (its reason says why).
    """
    if not isinstance(fields, Mapping):
        raise ContractError(f"a decoder returns a dict of sample fields or None, not {type(fields).__name__}")
    unknown = sorted(str(k) for k in fields if k not in FIELDS)
    if unknown:
        raise ContractError(f"unknown sample field {', '.join(unknown)} (known: {', '.join(sorted(FIELDS))})")
    if "data" not in fields:
        raise ContractError("the sample fields have no `data` (the payload)")
    device = _device(fields.get("device"), record, devices)
    array = _payload(fields["data"], fields.get("dtype"))
    metadata = {str(k): str(v) for k, v in (fields.get("metadata") or {}).items()}
    metadata[SOURCE_KEY] = record.source
    sample = Sample.from_array(
        device, _integer(fields.get("seq", record.offset), "seq"), array, label=_label(fields.get("label")),
        produced_at=_integer(fields.get("produced_at", record.timestamp_ms or now_ms()), "produced_at"),
        metadata=metadata, target=_target(fields.get("target")))
    problems = sample.problems()
    if problems:
        reason = "non-finite" if any("NaN" in p for p in problems) else "invalid-sample"
        raise Rejected(reason, "; ".join(problems))
    return sample


def _device(value: object, record: SourceRecord, devices: Collection[str]) -> str:
    if value is None:
        value = record.key_text
        if value is None:
            raise Rejected("no-device", "no device: the decoder named none and the record has no (UTF-8) key")
    device = str(value)
    try:
        validate_name_part("device id", device)
    except ValueError as exc:
        raise Rejected("bad-device", str(exc)) from None
    if device not in devices:
        raise Rejected("unknown-device", f"device {device!r} is not one of the job's ({', '.join(sorted(devices))})",
                       "bridge.devices")
    return device


def _payload(data: object, dtype: object) -> np.ndarray:
    if dtype is not None and dtype not in DTYPES:
        raise Rejected("bad-dtype", f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    # The decoder's own array is taken as it is (the built-in decoders give one): nothing to convert.
    array = data if isinstance(data, np.ndarray) and dtype is None else as_array(data, str(dtype or "float32"))
    if array.ndim == 0:
        raise Rejected("bad-shape", "the payload is a single number; a sample needs at least one axis")
    if array.dtype.name not in DTYPES:
        raise Rejected("bad-dtype", f"payload dtype {array.dtype.name} is not one of {', '.join(DTYPES)}")
    return frames(array)


def frames(array: np.ndarray, setting: str | None = None) -> np.ndarray:
    """`array` as the wire's `[size, features]`: a 1-D array is a series of scalars, `(n, 1)`.

    Raises:
        Rejected: `bad-shape`, for more than two axes (`setting` is the one that decides the shape, if any).
    """
    if array.ndim == 1:
        return array.reshape(-1, 1)
    if array.ndim > 2:
        per_frame = math.prod(array.shape[1:])
        raise Rejected("bad-shape", f"shape {list(array.shape)} has {array.ndim} axes; a sample is [size, features]: "
                       f"flatten each frame (shape [-1, {per_frame}])", setting)
    return array


def as_array(data: object, dtype: str, what: str = "the payload", setting: str | None = None) -> np.ndarray:
    """`data` (nested lists of numbers, or an array) as an array of `dtype`.

    Raises:
        Rejected: `bad-data` when it is not numbers, `non-finite` when a value is beyond the range of `dtype`
            (1e300 in float32), naming `setting`.
    """
    try:
        with np.errstate(over="raise"):  # a value too large for the dtype would become inf: say so instead
            return data.astype(dtype) if isinstance(data, np.ndarray) else np.asarray(data, dtype=dtype)
    except FloatingPointError:
        raise Rejected("non-finite", f"{what} holds a value out of {dtype} range (beyond ±{np.finfo(dtype).max:g}); "
                       "a wider dtype holds it", setting) from None
    except (TypeError, ValueError, OverflowError) as exc:
        raise Rejected("bad-data", f"{what} is not an array of numbers: {exc}", setting) from None


def _integer(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise Rejected(f"bad-{name.replace('_', '-')}", f"{name} {value!r} is not an integer")
    return int(value)


def _label(value: object) -> int | None:
    if value is None:
        return None
    label = _integer(value, "label")
    if label < 0:
        raise Rejected("bad-label", f"label {label} is negative")
    return label


def _target(value: object) -> tuple[float, ...] | None:
    if value is None:
        return None
    try:
        values = np.ravel(np.asarray(value, dtype=np.float64))
    except (TypeError, ValueError) as exc:
        raise Rejected("bad-target", f"target is not a number or a list of numbers: {exc}") from None
    if not all(math.isfinite(v) for v in values):
        raise Rejected("non-finite", "target holds NaN or infinity")
    return tuple(float(v) for v in values)
