"""The byte layout's constants, and the schemas a record may be written with with their fingerprints.

Every record is in Avro's single-object encoding: `MARKER` (``C3 01``), the writer schema's 8-byte
fingerprint, the Avro binary body. A sample also carries the header `SIZE_HEADER` (``st-size``, its size
in decimal ASCII), so a consumer sees its cost without decoding it.

A schema's fingerprint is the CRC-64-AVRO (Rabin) fingerprint of its Parsing Canonical Form: a 64-bit
number, written on the wire as 8 little-endian bytes (Avro's single-object encoding). The same number
has two renderings that people confuse: the hex of the 8 wire bytes in order (what fastavro prints, and
what streamtrain's logs and errors call "wire bytes") and the hex of the number itself (what Java's
`SchemaNormalization.parsingFingerprint64` returns as a `long`), which reads as the same bytes reversed.
Errors name both.

Every schema version stays readable: the current `.avsc` files in `schemas/` and the versions before
them in `schemas/older/<Name>.<n>.avsc`; a record written with an older version is resolved to the
current one (Avro schema resolution: the fields it lacks take their defaults).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from .errors import UnknownSchemaError

__all__ = [
    "MARKER",
    "PREFIX_SIZE",
    "RECORD_SCHEMAS",
    "SIZE_HEADER",
    "HeaderList",
    "Headers",
    "WriterSchema",
    "describe_known",
    "fingerprint_of",
    "known_fingerprints",
    "load_schema",
    "unknown_schema",
    "writer_schemas",
]

#: The two bytes that open every record in Avro's single-object encoding (format version 1).
MARKER = b"\xc3\x01"
#: Marker and fingerprint: the bytes before a record's Avro body.
PREFIX_SIZE = 10
#: A sample's size (`Sample.size`, decimal ASCII): required on every sample.
SIZE_HEADER = "st-size"
#: Kafka record headers as confluent-kafka takes and returns them.
HeaderList = list[tuple[str, str | bytes | None]]
Headers = Mapping[str, str | bytes | None] | Sequence[tuple[str, str | bytes | None]]
#: The record schemas of the wire, by name (each a `.avsc` file in `schemas/`).
RECORD_SCHEMAS = ("Sample", "StepFeedback", "Assignment", "DeadLetter", "Evaluation", "ModelVersion", "Prediction",
                  "DeviceProfile")


@dataclass(frozen=True)
class WriterSchema:
    """One schema version a record may have been written with."""

    name: str
    """The record's name, e.g. "Sample"."""
    version: int
    """1 for the first version; the current one is the highest."""
    fingerprint: bytes
    """The CRC-64-AVRO fingerprint of the Parsing Canonical Form, as its 8 bytes stand on the wire (little-endian)."""
    parsed: Any = field(repr=False, compare=False)
    """The fastavro-parsed schema."""
    reader: Any = field(default=None, repr=False, compare=False)
    """The current schema of `name` when this version is older (to resolve to), else None."""

    @property
    def prefix(self) -> bytes:
        """The 10 bytes a record written with this schema starts with: the marker, then the fingerprint."""
        return MARKER + self.fingerprint

    @property
    def java_fingerprint(self) -> int:
        """The fingerprint as Java's `SchemaNormalization.parsingFingerprint64` returns it (a signed `long`)."""
        return int.from_bytes(self.fingerprint, "little", signed=True)

    def describe(self) -> str:
        """E.g. "Sample v2 = wire bytes 05e0a74cc3ad3be8 (Java parsingFingerprint64 0xe83badc34ca7e005)"."""
        return f"{self.name} v{self.version} = wire bytes {self.fingerprint.hex()} ({_java_hex(self.fingerprint)})"


def _java_hex(fp: bytes) -> str:
    return f"Java parsingFingerprint64 0x{int.from_bytes(fp, 'little'):016x}"


def _parse(name: str, version: int, *path: str) -> WriterSchema:
    text = resources.files("streamtrain.wire").joinpath("schemas", *path).read_text()
    parsed = fastavro.parse_schema(json.loads(text), named_schemas={})
    # fastavro renders the fingerprint as the hex of its little-endian bytes: exactly the bytes on the wire.
    fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))
    return WriterSchema(name, version, fp, parsed)


def _older_versions() -> dict[str, list[tuple[int, str]]]:
    """Name → [(version, file name)] of the kept older schema files."""
    found: dict[str, list[tuple[int, str]]] = {}
    older = resources.files("streamtrain.wire").joinpath("schemas", "older")
    for entry in older.iterdir():
        parts = entry.name.split(".")
        if len(parts) == 3 and parts[2] == "avsc" and parts[1].isdigit():
            found.setdefault(parts[0], []).append((int(parts[1]), entry.name))
    return {name: sorted(versions) for name, versions in found.items()}


@cache
def load_schema(name: str) -> WriterSchema:
    """The current version of schema `name` (e.g. "Sample"): the one records are written with."""
    older = _older_versions().get(name, [])
    return _parse(name, 1 + max((v for v, _ in older), default=0), f"{name}.avsc")


@cache
def writer_schemas() -> dict[bytes, WriterSchema]:
    """Fingerprint (the 8 wire bytes) → every schema version a readable record may have been written with."""
    schemas = {load_schema(n).fingerprint: load_schema(n) for n in RECORD_SCHEMAS}
    for name, versions in _older_versions().items():
        current = load_schema(name)
        for version, file in versions:
            old = _parse(name, version, "older", file)
            schemas.setdefault(old.fingerprint, WriterSchema(name, version, old.fingerprint, old.parsed,
                                                             current.parsed))
    return schemas


def known_fingerprints() -> dict[bytes, str]:
    """Fingerprint (the 8 wire bytes) → schema name, for every schema this build can read (older versions too)."""
    return {fp: schema.name for fp, schema in writer_schemas().items()}


def fingerprint_of(record_type: type[Any]) -> bytes:
    """The fingerprint (8 wire bytes) a record type is written with."""
    return load_schema(record_type.SCHEMA).fingerprint


def describe_known(expected: str) -> str:
    """Every readable schema version in both renderings, `expected`'s first (for errors)."""
    known = sorted(writer_schemas().values(), key=lambda s: (s.name != expected, s.name, -s.version))
    return "known: " + ", ".join(s.describe() for s in known)


def unknown_schema(fp: bytes, expected: str, where: str) -> UnknownSchemaError:
    """The error for a fingerprint no known schema has, naming every one that is known, in both renderings.

    Args:
        fp: the 8 fingerprint bytes as the record carries them.
        expected: the record type the topic carries.
        where: where the fingerprint was found (the value's prefix, or a header).
    """
    hint = ""
    reversed_of = writer_schemas().get(fp[::-1])
    if reversed_of is not None:
        hint = (f"; these are {reversed_of.name} v{reversed_of.version}'s bytes in reverse order: the fingerprint "
                "goes on the wire little-endian (Java's BinaryMessageEncoder writes it so)")
    return UnknownSchemaError(f"schema fingerprint {fp.hex()} ({_java_hex(fp)}) in {where} is not one this build "
                              f"knows ({expected} expected){hint}; {describe_known(expected)}")
