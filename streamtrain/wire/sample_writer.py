"""The Sample record's Avro body written field by field: the hot path of every producer.

fastavro's generic writer walks the schema for every record (about 6 µs for a 3 kB sample on the
development machine, more than the Kafka client's own `produce`); a Sample's body is ten fields whose
binary encoding the Avro specification fixes (zigzag varints, length-prefixed bytes and strings, blocked
arrays and maps, union branch indexes), and writing them in order takes about half of that.

fastavro stays the reference. This writer is used only while the packaged Sample schema has exactly the
fields it writes (checked once), and only for values it covers exactly (integers within their Avro type,
finite float32 targets); anything else goes to fastavro, which writes it or raises. A property test holds
the two byte-identical on random samples (tests/unit/test_wire_sample_writer.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["fields_body", "sample_body", "varint"]

#: The Sample schema's fields, in order, as this writer writes them (name, Avro type as parsed).
_FIELDS: tuple[tuple[str, Any], ...] = (
    ("device_id", "string"),
    ("seq", "long"),
    ("produced_at", "long"),
    ("size", "int"),
    ("shape", {"type": "array", "items": "int"}),
    ("dtype", "enum"),
    ("data", "bytes"),
    ("label", ["null", "long"]),
    ("target", ["null", {"type": "array", "items": "float"}]),
    ("metadata", {"type": "map", "values": "string"}),
)
_INT = 2**31
_LONG = 2**63
_FLOAT32_MAX = float(np.finfo(np.float32).max)


_ONE_BYTE = tuple(bytes((n,)) for n in range(0x80))


def varint(value: int) -> bytes:
    """An Avro int or long: zigzag, then 7 bits a byte, low bits first; the lengths a producer's seq has most of
    its life unrolled (the hot path)."""
    n = (value << 1) ^ (value >> 63)
    if n < 0x4000:
        return _ONE_BYTE[n] if n < 0x80 else bytes((n & 0x7F | 0x80, n >> 7))
    if n < 0x200000:
        return bytes((n & 0x7F | 0x80, (n >> 7) & 0x7F | 0x80, n >> 14))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_varint = varint


def _string(text: str) -> bytes:
    raw = text.encode()
    return _varint(len(raw)) + raw


def _kind(avro_type: Any) -> Any:
    """A parsed field type reduced to what `_FIELDS` compares: named types by their kind, unions by branch."""
    if isinstance(avro_type, list):
        return [_kind(t) for t in avro_type]
    if isinstance(avro_type, dict):
        if avro_type.get("type") in ("enum", "record", "fixed"):
            return avro_type["type"]
        return {k: _kind(v) for k, v in avro_type.items() if k in ("type", "items", "values")}
    return avro_type


_CODES: dict[int, tuple[Any, dict[str, bytes] | None]] = {}


def _dtype_codes(parsed: Any) -> dict[str, bytes] | None:
    """Each dtype's enum index as written, when the schema is the one this writer knows; else None.

    Worked out once per parsed schema (kept with it, so a recycled id cannot answer for another schema).
    """
    known = _CODES.get(id(parsed))
    if known is not None and known[0] is parsed:
        return known[1]
    fields = parsed["fields"]
    codes = None
    if tuple((f["name"], _kind(f["type"])) for f in fields) == _FIELDS:
        symbols = next(f["type"]["symbols"] for f in fields if f["name"] == "dtype")
        codes = {name: _varint(i) for i, name in enumerate(symbols)}
    _CODES[id(parsed)] = (parsed, codes)
    return codes


def _target(target: tuple[float, ...]) -> bytes | None:
    if not target:
        return b"\x02\x00"
    values = np.asarray(target, dtype=np.float64)
    if not np.isfinite(values).all() or float(np.abs(values).max()) > _FLOAT32_MAX:
        return None  # fastavro's float conversion decides these
    return b"\x02" + _varint(len(values)) + values.astype("<f4").tobytes() + b"\x00"


def sample_body(parsed: Any, record: Any) -> bytes | None:
    """The Avro binary body of Sample `record` under the parsed schema, or None to leave it to fastavro.

    Args:
        parsed: the packaged Sample schema, as fastavro parsed it.
        record: the `Sample` to write.
    """
    return fields_body(parsed, record.device_id, record.seq, record.produced_at, record.size, record.shape,
                       record.dtype, record.data, record.label, record.target, record.metadata)


def fields_body(parsed: Any, device_id: str, seq: int, produced_at: int, size: int, shape: tuple[int, ...],
                dtype: str, data: bytes, label: int | None, target: tuple[float, ...] | None,
                metadata: dict[str, str]) -> bytes | None:
    """`sample_body` of a Sample's fields, given one by one (a producer need not build the `Sample`)."""
    codes = _dtype_codes(parsed)
    code = None if codes is None else codes.get(dtype)
    if (code is None or not -_LONG <= seq < _LONG or not -_LONG <= produced_at < _LONG
            or not -_INT <= size < _INT or (shape and not (min(shape) >= -_INT and max(shape) < _INT))
            or (label is not None and not -_LONG <= label < _LONG)):
        return None
    written_target = b"\x00" if target is None else _target(target)
    if written_target is None:
        return None
    parts = [_string(device_id), _varint(seq), _varint(produced_at), _varint(size)]
    if shape:
        parts.append(_varint(len(shape)))
        parts.extend(_varint(n) for n in shape)
    parts += [b"\x00", code, _varint(len(data)), data, b"\x00" if label is None else b"\x02" + _varint(label),
              written_target]
    if metadata:
        parts.append(_varint(len(metadata)))
        for key, value in metadata.items():
            parts += [_string(key), _string(value)]
    parts.append(b"\x00")
    return b"".join(parts)
