"""Typed records of the wire contract, one per `.avsc` schema, with `to_dict`/`from_dict`.

The schemas in `schemas/` are the source of truth; these dataclasses are their Python face.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import numpy as np

__all__ = [
    "DTYPES",
    "Assignment",
    "DeadLetter",
    "DeviceLineage",
    "DevicePlan",
    "Evaluation",
    "ModelVersion",
    "OffsetRange",
    "PendingSample",
    "Prediction",
    "ProducedCount",
    "Record",
    "Sample",
    "StepFeedback",
    "expand_ranges",
    "now_ms",
    "ranges_of",
    "wire_dtype",
]

#: Payload element types a Sample may carry (the `DType` enum of Sample.avsc).
DTYPES: tuple[str, ...] = ("float32", "float16", "float64", "int8", "int16", "int32", "int64", "uint8")

#: Each wire dtype as the little-endian numpy dtype its bytes are read with: built once, not per sample (the
#: trainers' input path reads every sample's payload at least twice).
_READ_AS: dict[str, np.dtype] = {name: np.dtype(name).newbyteorder("<") for name in DTYPES}


def _byte_swapped(dtype: np.dtype) -> bool:
    return dtype.byteorder == ">" or (dtype.byteorder == "=" and sys.byteorder == "big")


#: numpy dtype, in either byte order -> (its DTYPES name, whether its bytes must be swapped: the wire is
#: little-endian). A dict lookup, because `dtype.name` is computed in Python on every access (the hot path).
_WIRE_DTYPES: dict[np.dtype, tuple[str, bool]] = {
    dtype: (name, _byte_swapped(dtype))
    for name in DTYPES for dtype in (np.dtype(name).newbyteorder("<"), np.dtype(name).newbyteorder(">"))
}


def wire_dtype(dtype: np.dtype) -> str | None:
    """The name the wire gives `dtype` (one of `DTYPES`), or None when it has none (bool, complex, uint16, ...)."""
    found = _WIRE_DTYPES.get(dtype)
    return None if found is None else found[0]


def now_ms() -> int:
    """Wall-clock time in milliseconds since the Unix epoch, as every record stores it."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Sample:
    """One variable-size training sample of one device's stream."""

    SCHEMA: ClassVar[str] = "Sample"

    device_id: str
    seq: int
    produced_at: int
    size: int
    shape: tuple[int, ...]
    dtype: str
    data: bytes
    label: int | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    target: tuple[float, ...] | None = None
    """Float target (regression values, multi-label 0/1 tags), row-major; None when the objective needs none."""

    @classmethod
    def from_array(
        cls,
        device_id: str,
        seq: int,
        array: np.ndarray,
        label: int | None = None,
        produced_at: int | None = None,
        metadata: dict[str, str] | None = None,
        target: Sequence[float] | np.ndarray | float | None = None,
    ) -> Sample:
        """Build a sample from an array whose first axis is the variable-length one (size = shape[0]).

        `target` (a number or any float sequence, flattened row-major) is the sample's float target.
        """
        arr = np.asarray(array)
        if arr.ndim == 0:
            raise ValueError("a sample's payload needs at least one axis (its size axis)")
        wire = _WIRE_DTYPES.get(arr.dtype)
        if wire is None:
            raise ValueError(f"dtype {arr.dtype.name!r} is not one of {', '.join(DTYPES)}")
        name, swap = wire
        if swap:
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        return cls(
            device_id=device_id,
            seq=seq,
            produced_at=now_ms() if produced_at is None else produced_at,
            size=arr.shape[0],
            shape=arr.shape,
            dtype=name,
            data=arr.tobytes(),  # C order whatever the input's layout
            label=label,
            metadata=dict(metadata or {}),
            target=None if target is None else tuple(float(v) for v in np.ravel(np.asarray(target, dtype=np.float64))),
        )

    def array(self) -> np.ndarray:
        """The payload as a read-only numpy array of `shape` and `dtype`."""
        dtype = _READ_AS.get(self.dtype) or np.dtype(self.dtype).newbyteorder("<")
        return np.frombuffer(self.data, dtype=dtype).reshape(self.shape)

    def problems(self) -> list[str]:
        """Why this sample cannot be trained, or an empty list when it can."""
        found: list[str] = []
        if self.size < 1:
            found.append(f"size {self.size} < 1")
        dtype = _READ_AS.get(self.dtype)
        if dtype is None:
            found.append(f"dtype {self.dtype!r} unknown")
            return found
        if not self.shape:
            found.append("shape is empty (a payload needs its size axis)")
            return found
        if any(d < 0 for d in self.shape):
            found.append(f"shape {list(self.shape)} has a negative dimension")
            return found
        if self.shape[0] != self.size:
            found.append(f"size {self.size} != shape[0] {self.shape[0]}")
        expected = math.prod(self.shape) * dtype.itemsize
        if expected != len(self.data):
            found.append(f"data is {len(self.data)} bytes but shape {list(self.shape)} of {self.dtype} "
                         f"needs {expected}")
        elif dtype.kind == "f" and not np.isfinite(np.frombuffer(self.data, dtype=dtype)).all():
            found.append("payload holds NaN or infinity")
        if self.target is not None and not all(math.isfinite(v) for v in self.target):
            found.append("target holds NaN or infinity")
        return found

    def to_dict(self) -> dict[str, Any]:
        # Built field by field: dataclasses.asdict deep-copies the payload, and this is the producers' hot path.
        return {
            "device_id": self.device_id,
            "seq": self.seq,
            "produced_at": self.produced_at,
            "size": self.size,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "data": self.data,
            "label": self.label,
            # A list: fastavro reads a tuple in a union as an explicit (branch, value) pair.
            "target": None if self.target is None else list(self.target),
            "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sample:
        return cls(
            device_id=d["device_id"],
            seq=d["seq"],
            produced_at=d["produced_at"],
            size=d["size"],
            shape=tuple(d["shape"]),
            dtype=d["dtype"],
            data=bytes(d["data"]),
            label=d.get("label"),
            metadata=dict(d.get("metadata") or {}),
            target=None if d.get("target") is None else tuple(d["target"]),
        )


@dataclass(frozen=True)
class PendingSample:
    """A sample a trainer has buffered: where it is and how big it is."""

    offset: int
    size: int


@dataclass(frozen=True)
class OffsetRange:
    """Offsets start, start + 1, ..., end - 1 of one partition."""

    start: int
    end: int


def ranges_of(offsets: Iterable[int]) -> tuple[OffsetRange, ...]:
    """The fewest ranges covering exactly `offsets` (any order; repeats count once)."""
    ranges: list[OffsetRange] = []
    start = end = None
    for offset in sorted(set(offsets)):
        if offset != end:
            if start is not None and end is not None:
                ranges.append(OffsetRange(start, end))
            start = offset
        end = offset + 1
    if start is not None and end is not None:
        ranges.append(OffsetRange(start, end))
    return tuple(ranges)


def expand_ranges(ranges: Sequence[OffsetRange]) -> np.ndarray:
    """Every offset of `ranges`, in their order, as an int64 array (a range with end <= start holds none)."""
    starts = np.fromiter((r.start for r in ranges), dtype=np.int64, count=len(ranges))
    lengths = np.maximum(np.fromiter((r.end for r in ranges), dtype=np.int64, count=len(ranges)) - starts, 0)
    if not lengths.sum():
        return np.zeros(0, dtype=np.int64)
    # Each range's start, repeated over its length, plus the position within it.
    firsts = np.repeat(starts, lengths)
    return firsts + np.arange(len(firsts), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)


@dataclass(frozen=True)
class StepFeedback:
    """What one rank did in one step."""

    SCHEMA: ClassVar[str] = "StepFeedback"

    job: str
    step: int
    device_id: str
    rank: int
    plan_step: int
    samples: int
    total_size: int
    compute_seconds: float
    data_wait_seconds: float
    comm_seconds: float
    step_seconds: float
    memory_bytes: int
    lowest_unprocessed_offset: int
    buffer_depth: int
    loss: float | None = None
    dropped: int = 0
    new_samples: tuple[PendingSample, ...] = ()
    trained_offsets: tuple[OffsetRange, ...] = ()
    """The records trained in the step: `samples` offsets, as ranges."""
    dropped_offsets: tuple[OffsetRange, ...] = ()
    """The records truncation dropped since the last report: `dropped` offsets, as ranges."""
    sent_at: int = field(default_factory=now_ms)
    plan_wait_seconds: float = 0.0
    hold_seconds: float = 0.0
    plan_round_trip_seconds: float = 0.0
    prequential: dict[str, float] = field(default_factory=dict)
    """Test-then-train metric sums of the samples the step trained, under the model before the step."""

    @property
    def wait_seconds(self) -> float:
        """Time the step waited before training: for its plan, then for the plan's samples."""
        return self.plan_wait_seconds + self.data_wait_seconds

    @property
    def started_at(self) -> float:
        """When the step began (its plan wait), in milliseconds since the Unix epoch, from the report's timings."""
        return self.sent_at - 1000.0 * (self.wait_seconds + self.step_seconds + self.hold_seconds)

    def to_dict(self) -> dict[str, Any]:
        d = _fields_of(self)
        d["new_samples"] = [_fields_of(p) for p in self.new_samples]
        d["trained_offsets"] = [_fields_of(r) for r in self.trained_offsets]
        d["dropped_offsets"] = [_fields_of(r) for r in self.dropped_offsets]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepFeedback:
        d = dict(d)
        d["new_samples"] = tuple(PendingSample(**p) for p in d.get("new_samples", ()))
        d["trained_offsets"] = tuple(OffsetRange(**r) for r in d.get("trained_offsets", ()))
        d["dropped_offsets"] = tuple(OffsetRange(**r) for r in d.get("dropped_offsets", ()))
        d["prequential"] = dict(d.get("prequential") or {})
        return cls(**d)


@dataclass(frozen=True)
class DevicePlan:
    """One device's part of a step plan."""

    device_id: str
    predicted_seconds: float
    weight: float
    offsets: tuple[int, ...] = ()
    count: int | None = None
    size_budget: int | None = None
    truncate_before: int | None = None


@dataclass(frozen=True)
class Assignment:
    """The coordinator's plan for one step."""

    SCHEMA: ClassVar[str] = "Assignment"

    job: str
    step: int
    policy: str
    step_time_target: float
    global_batch: int
    lr_scale: float
    devices: tuple[DevicePlan, ...]
    created_at: int = field(default_factory=now_ms)
    basis_step: int | None = None
    """The last step whose feedback the plan was made from (-1 before any); None: the step before `step`."""

    @property
    def seen_through(self) -> int:
        """The last step whose reported samples this plan could name (`basis_step`, else the step before it)."""
        return self.step - 1 if self.basis_step is None else self.basis_step

    def for_device(self, device_id: str) -> DevicePlan | None:
        """This plan's part for one device, or None when the device is not in it."""
        return next((d for d in self.devices if d.device_id == device_id), None)

    def to_dict(self) -> dict[str, Any]:
        d = _fields_of(self)
        d["devices"] = [_fields_of(p) for p in self.devices]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Assignment:
        d = dict(d)
        d["devices"] = tuple(DevicePlan(**{**p, "offsets": tuple(p.get("offsets", ()))}) for p in d["devices"])
        return cls(**d)


@dataclass(frozen=True)
class DeadLetter:
    """A record that could not be used, with why."""

    SCHEMA: ClassVar[str] = "DeadLetter"

    topic: str
    partition: int
    offset: int
    reason: str
    detail: str
    service: str
    failed_at: int = field(default_factory=now_ms)
    headers: dict[str, bytes] = field(default_factory=dict)
    key: bytes | None = None
    value: bytes | None = None

    def to_dict(self) -> dict[str, Any]:
        return _fields_of(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeadLetter:
        return cls(**d)


@dataclass(frozen=True)
class Evaluation:
    """One held-out evaluation of the trainers' shared model."""

    SCHEMA: ClassVar[str] = "Evaluation"

    job: str
    step: int
    dataset: str
    samples: int
    accuracy: float | None
    """Classification's accuracy; None for other objectives (their metrics are in `metrics`)."""
    loss: float
    seconds: float
    sent_at: int = field(default_factory=now_ms)
    objective: str = "classification"
    metrics: dict[str, float] = field(default_factory=dict)
    """The objective's held-out metrics and its baseline's (e.g. `rmse`, `baseline_rmse`)."""

    def to_dict(self) -> dict[str, Any]:
        return _fields_of(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Evaluation:
        return cls(**{**d, "metrics": dict(d.get("metrics") or {})})


@dataclass(frozen=True)
class ProducedCount:
    """`count` samples produced in [produced_at, produced_at + resolution) milliseconds."""

    produced_at: int
    count: int


@dataclass(frozen=True)
class DeviceLineage:
    """What a model version trained of one device's stream."""

    device_id: str
    offset: int
    """Every record below this offset was trained, truncated or dead-lettered by the version."""
    new_samples: tuple[ProducedCount, ...] = ()
    """The samples first trained in this version, by produced_at (what freshness is measured from)."""


@dataclass(frozen=True)
class ModelVersion:
    """A published model version: where its files are, what it trained, how good it is."""

    SCHEMA: ClassVar[str] = "ModelVersion"

    job: str
    version: int
    step: int
    location: str
    lineage: tuple[DeviceLineage, ...] = ()
    metrics: dict[str, float] = field(default_factory=dict)
    produced_at_resolution_ms: int = 10
    created_at: int = field(default_factory=now_ms)

    @property
    def offsets(self) -> dict[str, int]:
        """Device id -> the offset below which every record is in this version's lineage."""
        return {d.device_id: d.offset for d in self.lineage}

    def to_dict(self) -> dict[str, Any]:
        d = _fields_of(self)
        d["lineage"] = [{"device_id": x.device_id, "offset": x.offset,
                         "new_samples": [_fields_of(p) for p in x.new_samples]} for x in self.lineage]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelVersion:
        d = dict(d)
        d["lineage"] = tuple(DeviceLineage(x["device_id"], x["offset"],
                                           tuple(ProducedCount(**p) for p in x.get("new_samples", ())))
                             for x in d.get("lineage", ()))
        d["metrics"] = dict(d.get("metrics") or {})
        return cls(**d)


@dataclass(frozen=True)
class Prediction:
    """`serve`'s answer to one request: the output and the version that made it, or the reason there is none."""

    SCHEMA: ClassVar[str] = "Prediction"

    job: str
    request_topic: str
    request_partition: int
    request_offset: int
    version: int
    answered_at: int = field(default_factory=now_ms)
    request_produced_at: int | None = None
    label: int | None = None
    label_name: str | None = None
    probabilities: tuple[float, ...] = ()
    values: tuple[float, ...] = ()
    tags: tuple[int, ...] = ()
    error: str | None = None
    error_detail: str | None = None
    objective: str | None = None
    value_shape: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = _fields_of(self)
        for name in ("probabilities", "values", "tags", "value_shape"):
            d[name] = list(d[name])  # fastavro reads a tuple inside a union as a (branch, value) pair
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Prediction:
        d = dict(d)
        for name in ("probabilities", "values", "tags", "value_shape"):
            d[name] = tuple(d.get(name) or ())
        return cls(**d)


def _fields_of(record: Any) -> dict[str, Any]:
    """A record's fields as the dict fastavro writes, without copying them.

    `dataclasses.asdict` deep-copies every value (each offset of a plan, each pending sample of a report),
    which made encoding the largest part of publishing a plan; the records are frozen, and fastavro only
    reads the values (tuples serve as Avro arrays).
    """
    return {f.name: getattr(record, f.name) for f in fields(record)}


Record = Sample | StepFeedback | Assignment | DeadLetter | Evaluation | ModelVersion | Prediction
