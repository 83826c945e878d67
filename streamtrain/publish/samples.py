"""What a device may publish, checked before anything is queued, and its encoding into one wire record.

Every check here names the argument and says why it is refused: a sample the trainers could not use
(no size axis, a dtype the wire lacks, NaN or infinity) is refused at the device, where the caller can
still fix it, rather than dead-lettered downstream.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, NamedTuple, cast

import numpy as np

from ..wire import DTYPES
from ..wire.codec import SIZE_HEADER, HeaderList, Sample, encode_array, load_schema
from ..wire.records import now_ms, wire_dtype
from ..wire.sample_writer import _ONE_BYTE
from ..wire.sample_writer import varint as _varint

__all__ = ["DeviceEncoder", "EncodedSample", "check_payload", "encode_device_sample", "seq_of"]

_LONG = 2**63
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class EncodedSample(NamedTuple):
    """One sample as it goes on the wire: the record's value and headers, and its size (shape[0])."""

    value: bytes
    headers: HeaderList
    size: int


def check_payload(array: Any) -> np.ndarray:
    """`array` as a numpy array the wire carries, or a clear error.

    Raises:
        TypeError: a dtype the wire has no code for (bool, complex, object, strings, uint16 ...).
        ValueError: a 0-d or 1-D array (a sample is (size, features)), an empty size axis, or NaN / infinity in a
            float array.
    """
    arr = array if isinstance(array, np.ndarray) else np.asarray(array)
    name = wire_dtype(arr.dtype)
    if name is None:
        raise TypeError(f"array dtype {arr.dtype.name!r} is not one the wire carries ({', '.join(DTYPES)}): "
                        "convert it first, e.g. array.astype(np.float32)")
    if arr.ndim == 0:
        raise ValueError("array is 0-d: a sample is (size, features); wrap a scalar as np.array([[value]])")
    if arr.ndim == 1:
        raise ValueError(f"array of shape {arr.shape} is 1-D: a sample is (size, features), its frames along the "
                         "first axis; reshape a series of one feature with x.reshape(-1, 1), or one frame of "
                         "features with x.reshape(1, -1)")
    if arr.shape[0] == 0:
        raise ValueError(f"array of shape {arr.shape} has an empty size axis (shape[0] = 0): "
                         "a sample holds at least one step")
    if name[0] == "f" and not _all_finite(arr):
        bad = np.argwhere(~np.isfinite(arr))
        raise ValueError(f"array holds {len(bad)} NaN or infinite value(s), the first at index "
                         f"{tuple(int(i) for i in bad[0])}: the trainers would refuse the sample")
    return arr


def _all_finite(arr: np.ndarray) -> bool:
    """Whether a float array holds no NaN or infinity."""
    if arr.dtype.itemsize >= 4:
        # One BLAS dot product instead of a boolean array: a NaN or an infinity makes the sum of squares NaN or
        # inf. Only finite values too large to square in range make it inf as well; the exact check clears them.
        flat = arr.reshape(-1)
        if math.isfinite(flat.dot(flat)):
            return True
    return bool(np.isfinite(arr).all())


def _check_label(label: object) -> int | None:
    if label is None or (type(label) is int and -_LONG <= label < _LONG):  # the common cases first: every sample
        return label
    if isinstance(label, bool) or not isinstance(label, Integral):
        raise TypeError(f"label must be an int (a class index) or None, not {type(label).__name__}; "
                        "a float target goes in target=")
    value = int(label)
    if not -_LONG <= value < _LONG:
        raise ValueError(f"label {value} does not fit the wire's 64-bit integer")
    return value


def _check_target(target: Sequence[float] | np.ndarray | float | None) -> tuple[float, ...] | None:
    if target is None:
        return None
    try:
        values = np.ravel(np.asarray(target, dtype=np.float64))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"target must be a number or a sequence of numbers, not {type(target).__name__} "
                        f"({exc})") from None
    if not np.isfinite(values).all():
        raise ValueError(f"target holds {int((~np.isfinite(values)).sum())} NaN or infinite value(s): "
                         "the loss would not be finite")
    if values.size and float(np.abs(values).max()) > _FLOAT32_MAX:
        raise ValueError("target holds a value beyond 32-bit float range (the wire stores targets as float32)")
    return tuple(values.tolist())


def _check_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    if metadata is None:
        return {}
    if type(metadata) is dict and all(type(k) is str and type(v) is str for k, v in metadata.items()):
        return dict(metadata)
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a mapping of str to str, not {type(metadata).__name__}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"metadata must map str to str: {key!r}: {value!r} is "
                            f"{type(key).__name__} -> {type(value).__name__}")
    return dict(metadata)


