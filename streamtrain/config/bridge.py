"""Bridge settings (`[bridge]` in the TOML file, STREAMTRAIN_BRIDGE__* in the environment).

The bridge reads topics that already exist in a user's own format and writes each record, decoded, to its
device's topic as a `Sample`, exactly once (Kafka transactions). Each source topic names its decoder: the
built-in `json` (a field mapping) or `raw` (little-endian arrays of one dtype and shape), or a user's
`package.module:function`. The topics are on the stack's own cluster (`kafka`), or on another one
(`bridge.source_cluster`: its own address and security).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..wire.topics import validate_name_part
from .cluster import ClusterConfig
from .parsing import text_as_tuple

__all__ = ["BUILTIN_DECODERS", "BridgeConfig", "JsonMapping", "RawLayout", "SourceClusterConfig", "SourceConfig",
           "WireDType"]

#: Decoders the bridge has built in; anything else is a user's `package.module:function`.
BUILTIN_DECODERS = ("json", "raw")

#: The dtypes a Sample's payload may have (`streamtrain.wire.DTYPES`).
WireDType = Literal["float32", "float16", "float64", "int8", "int16", "int32", "int64", "uint8"]

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def _check_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    if not shape or len(shape) > 2:
        raise ValueError(f"shape {list(shape)}: a sample is [size, features] (one axis: a series of scalars, written "
                         "as [size, 1]); give one or two axes")
    if sum(d == -1 for d in shape) > 1 or any(d == 0 or d < -1 for d in shape):
        raise ValueError(f"shape {list(shape)}: each dimension is positive, at most one is -1 (inferred)")
    return shape


class JsonMapping(_Section):
    """Where the `json` decoder finds each part of a sample in a JSON object (one object per record value).

    Each record value is one JSON object, one sample: a line of JSON lines, as kcat or a log shipper sends
    them (surrounding white space and the line's newline are ignored). Field names may be dotted to reach into
    nested objects (`payload.values`).
    """

    data: str = "data"
    """Field holding the array: a list of numbers, or nested lists (one list per frame)."""

    shape: tuple[int, ...] | None = None
    """Shape the array is given, row-major, [size, features]; one dimension may be -1, inferred from the length
    (e.g. [-1, 16]: 16 features per frame, any number of frames). None: the nested lists' own shape. A flat list
    (or one axis, [-1]) is a series of scalars, written as [size, 1]."""

    dtype: WireDType = "float32"
    """Element type of the sample's payload."""

    label: str | None = None
    """Field holding the class label (an integer); None: no label."""

    target: str | None = None
    """Field holding the float target (a number or a list of numbers: regression, multi-label); None: none."""

    device: str | None = None
    """Field holding the device id; None: the record's key (UTF-8)."""

    time: str | None = None
    """Field holding when the sample was produced (see `time_unit`); None: the record's Kafka timestamp."""

    time_unit: Literal["ms", "s", "iso"] = "ms"
    """Unit of `time`: milliseconds or seconds since the Unix epoch, or an ISO 8601 string."""

    seq: str | None = None
    """Field holding the producer's number of the sample; None: the record's offset."""

    metadata: tuple[str, ...] = ()
    """Fields copied, as text, into the sample's metadata (by their names)."""

    @field_validator("shape")
    @classmethod
    def _shape_is_usable(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        return None if value is None else _check_shape(value)


class RawLayout(_Section):
    """How the `raw` decoder reads a record value: a little-endian array of one dtype, in C (row-major) order."""

    dtype: WireDType = "float32"
    """Element type of the array (little-endian on the wire)."""

    shape: tuple[int, ...] = (-1,)
    """Shape of the array, [size, features]; one dimension may be -1, inferred from the value's length (e.g.
    [-1, 16]). One axis ([-1], the default) is a series of scalars, written as [size, 1]."""

    label_header: str | None = None
    """Record header holding the class label (decimal ASCII); None: no label."""

    @field_validator("shape")
    @classmethod
    def _shape_is_usable(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        return _check_shape(value)


class SourceConfig(_Section):
    """One existing topic the bridge reads, and how its records become samples."""

    topic: str
    """The topic to read (any number of partitions)."""

    decoder: str = "json"
    """`json` (see `mapping`), `raw` (see `layout`) or a user's `package.module:function` (see `options`)."""

    mapping: JsonMapping = Field(default_factory=JsonMapping)
    """The `json` decoder's field mapping."""

    layout: RawLayout = Field(default_factory=RawLayout)
    """The `raw` decoder's dtype and shape."""

    options: dict[str, Any] = Field(default_factory=dict)
    """A user decoder's settings, passed to it as keyword arguments after the record."""

    @field_validator("topic")
    @classmethod
    def _topic_is_legal(cls, value: str) -> str:
        if not _TOPIC.match(value) or value in (".", ".."):
            raise ValueError(f"{value!r} is not a Kafka topic name (letters, digits, . _ -; at most 249)")
        return value

    @field_validator("decoder")
    @classmethod
    def _decoder_is_known(cls, value: str) -> str:
        if value not in BUILTIN_DECODERS and not _DOTTED.match(value):
            raise ValueError(f"{value!r} is neither a built-in decoder ({', '.join(BUILTIN_DECODERS)}) nor "
                             "package.module:function")
        return value

    @model_validator(mode="after")
    def _settings_fit_the_decoder(self) -> Self:
        own = {"json": "mapping", "raw": "layout"}.get(self.decoder, "options")
        # Another decoder's settings, set to anything but their defaults, were meant for a decoder this is not
        # (defaults pass: a whole configuration written out and read back holds every section).
        unused = {"mapping": self.mapping != JsonMapping(), "layout": self.layout != RawLayout(),
                  "options": bool(self.options)}
        for name, changed in unused.items():
            if name != own and changed:
                raise ValueError(f"{name} is for {_decoder_of(name)}; this source's decoder is "
                                 f"{self.decoder}, whose settings are `{own}`")
        return self


class SourceClusterConfig(ClusterConfig):
    """The Kafka cluster the bridge reads its sources from, when it is not the stack's (`kafka`): its own address
    and security, the fields of `kafka` that say how to reach a cluster. The bridge writes to the stack's cluster
    and keeps its progress there (see docs/guides/bridge.md: exactly once across two clusters)."""

    setting: ClassVar[str] = "bridge.source_cluster"

    bootstrap_servers: str
    """Comma-separated host:port list of the source cluster's brokers (required: no default, so a section set by
    its password alone does not read the stack's own cluster by mistake)."""


def _decoder_of(section: str) -> str:
    return {"mapping": "the json decoder", "layout": "the raw decoder"}.get(section, "a user's decoder")


class BridgeConfig(_Section):
    """The bridge: existing topics in, one `Sample` per decodable record out to its device's topic, exactly once."""

    sources: tuple[SourceConfig, ...] = ()
    """The topics to bridge, each with its decoder ([[bridge.sources]] tables in TOML)."""

    devices: tuple[str, ...] = ()
    """Devices whose topics the bridge writes; a record for any other is dead-lettered (unknown-device).
    Empty: coordinator.devices."""

    source_cluster: SourceClusterConfig | None = None
    """The cluster the sources are on, when it is not the stack's: its bootstrap_servers, security_protocol,
    sasl_* and ssl_* as in `kafka` ([bridge.source_cluster] in TOML, STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__* in the
    environment, where an empty value leaves a setting unset). None: the sources are on `kafka`'s cluster."""

    group_id: str | None = None
    """Consumer group of the bridge's reads (its committed offsets are its progress); None: <job>.bridge."""

    instance: str = "0"
    """This bridge's name among several sharing the group: its transactional id and static group membership are
    <group_id>.<instance>, which must stay the same across restarts (a restarted bridge fences its previous self
    by it, and takes its partitions back at once)."""

    transaction_records: int = Field(default=500, ge=1, le=100_000)
    """Most source records per transaction (more: higher throughput, longer transactions)."""

    transaction_seconds: float = Field(default=0.1, gt=0.0, le=60.0)
    """Longest a transaction stays open before it commits: what a bridged sample may wait to become visible."""

    transaction_timeout_seconds: float = Field(default=30.0, ge=1.0, le=900.0)
    """The broker aborts a transaction left open this long (a bridge that died mid-way and did not come back);
    until then read_committed readers of its topics wait behind it (Kafka's transaction.timeout.ms)."""

    check_records: int = Field(default=20, ge=0, le=10_000)
    """Records of each source topic the decoder is tried on at start-up (read, not committed): when too few of
    them decode (`check_min_decoded`), the bridge does not start, and says which setting is wrong. 0: no check."""

    check_min_decoded: float = Field(default=0.5, ge=0.0, le=1.0)
    """Least share of those records (skipped ones aside) that must decode for the bridge to start: a shape that
    fits a few records by chance fails the check rather than dead-letter most of the stream. 0: start whatever
    they are (each rejected record is dead-lettered)."""

    check_seconds: float = Field(default=5.0, gt=0.0, le=300.0)
    """Longest wait for those records (a topic with fewer checks those it has)."""

    create_topics: bool = True
    """Create the device and dead-letter topics that do not exist yet (with ACLs on, the admin creates them)."""

    metrics: bool = True
    """Serve Prometheus metrics on metrics.port (0: a free port)."""

    _devices_from_text = field_validator("devices", mode="before")(text_as_tuple)

    @field_validator("devices")
    @classmethod
    def _devices_are_legal(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError(f"devices {list(value)} name a device more than once")
        for device in value:
            validate_name_part("device id", device)
        return value

    @field_validator("source_cluster", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        """Empty values are unset settings (Compose's `${VAR:-}`); a section of nothing but those is no section."""
        if value == "":
            return None
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if v != ""}
            return value or None
        return value

    @field_validator("group_id", "instance")
    @classmethod
    def _name_is_legal(cls, value: str | None) -> str | None:
        return None if value is None else validate_name_part("name", value)

    @field_validator("sources")
    @classmethod
    def _topics_are_distinct(cls, value: tuple[SourceConfig, ...]) -> tuple[SourceConfig, ...]:
        topics = [s.topic for s in value]
        twice = sorted({t for t in topics if topics.count(t) > 1})
        if twice:
            raise ValueError(f"topic {', '.join(twice)} is listed more than once (one decoder per topic)")
        return value

    @model_validator(mode="after")
    def _timeout_outlasts_a_transaction(self) -> Self:
        if self.transaction_timeout_seconds <= 2 * self.transaction_seconds:
            raise ValueError(f"transaction_timeout_seconds ({self.transaction_timeout_seconds:g}) must exceed twice "
                             f"transaction_seconds ({self.transaction_seconds:g})")
        return self

    def group(self, job: str) -> str:
        """The consumer group the bridge reads in."""
        return self.group_id or f"{job}.bridge"

    def transactional_id(self, job: str) -> str:
        """The producer's transactional id: the same across restarts, distinct per instance."""
        return f"{self.group(job)}.{self.instance}"
