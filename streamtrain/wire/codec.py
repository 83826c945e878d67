"""Avro encoding of the wire records: a schemaless fastavro body plus headers.

Every record carries the header ``st-schema`` with the CRC-64-AVRO fingerprint (hex) of the
schema that wrote it, so a reader rejects what it cannot read instead of misreading it. A Sample
also carries ``st-size`` (decimal ASCII) so a consumer can see its cost without decoding the body.

A schema grows only by fields with defaults, and the versions it had before stay readable: they
are kept in ``schemas/older/<Name>.<n>.avsc``, and a record written with one of them is resolved
to the current schema (Avro schema resolution: the fields it lacks take their defaults), so
services of different versions can share the topics while they are upgraded one by one.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, TypeVar, cast

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from .errors import (
    CorruptRecordError,
    DeviceMismatchError,
    InvalidSampleError,
    MissingHeaderError,
    SchemaMismatchError,
    SizeMismatchError,
    UnknownSchemaError,
)
from .records import Assignment, DeadLetter, Evaluation, ModelVersion, Prediction, Record, Sample, StepFeedback

__all__ = [
    "SCHEMA_HEADER",
    "SIZE_HEADER",
    "HeaderList",
    "Headers",
    "decode",
    "encode",
    "fingerprint_of",
    "header_items",
    "header_value",
    "known_fingerprints",
    "load_schema",
]

SCHEMA_HEADER = "st-schema"
SIZE_HEADER = "st-size"

#: Kafka record headers as confluent-kafka takes and returns them.
HeaderList = list[tuple[str, str | bytes | None]]
Headers = Mapping[str, str | bytes | None] | Sequence[tuple[str, str | bytes | None]]

_RECORD_TYPES: dict[str, type[Any]] = {
    "Sample": Sample,
    "StepFeedback": StepFeedback,
    "Assignment": Assignment,
    "DeadLetter": DeadLetter,
    "Evaluation": Evaluation,
    "ModelVersion": ModelVersion,
    "Prediction": Prediction,
}
R = TypeVar("R", Sample, StepFeedback, Assignment, DeadLetter, Evaluation, ModelVersion, Prediction)


@dataclass(frozen=True)
class _Schema:
    name: str
    parsed: Any
    fingerprint: str


def _parse(name: str, *path: str) -> _Schema:
    text = resources.files("streamtrain.wire").joinpath("schemas", *path).read_text()
    parsed = fastavro.parse_schema(json.loads(text), named_schemas={})
    return _Schema(name, parsed, fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))


@cache
def load_schema(name: str) -> _Schema:
    """The parsed schema `name` (e.g. "Sample") from the packaged `.avsc` file, with its fingerprint."""
    return _parse(name, f"{name}.avsc")


@cache
def _writer_schemas() -> dict[str, _Schema]:
    """Fingerprint (hex) → every schema a readable record may have been written with: current and older."""
    schemas = {load_schema(n).fingerprint: load_schema(n) for n in _RECORD_TYPES}
    older = resources.files("streamtrain.wire").joinpath("schemas", "older")
    for entry in sorted(older.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".avsc"):
            old = _parse(entry.name.split(".")[0], "older", entry.name)
            schemas.setdefault(old.fingerprint, old)
    return schemas


@cache
def known_fingerprints() -> dict[str, str]:
    """Fingerprint (hex) → schema name, for every schema this build can read (older versions included)."""
    return {fp: schema.name for fp, schema in _writer_schemas().items()}


def fingerprint_of(record_type: type[Any]) -> str:
    """The fingerprint a record type is written with."""
    return load_schema(record_type.SCHEMA).fingerprint


def header_items(headers: Headers | None) -> list[tuple[str, bytes | None]]:
    """Headers in either confluent-kafka form as a list of (name, bytes or None)."""
    items = headers.items() if isinstance(headers, Mapping) else (headers or ())
    return [(k, v.encode() if isinstance(v, str) else v) for k, v in items]


def header_value(headers: Headers | None, name: str) -> bytes | None:
    """The last value of header `name` as bytes, or None when absent."""
    found: bytes | None = None
    for key, value in header_items(headers):
        if key == name:
            found = value
    return found


def encode(record: Record) -> tuple[bytes, HeaderList]:
    """Serialize a record to (value, headers) ready for `Producer.produce(value=..., headers=...)`."""
    schema = load_schema(record.SCHEMA)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema.parsed, record.to_dict())
    headers: HeaderList = [(SCHEMA_HEADER, schema.fingerprint.encode())]
    if isinstance(record, Sample):
        headers.append((SIZE_HEADER, str(record.size).encode()))
    return buf.getvalue(), headers


def decode(value: bytes | None, headers: Headers | None, expect: type[R], *, validate: bool = True,
           device: str | None = None) -> R:
    """Read a record of type `expect` from a Kafka value and its headers.

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
        WireError: a subclass saying exactly what is wrong: `MissingHeaderError`, `UnknownSchemaError`,
            `SchemaMismatchError`, `CorruptRecordError`, `SizeMismatchError`, or for samples
            `DeviceMismatchError` and (when `validate`) `InvalidSampleError`.
    """
    raw_fp = header_value(headers, SCHEMA_HEADER)
    if raw_fp is None:
        raise MissingHeaderError(f"record has no {SCHEMA_HEADER} header: cannot tell which schema wrote it")
    fp = raw_fp.decode("ascii", errors="replace")
    name = known_fingerprints().get(fp)
    if name is None:
        raise UnknownSchemaError(f"schema fingerprint {fp!r} is not one this build knows ({expect.SCHEMA} expected)")
    if name != expect.SCHEMA:
        raise SchemaMismatchError(f"record was written as {name}, but a {expect.SCHEMA} was expected here")
    if value is None:
        raise CorruptRecordError(f"{name} record has no value (a tombstone?)")
    size_header = header_value(headers, SIZE_HEADER) if expect is Sample else None
    if expect is Sample and size_header is None:
        raise MissingHeaderError(f"Sample has no {SIZE_HEADER} header")
    buf = io.BytesIO(value)
    try:
        writer = _writer_schemas()[fp]
        current = load_schema(name)
        # Resolution only for an older writer: reading with the writer's own schema skips it.
        data = fastavro.schemaless_reader(buf, writer.parsed, None if writer is current else current.parsed)
    except (EOFError, ValueError, IndexError, KeyError, UnicodeDecodeError, OverflowError, MemoryError) as exc:
        raise CorruptRecordError(f"{name} body is not valid Avro ({type(exc).__name__}: {exc})") from exc
    if buf.tell() != len(value):
        raise CorruptRecordError(f"{name} body has {len(value) - buf.tell()} trailing bytes after the record")
    try:
        record = cast(R, expect.from_dict(cast(dict[str, Any], data)))
    except (TypeError, ValueError) as exc:  # pragma: no cover - fastavro already checked the types
        raise CorruptRecordError(f"{name} body does not fit the record type: {exc}") from exc
    if isinstance(record, Sample):
        _check_sample(record, cast(bytes, size_header), validate)
        if device is not None and record.device_id != device:
            raise DeviceMismatchError(f"sample {record.device_id}#{record.seq} claims device {record.device_id!r} "
                                      f"but was read from device {device!r}'s topic")
    return record


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
            raise InvalidSampleError(f"sample {sample.device_id}#{sample.seq}: " + "; ".join(problems))