def _check_produced_at(produced_at: object) -> int | None:
    if produced_at is None:
        return None
    if type(produced_at) is int and 0 <= produced_at < _LONG:
        return produced_at
    if isinstance(produced_at, bool) or not isinstance(produced_at, Integral):
        kind = "a float" if isinstance(produced_at, Real) else type(produced_at).__name__
        raise TypeError(f"produced_at must be int milliseconds since the Unix epoch, not {kind}")
    value = int(produced_at)
    if not 0 <= value < _LONG:
        raise ValueError(f"produced_at {value} is not milliseconds since the Unix epoch (>= 0)")
    return value


def encode_device_sample(
    device: str,
    seq: int,
    array: Any,
    *,
    label: int | None = None,
    target: Sequence[float] | np.ndarray | float | None = None,
    metadata: Mapping[str, str] | None = None,
    produced_at: int | None = None,
) -> EncodedSample:
    """Check one sample and encode it as device `device`'s sample number `seq` (`streamtrain.wire.encode`).

    Args:
        device: the device id.
        seq: the sample's number.
        array: the payload; its first axis is the size axis (size = shape[0]).
        label: class index, or None.
        target: float target (a number or a sequence, flattened row-major), or None.
        metadata: extra str -> str metadata.
        produced_at: production time in ms since the epoch; None stamps now.

    Returns:
        The record's value, headers and size.

    Raises:
        TypeError: an argument of the wrong type (see `check_payload` for the array).
        ValueError: an argument of the right type the wire or the trainers cannot take.
    """
    arr = check_payload(array)
    value, headers = encode_array(device, seq, arr, label=_check_label(label),
                                  produced_at=_check_produced_at(produced_at), metadata=_check_metadata(metadata),
                                  target=_check_target(target))
    return EncodedSample(value, headers, arr.shape[0])


#: Records with neither target nor metadata end with both unions' empty branches.
_NO_TARGET_NO_METADATA = b"\x00\x00"
#: Layouts, sizes and labels kept as bytes, each (a device has a few; more go the general way or are worked out).
_KEPT = 1024
#: A varint's first byte when more follow (the continuation bit set), by its low 7 bits.
_LOW = tuple(bytes((n | 0x80,)) for n in range(0x80))
_new_tuple = tuple.__new__


@dataclass
class _Layout:
    """A layout (a sample's shape past its size axis, and its dtype) as written: each size's bytes from the size
    field to the payload's length, and its size header."""

    ndim: bytes
    rest: bytes
    """The shape past the size axis, the array's end, and the dtype's code."""
    row_bytes: int
    floats: bool
    """Whether the payload is floats (checked for NaN and infinity)."""

    def middle(self, size: int) -> tuple[bytes, HeaderList]:
        size_bytes = _varint(size)
        headers: HeaderList = [(SIZE_HEADER, str(size).encode())]
        return b"".join((size_bytes, self.ndim, size_bytes, self.rest, _varint(size * self.row_bytes))), headers


#: What `DeviceEncoder` has for a layout it has not seen yet.
_UNSEEN = _Layout(b"", b"", 0, False)


def _unsigned(n: int) -> bytes:
    """`n` >= 0 as LEB128, 7 bits a byte, low bits first: the varint of the long whose zigzag is `n`."""
    return _varint((n >> 1) ^ -(n & 1))


def seq_of(value: bytes, start: int) -> int:
    """The seq of a record `DeviceEncoder` wrote, read back from its value (its Avro long after the device id,
    which ends at `start`): for a delivery report, whose message carries no more than the record."""
    shift = n = 0
    for byte in value[start:start + 10]:
        n |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            break
    return (n >> 1) ^ -(n & 1)


