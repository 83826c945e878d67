"""The previous layout, read for one release: a bare Avro body with the fingerprint in an ``st-schema`` header.

Until records were written in Avro's single-object encoding, the value was the Avro body alone and the
header ``st-schema`` held the writer schema's fingerprint as 16 hex digits of its little-endian bytes
(fastavro's rendering, the same bytes the single-object prefix now carries). Records in that layout
are still read, so the topics of a running job survive an upgrade; `encode_previous` writes them as
an older streamtrain did, for the tests that prove it. Drop this module with that promise.
"""

from __future__ import annotations

import io
from typing import Any

import fastavro

from .errors import UnknownSchemaError
from .layout import (
    SIZE_HEADER,
    HeaderList,
    WriterSchema,
    describe_known,
    load_schema,
    unknown_schema,
    writer_schemas,
)
from .records import Record, Sample

__all__ = ["SCHEMA_HEADER", "encode_previous", "previous_writer"]

#: The previous layout's header: the writer schema's fingerprint, hex of its 8 little-endian bytes.
SCHEMA_HEADER = "st-schema"


def previous_writer(header: bytes, expected: str) -> WriterSchema:
    """The schema an ``st-schema`` header names.

    Raises:
        UnknownSchemaError: the header is not the hex of a known fingerprint.
    """
    text = header.decode("ascii", errors="replace").strip()
    try:
        fp = bytes.fromhex(text)
    except ValueError:
        fp = b""
    if len(fp) != 8:
        raise UnknownSchemaError(f"{SCHEMA_HEADER} header {text[:40]!r} is not a schema fingerprint (16 hex digits of "
                                 f"its 8 wire bytes; {expected} expected); {describe_known(expected)}")
    schema = writer_schemas().get(fp)
    if schema is None:
        raise unknown_schema(fp, expected, f"the {SCHEMA_HEADER} header")
    return schema


def encode_previous(record: Record, version: int | None = None) -> tuple[bytes, HeaderList]:
    """`record` in the previous layout: (bare Avro body, headers ``st-schema`` and, for a sample, ``st-size``).

    Args:
        record: the record to write.
        version: the schema version to write it with (default: the current one); fields that version lacks
            are left out, as a service of that version would have.
    """
    schema = _version(record.SCHEMA, version)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema.parsed, _fields_of(schema, record.to_dict()))
    headers: HeaderList = [(SCHEMA_HEADER, schema.fingerprint.hex().encode())]
    if isinstance(record, Sample):
        headers.append((SIZE_HEADER, str(record.size).encode()))
    return buf.getvalue(), headers


def _version(name: str, version: int | None) -> WriterSchema:
    if version is None:
        return load_schema(name)
    for schema in writer_schemas().values():
        if schema.name == name and schema.version == version:
            return schema
    raise ValueError(f"no {name} schema of version {version}")


def _fields_of(schema: WriterSchema, data: dict[str, Any]) -> dict[str, Any]:
    names = {f["name"] for f in schema.parsed["fields"]}
    return {k: v for k, v in data.items() if k in names}
