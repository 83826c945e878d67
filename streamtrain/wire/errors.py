"""Typed errors for records that cannot be read; each carries the reason code dead letters use."""

from __future__ import annotations

__all__ = [
    "CorruptRecordError",
    "DeviceMismatchError",
    "InvalidSampleError",
    "MissingHeaderError",
    "SchemaMismatchError",
    "SizeMismatchError",
    "UnknownSchemaError",
    "WireError",
]


class WireError(ValueError):
    """A record that cannot be used. `reason` is the short code written to the dead-letter topic."""

    reason = "invalid"


class MissingHeaderError(WireError):
    """A required header is absent: a sample's ``st-size``."""

    reason = "missing-header"


class UnknownSchemaError(WireError):
    """The schema fingerprint is not one this build can read (the message lists those it can)."""

    reason = "unknown-schema"


class SchemaMismatchError(WireError):
    """A known schema, but not the record type expected on this topic."""

    reason = "wrong-schema"


class CorruptRecordError(WireError):
    """The value is in no layout streamtrain reads (no ``C3 01`` marker, no previous-layout header), ends inside
    its prefix, is empty, or its body is not a valid Avro encoding of the schema its fingerprint names."""

    reason = "corrupt"


class SizeMismatchError(WireError):
    """The ``st-size`` header disagrees with the record's size (or is not a number)."""

    reason = "size-mismatch"


class InvalidSampleError(WireError):
    """A well-formed sample that cannot be trained: bad size, shape ≠ data length, NaN/inf payload."""

    reason = "invalid-sample"


class DeviceMismatchError(WireError):
    """A sample whose ``device_id`` is not the device of the topic it was read from.

    A device topic is one device's stream: a sample claiming another device was written to the wrong topic
    (or forged), and training it as the topic's device would mix two streams' data and accounting.
    """

    reason = "device-mismatch"
