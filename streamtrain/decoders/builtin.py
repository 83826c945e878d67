"""The bridge's built-in decoders: `json` (a field mapping over one JSON object per record) and `raw`
(a little-endian array of one dtype and shape per record, the device from the key).

Each is a callable of the decoder contract (`contract`): a record in, the sample's fields out, or `Rejected`
naming the setting that decides what went wrong.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

import numpy as np

from ..config import JsonMapping, RawLayout
from .contract import Rejected, SampleFields, SourceRecord, as_array, frames

__all__ = ["JsonDecoder", "RawDecoder"]

_MISSING = object()


def _field(obj: dict[str, Any], path: str) -> Any:
    """The value at a dotted `path` of a JSON object, or `_MISSING`."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _reshaped(array: np.ndarray, shape: tuple[int, ...], setting: str) -> np.ndarray:
    try:
        return array.reshape(shape)
    except ValueError:
        raise Rejected("bad-shape", f"{array.size} values do not make shape {list(shape)}", setting) from None


class JsonDecoder:
    """One JSON object per record value; `mapping` says which field holds what.

    Args:
        mapping: the source's field mapping (`bridge.sources[i].mapping`).
    """

    def __init__(self, mapping: JsonMapping) -> None:
        self.mapping = mapping

    def __call__(self, record: SourceRecord) -> SampleFields:
        """The sample's fields from the record's JSON object."""
        m = self.mapping
        obj = self._object(record)
        data = self._required(obj, m.data, "mapping.data")
        array = as_array(data, m.dtype, f"field {m.data!r}", "mapping.data")
        array = frames(array if m.shape is None else _reshaped(array, m.shape, "mapping.shape"), "mapping.shape")
        fields: SampleFields = {"data": array}
        self._optional(obj, fields)
        return fields

    @staticmethod
    def _object(record: SourceRecord) -> dict[str, Any]:
        if not record.value:
            raise Rejected("empty-value", "the record has no value")
        try:
            obj = json.loads(record.value)
        except (ValueError, UnicodeDecodeError) as exc:  # one object per value: a second line is "extra data"
            raise Rejected("json-invalid", f"the value is not one JSON object: {exc}") from None
        if not isinstance(obj, dict):
            raise Rejected("json-invalid", f"the value is JSON {type(obj).__name__}, not an object")
        return obj

    def _optional(self, obj: dict[str, Any], fields: SampleFields) -> None:
        """The fields the mapping names besides the data: label, target, device, time, seq, metadata."""
        m = self.mapping
        if m.label is not None:
            fields["label"] = self._required(obj, m.label, "mapping.label")
        if m.target is not None:
            fields["target"] = self._required(obj, m.target, "mapping.target")
        if m.device is not None:
            device = self._required(obj, m.device, "mapping.device")
            if isinstance(device, dict | list) or device is None:
                raise Rejected("bad-device", f"field {m.device!r} is not a device id: {device!r}", "mapping.device")
            fields["device"] = str(device)
        if m.time is not None:
            fields["produced_at"] = self._time(self._required(obj, m.time, "mapping.time"))
        if m.seq is not None:
            fields["seq"] = self._required(obj, m.seq, "mapping.seq")
        if m.metadata:
            found = {name: _field(obj, name) for name in m.metadata}
            fields["metadata"] = {k: v if isinstance(v, str) else json.dumps(v)
                                  for k, v in found.items() if v is not _MISSING}

    @staticmethod
    def _required(obj: dict[str, Any], path: str, setting: str) -> Any:
        value = _field(obj, path)
        if value is _MISSING:
            raise Rejected("missing-field", f"no field {path!r} in the object (has {', '.join(sorted(obj)) or 'none'})",
                           setting)
        return value

    def _time(self, value: Any) -> int:
        unit = self.mapping.time_unit
        try:
            if unit == "iso":
                when = datetime.fromisoformat(str(value))
                if when.tzinfo is None:
                    raise ValueError("no time zone (add Z or +00:00)")
                return int(when.timestamp() * 1000)
            number = float(value)
            if not math.isfinite(number):
                raise ValueError("not finite")
            return int(number * 1000) if unit == "s" else int(number)
        except (TypeError, ValueError, OverflowError) as exc:
            raise Rejected("bad-time", f"field {self.mapping.time!r} = {value!r} is not a time in {unit}: {exc}",
                           "mapping.time_unit") from None


class RawDecoder:
    """A record value is a little-endian array of `layout.dtype` and `layout.shape`; the device is the key.

    Args:
        layout: the source's dtype, shape and label header (`bridge.sources[i].layout`).
    """

    def __init__(self, layout: RawLayout) -> None:
        self.layout = layout
        self.dtype = np.dtype(layout.dtype).newbyteorder("<")

    def __call__(self, record: SourceRecord) -> SampleFields:
        """The sample's fields from the record's bytes (and its label header)."""
        value = record.value
        if not value:
            raise Rejected("empty-value", "the record has no value")
        if len(value) % self.dtype.itemsize:
            raise Rejected("bad-length", f"{len(value)} bytes are not a whole number of {self.layout.dtype} "
                           f"({self.dtype.itemsize} bytes each)", "layout.dtype")
        array = _reshaped(np.frombuffer(value, dtype=self.dtype), self.layout.shape, "layout.shape")
        fields: SampleFields = {"data": array}
        name = self.layout.label_header
        if name is not None:
            raw = record.header(name)
            if raw is None:
                names = [k for k, _ in record.headers]
                found = (f"header {name!r} has no value" if name in names else f"no label header {name!r} (the "
                         f"record has {', '.join(repr(k) for k in names) if names else 'no headers'})")
                raise Rejected("bad-label", found, "layout.label_header")
            try:
                fields["label"] = int(raw.decode())
            except (UnicodeDecodeError, ValueError):
                raise Rejected("bad-label", f"header {name!r} is {raw!r}, not a decimal label",
                               "layout.label_header") from None
        return fields
