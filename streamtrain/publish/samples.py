"""What a device may publish, checked before anything is queued, and its encoding into one wire record.

Every check here names the argument and says why it is refused: a sample the trainers could not use
(no size axis, a dtype the wire lacks, NaN or infinity) is refused at the device, where the caller can
still fix it, rather than dead-lettered downstream.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from numbers import Integral, Real
from typing import Any, NamedTuple

import numpy as np

from ..wire import DTYPES
from ..wire.codec import HeaderList, encode_array
from ..wire.records import wire_dtype

__all__ = ["EncodedSample", "check_payload", "encode_device_sample"]

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
