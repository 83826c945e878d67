"""Decoders of the bridge: records of a user's own topics in, `Sample` fields out (see `contract`).

Built in: `json` (a field mapping) and `raw` (little-endian arrays of one dtype and shape). Anything else is a
user's `package.module:function` by the contract in `contract`.
"""

from .builtin import JsonDecoder, RawDecoder
from .contract import (
    FIELDS,
    SKIPPED_REASON,
    SOURCE_KEY,
    ContractError,
    Rejected,
    SampleFields,
    SourceRecord,
    source_of,
    to_sample,
)
from .loading import Decoder, DecoderSetupError, build_decoder

__all__ = [
    "FIELDS",
    "SKIPPED_REASON",
    "SOURCE_KEY",
    "ContractError",
    "Decoder",
    "DecoderSetupError",
    "JsonDecoder",
    "RawDecoder",
    "Rejected",
    "SampleFields",
    "SourceRecord",
    "build_decoder",
    "source_of",
    "to_sample",
]