class DeviceEncoder:
    """`encode_device_sample` for one device, with what repeats from record to record worked out once.

    A device sends samples of one layout (the shape past the size axis, the dtype) over and over: the schema prefix
    and device id, each whole shape's bytes (shape, dtype code, payload length) and size header, the seq's high
    bytes, the time and small labels are kept as bytes, and a record is those joined with its seq's low byte and its
    payload (read in place when C-contiguous, not copied first). A shape seen before is found with one dict lookup
    on `array.shape`; its NaN/infinity check is one dot product. The first record of each layout is checked byte for
    byte against the general encoder (`streamtrain.wire.encode_array`); a layout that differed, a target or metadata
    take the general path. Not thread-safe: the producer calls it under its send lock.
    """

    def __init__(self, device: str) -> None:
        self.device = device
        schema = load_schema(Sample.SCHEMA)
        self.head = schema.prefix + _varint(len(device.encode())) + device.encode()
        dtype_field: dict[str, Any] = next((f["type"] for f in schema.parsed["fields"] if f["name"] == "dtype"), {})
        self._codes = {name: _varint(i) for i, name in enumerate(dtype_field.get("symbols", ()))}
        self._layouts: dict[tuple[tuple[int, ...], np.dtype], _Layout | None] = {}
        #: Whole shapes of the fast path: (dtype, bytes from the size field to the payload's length, size header,
        #: floats, size). One dtype a shape: a shape sent with another dtype replaces it.
        self._shapes: dict[tuple[int, ...], tuple[np.dtype, bytes, HeaderList, bool, int]] = {}
        self._labels: dict[int | None, bytes] = {None: b"\x00"}
        self._at, self._at_bytes = -1, b""
        self._seq_high, self._seq_high_bytes = 0, b""

    def encode(self, seq: int, array: Any, *, label: int | None = None,
               target: Sequence[float] | np.ndarray | float | None = None, metadata: Mapping[str, str] | None = None,
               produced_at: int | None = None) -> EncodedSample:
        """As `encode_device_sample(self.device, seq, array, ...)`, byte for byte, and raising alike."""
        if type(array) is not np.ndarray or target is not None or metadata:
            return encode_device_sample(self.device, seq, array, label=label, target=target, metadata=metadata,
                                        produced_at=produced_at)
        known = self._shapes.get(array.shape)
        if known is None or known[0] is not array.dtype:
            return self._unknown_shape(seq, array, label, produced_at)
        flat = array.ravel()  # a view when C-contiguous, else the C-order copy tobytes() would make
        if known[3] and not math.isfinite(flat.dot(flat)) and not np.isfinite(flat).all():
            check_payload(array)  # raises, naming the first bad value (a finite sum of squares may overflow)
        # The seq's varint: its low byte, and the bytes above it (unchanged for 64 records in a row).
        n = (seq << 1) ^ (seq >> 63)
        high = n >> 7
        if high != self._seq_high:
            self._seq_high, self._seq_high_bytes = high, _unsigned(high) if high else b""
        if produced_at is None or produced_at != self._at or type(produced_at) is not int:
            self._stamp(produced_at)
        labelled = self._labels.get(label) if label is None or type(label) is int else None
        return _new_tuple(EncodedSample, (b"".join((
            self.head, _LOW[n & 0x7F] if high else _ONE_BYTE[n], self._seq_high_bytes, self._at_bytes, known[1],
            cast(bytes, flat), labelled or self._label(label), _NO_TARGET_NO_METADATA)), known[2], known[4]))

    def _stamp(self, produced_at: int | None) -> None:
        """Keep the time's varint (a device stamping its samples sends many in one millisecond)."""
        at = now_ms() if produced_at is None else cast(int, _check_produced_at(produced_at))
        if at != self._at:
            self._at, self._at_bytes = at, _varint(at)

    def _label(self, label: int | None) -> bytes:
        found = b"\x02" + _varint(cast(int, _check_label(label)))
        if len(self._labels) < _KEPT and type(label) is int:
            self._labels[label] = found
        return found

    def _unknown_shape(self, seq: int, array: np.ndarray, label: int | None, produced_at: int | None) -> EncodedSample:
        """A shape not on the fast path yet: its layout's bytes worked out (or the general encoder's record)."""
        if array.ndim < 2 or not array.shape[0]:
            return encode_device_sample(self.device, seq, array, label=label, produced_at=produced_at)
        layout = self._layouts.get((array.shape[1:], array.dtype), _UNSEEN)
        if layout is _UNSEEN:
            return self._first_of_layout(seq, array, label, produced_at)
        if layout is None:
            return encode_device_sample(self.device, seq, array, label=label, produced_at=produced_at)
        if len(self._shapes) >= _KEPT:
            self._shapes.clear()  # a device of more shapes than that works them out again
        middle, headers = layout.middle(array.shape[0])
        self._shapes[array.shape] = (array.dtype, middle, headers, layout.floats, array.shape[0])
        return self.encode(seq, array, label=label, produced_at=produced_at)

    def _first_of_layout(self, seq: int, array: np.ndarray, label: int | None,
                         produced_at: int | None) -> EncodedSample:
        """The general encoder's record; the layout kept when the fast path writes the same bytes."""
        produced = now_ms() if produced_at is None else produced_at
        record = encode_device_sample(self.device, seq, array, label=label, produced_at=produced)  # raises alike
        key, name = (array.shape[1:], array.dtype), cast(str, wire_dtype(array.dtype))
        little = array.dtype.byteorder != ">" and (array.dtype.byteorder != "=" or sys.byteorder == "little")
        if len(self._layouts) >= _KEPT:
            return record
        self._layouts[key] = None
        if little and name in self._codes:
            rest = b"".join([*map(_varint, array.shape[1:]), b"\x00", self._codes[name]])
            self._layouts[key] = _Layout(_varint(array.ndim), rest, array[0].nbytes, name[0] == "f")
            if self.encode(seq, array, label=label, produced_at=produced).value != record.value:
                self._layouts[key] = None  # a schema this writer does not know: the general path
                self._shapes.pop(array.shape, None)
        return record
