"""The wire contract: Avro records in single-object encoding, their codec, typed decode errors, and topic names."""

from .codec import SCHEMA_HEADER, SIZE_HEADER, decode, encode, fingerprint_of, known_fingerprints
from .errors import (
    CorruptRecordError,
    DeviceMismatchError,
    InvalidSampleError,
    MissingHeaderError,
    SchemaMismatchError,
    SizeMismatchError,
    UnknownSchemaError,
    WireError,
)
from .records import (
    DTYPES,
    Assignment,
    DeadLetter,
    DevicePlan,
    Evaluation,
    OffsetRange,
    PendingSample,
    Sample,
    StepFeedback,
    expand_ranges,
    now_ms,
    ranges_of,
)
from .topics import TopicNames

__all__ = [
    "DTYPES",
    "SCHEMA_HEADER",
    "SIZE_HEADER",
    "Assignment",
    "CorruptRecordError",
    "DeadLetter",
    "DeviceMismatchError",
    "DevicePlan",
    "Evaluation",
    "InvalidSampleError",
    "MissingHeaderError",
    "OffsetRange",
    "PendingSample",
    "Sample",
    "SchemaMismatchError",
    "SizeMismatchError",
    "StepFeedback",
    "TopicNames",
    "UnknownSchemaError",
    "WireError",
    "decode",
    "encode",
    "expand_ranges",
    "fingerprint_of",
    "known_fingerprints",
    "now_ms",
    "ranges_of",
]
