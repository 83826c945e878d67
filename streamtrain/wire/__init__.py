"""The wire contract: Avro records, their codec, typed decode errors, and topic names."""

from .codec import SCHEMA_HEADER, SIZE_HEADER, decode, encode, fingerprint_of, known_fingerprints
from .errors import (
    CorruptRecordError,
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
    PendingSample,
    Sample,
    StepFeedback,
    now_ms,
)
from .topics import TopicNames

__all__ = [
    "DTYPES",
    "SCHEMA_HEADER",
    "SIZE_HEADER",
    "Assignment",
    "CorruptRecordError",
    "DeadLetter",
    "DevicePlan",
    "Evaluation",
    "InvalidSampleError",
    "MissingHeaderError",
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
    "fingerprint_of",
    "known_fingerprints",
    "now_ms",
]
