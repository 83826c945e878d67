"""Encoding of the wire records: Avro's single-object encoding, plus a size header on samples.

A record's value is ``C3 01``, the writer schema's CRC-64-AVRO fingerprint as 8 little-endian bytes,
then the Avro binary body: the Avro specification's layout for one record on a queue, so any
language's Avro library writes it by itself (Java's `BinaryMessageEncoder`). A Sample also carries
``st-size`` (decimal ASCII) so a consumer can see its cost without decoding the body.

Which layout a value is in: a value that begins with ``C3 01`` is single-object encoded, and its
fingerprint says which schema wrote it (an ``st-schema`` header beside it is ignored). Otherwise an
``st-schema`` header marks the previous layout (`legacy`: bare body, fingerprint in that header), still
read for one release. The two cannot be confused: every schema's first field is a string, and ``C3 01``
read as a string's length is -98, so no previous-layout body begins with the marker. A value with
neither is corrupt. See docs/guides/wire-format.md for the layout to the byte.

A schema grows only by fields with defaults, and the versions it had before stay readable (`layout`).
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any, TypeVar, cast

import fastavro
import numpy as np

from .errors import (
    CorruptRecordError,
    DeviceMismatchError,
    InvalidSampleError,
    InvalidTargetError,
    MissingHeaderError,
    SchemaMismatchError,
    SizeMismatchError,
)
from .layout import (
    MARKER,
    PREFIX_SIZE,
    SIZE_HEADER,
    HeaderList,
    Headers,
    WriterSchema,
    fingerprint_of,
    known_fingerprints,
    load_schema,
    unknown_schema,
    writer_schemas,
)
from .legacy import SCHEMA_HEADER, previous_writer
from .profiles import DeviceProfile
from .records import (
    Assignment,
    DeadLetter,
    Evaluation,
    ModelVersion,
    Prediction,
    Record,
    Sample,
    StepFeedback,
    now_ms,
    wire_dtype,
)
from .sample_writer import fields_body, sample_body

__all__ = [
    "SCHEMA_HEADER",
    "SIZE_HEADER",
    "HeaderList",
    "Headers",
    "decode",
    "encode",
    "encode_array",
    "fingerprint_of",
    "header_items",
    "header_value",
    "known_fingerprints",
    "load_schema",
]

R = TypeVar("R", Sample, StepFeedback, Assignment, DeadLetter, Evaluation, ModelVersion, Prediction, DeviceProfile)
_DECODE_ERRORS = (EOFError, ValueError, IndexError, KeyError, UnicodeDecodeError, OverflowError, MemoryError)


def header_items(headers: Headers | None) -> list[tuple[str, bytes | None]]:
    """Headers in either confluent-kafka form as a list of (name, bytes or None)."""
    items = headers.items() if isinstance(headers, Mapping) else (headers or ())
    return [(k, v.encode() if isinstance(v, str) else v) for k, v in items]


def header_value(headers: Headers | None, name: str) -> bytes | None:
    """The last value of header `name` as bytes, or None when absent."""
    if not headers:
        return None
    found: str | bytes | None = None
    for key, value in headers.items() if isinstance(headers, Mapping) else headers:
        if key == name:
            found = value
    return found.encode() if isinstance(found, str) else found


def encode(record: Record | DeviceProfile) -> tuple[bytes, HeaderList]:
    """Serialize a record to (value, headers) ready for `Producer.produce(value=..., headers=...)`.

    The value is the record in Avro's single-object encoding; a Sample's headers hold its ``st-size``,
    other records have none.
    """
    schema = load_schema(record.SCHEMA)
    if isinstance(record, Sample):
        headers: HeaderList = [(SIZE_HEADER, str(record.size).encode())]
        body = sample_body(schema.parsed, record)  # the producers' hot path; None: fastavro writes it
        if body is not None:
            return schema.prefix + body, headers
    else:
        headers = []
    buf = io.BytesIO()
    buf.write(schema.prefix)
    fastavro.schemaless_writer(buf, schema.parsed, record.to_dict())
    return buf.getvalue(), headers


def encode_array(device_id: str, seq: int, array: np.ndarray, *, label: int | None = None,
                 produced_at: int | None = None, metadata: dict[str, str] | None = None,
                 target: tuple[float, ...] | None = None) -> tuple[bytes, HeaderList]:
    """`encode(Sample.from_array(...))` of the same arguments, byte for byte, without building the `Sample`: the
    hot path of a producer whose arguments are checked already (`streamtrain.publish`). `target` is the float
    tuple `Sample.target` holds. Whatever the fast writer does not cover goes the `Sample` way."""
    name, schema = wire_dtype(array.dtype), load_schema(Sample.SCHEMA)
    produced = now_ms() if produced_at is None else produced_at
    if name is not None and array.ndim > 0:
        data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()  # C order, little-endian
        body = fields_body(schema.parsed, device_id, seq, produced, array.shape[0], array.shape, name, data, label,
                           target, metadata or {})
        if body is not None:
            return schema.prefix + body, [(SIZE_HEADER, str(array.shape[0]).encode())]
    return encode(Sample.from_array(device_id, seq, array, label=label, produced_at=produced, metadata=metadata,
                                    target=target))


def decode(value: bytes | None, headers: Headers | None, expect: type[R], *, validate: bool = True,
           device: str | None = None) -> R:
    """Read a record of type `expect` from a Kafka value and its headers, in either layout (module docstring).

    Args:
        value: the record's value.
        headers: its headers.
        expect: the record type this topic carries.
        validate: check a sample's payload against its shape, dtype and size.
        device: for a sample read from a device topic, that topic's device: a sample claiming any other
            device is refused (`DeviceMismatchError`) rather than trained as this topic's.

    Returns:
        The record.

    Raises:
        WireError: a subclass saying exactly what is wrong: `UnknownSchemaError`, `SchemaMismatchError`,
            `CorruptRecordError`, or for samples `MissingHeaderError`, `SizeMismatchError`,
            `DeviceMismatchError` and (when `validate`) `InvalidSampleError`.
    """
    writer, start = _writer_of(value, headers, expect.SCHEMA)
    if writer.name != expect.SCHEMA:
        raise SchemaMismatchError(f"record was written as {writer.name}, but a {expect.SCHEMA} was expected here")
    if value is None:
        raise CorruptRecordError(f"{writer.name} record has no value (a tombstone?)")
    size_header = header_value(headers, SIZE_HEADER) if expect is Sample else None
    if expect is Sample and size_header is None:
        raise MissingHeaderError(f"Sample has no {SIZE_HEADER} header (its size, decimal ASCII, is required)")
    buf = io.BytesIO(value)
    buf.seek(start)
    try:
        # Resolution only for an older writer: reading with the writer's own schema skips it.
        data = fastavro.schemaless_reader(buf, writer.parsed, writer.reader)
    except _DECODE_ERRORS as exc:
        raise CorruptRecordError(f"{writer.name} body is not valid Avro ({type(exc).__name__}: {exc})") from exc
    if buf.tell() != len(value):
        raise CorruptRecordError(f"{writer.name} body has {len(value) - buf.tell()} trailing bytes after the record")
    try:
        record = cast(R, expect.from_dict(cast(dict[str, Any], data)))
    except (TypeError, ValueError) as exc:  # pragma: no cover - fastavro already checked the types
        raise CorruptRecordError(f"{writer.name} body does not fit the record type: {exc}") from exc
    if isinstance(record, Sample):
        _check_sample(record, cast(bytes, size_header), validate)
        if device is not None and record.device_id != device:
            raise DeviceMismatchError(f"sample {record.device_id}#{record.seq} claims device {record.device_id!r} "
                                      f"but was read from device {device!r}'s topic")
    return record


def _writer_of(value: bytes | None, headers: Headers | None, expected: str) -> tuple[WriterSchema, int]:
    """The schema that wrote `value`, and where its Avro body starts, from whichever layout it is in."""
    if value is not None and value[:2] == MARKER:
        # The hot path: one slice and one dict look-up by the raw bytes, no hex.
        writer = writer_schemas().get(value[2:PREFIX_SIZE])
        if writer is not None:
            return writer, PREFIX_SIZE
        if len(value) < PREFIX_SIZE:
            raise CorruptRecordError(f"value of {len(value)} bytes ends inside its single-object prefix "
                                     f"(C3 01 and an 8-byte schema fingerprint: {PREFIX_SIZE} bytes)")
        raise unknown_schema(value[2:PREFIX_SIZE], expected, "the value's single-object prefix")
    previous = header_value(headers, SCHEMA_HEADER)
    if previous is not None:
        return previous_writer(previous, expected), 0
    raise CorruptRecordError(_no_layout(value))


def _no_layout(value: bytes | None) -> str:
    """Why a value without the marker (and without the previous layout's header) is not a record."""
    if value is None:
        return "record has no value (a tombstone?) and no schema fingerprint"
    found = value[:2].hex(" ") or "nothing"
    hint = ""
    if len(value) >= 5 and value[0] == 0:
        hint = (f"; if this is Confluent Schema Registry's framing (magic byte 0, schema id "
                f"{int.from_bytes(value[1:5], 'big')}), streamtrain does not read it: write the single-object encoding")
    elif value:
        hint = "; a bare Avro body? Write it with the single-object encoder (Java: Sample.getEncoder().encode(s))"
    return (f"value does not begin with Avro's single-object marker C3 01 (found {found}) and has no "
            f"{SCHEMA_HEADER} header (the previous layout){hint}")


def _check_sample(sample: Sample, size_header: bytes, validate: bool) -> None:
    try:
        header_size = int(size_header.decode("ascii"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SizeMismatchError(f"{SIZE_HEADER} header {size_header!r} is not an integer") from exc
    if header_size != sample.size:
        raise SizeMismatchError(
            f"{SIZE_HEADER} header says {header_size} but the record's size is {sample.size} "
            f"(device {sample.device_id}, seq {sample.seq})"
        )
    if validate:
        problems = sample.problems()
        if problems:
            only_target = all(p.startswith("target") for p in problems)
            error = InvalidTargetError if only_target else InvalidSampleError
            raise error(f"sample {sample.device_id}#{sample.seq}: " + "; ".join(problems))
