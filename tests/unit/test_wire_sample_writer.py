"""The Sample body writer (the producers' hot path) writes exactly what fastavro writes, or leaves it to fastavro."""

from __future__ import annotations

import copy
import io
import math

import fastavro
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain.wire import DTYPES, Sample, decode, encode
from streamtrain.wire.codec import encode_array, load_schema
from streamtrain.wire.sample_writer import sample_body

LONG = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def _reference(sample: Sample) -> bytes:
    """The body as fastavro's generic writer writes it."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, load_schema("Sample").parsed, sample.to_dict())
    return buf.getvalue()


@st.composite
def samples(draw: st.DrawFn) -> Sample:
    shape = tuple(draw(st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=3)))
    dtype = draw(st.sampled_from(DTYPES))
    data = draw(st.binary(min_size=0, max_size=64))  # need not fit the shape: the writer does not validate
    floats = st.floats(width=32, allow_nan=False, allow_infinity=False)
    target = draw(st.none() | st.lists(floats, max_size=6).map(tuple))
    return Sample(device_id=draw(st.text(max_size=12)), seq=draw(LONG), produced_at=draw(LONG),
                  size=draw(st.integers(min_value=-(2**31), max_value=2**31 - 1)), shape=shape, dtype=dtype,
                  data=data, label=draw(st.none() | LONG), target=target,
                  metadata=draw(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)))


@settings(max_examples=300, deadline=None)
@given(sample=samples())
def test_the_writer_and_fastavro_write_the_same_bytes(sample: Sample) -> None:
    body = sample_body(load_schema("Sample").parsed, sample)
    assert body == _reference(sample)
    assert encode(sample)[0] == load_schema("Sample").prefix + body


@settings(max_examples=100, deadline=None)
@given(value=st.floats(allow_nan=True, allow_infinity=True, width=64))
def test_targets_beyond_float32_are_left_to_fastavro_and_encode_as_it_writes_them(value: float) -> None:
    sample = Sample.from_array("0", 1, np.ones((2, 1), dtype=np.float32), target=[value, 1.0])
    if not math.isfinite(value) or abs(value) > float(np.finfo(np.float32).max):
        assert sample_body(load_schema("Sample").parsed, sample) is None
    assert encode(sample)[0] == load_schema("Sample").prefix + _reference(sample)


def test_a_real_sample_takes_the_fast_path_and_reads_back() -> None:
    sample = Sample.from_array("cam-7", 41, np.random.default_rng(0).normal(size=(45, 16)).astype(np.float32),
                               label=3, metadata={"site": "plant-7"})
    assert sample_body(load_schema("Sample").parsed, sample) is not None
    assert decode(*encode(sample), Sample) == sample


def test_a_schema_the_writer_does_not_know_turns_it_off() -> None:
    parsed = copy.deepcopy(load_schema("Sample").parsed)
    parsed["fields"].insert(3, {"name": "extra", "type": "long", "default": 0})
    sample = Sample.from_array("0", 1, np.ones((2, 1), dtype=np.float32))
    assert sample_body(parsed, sample) is None


def test_integers_beyond_their_avro_type_are_left_to_fastavro() -> None:
    base = Sample.from_array("0", 1, np.ones((2, 1), dtype=np.float32))
    for sample in (Sample(**{**base.__dict__, "size": 2**40}), Sample(**{**base.__dict__, "shape": (2, 2**31)}),
                   Sample(**{**base.__dict__, "seq": 2**63})):
        assert sample_body(load_schema("Sample").parsed, sample) is None


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray:
    shape = tuple(draw(st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=3)))
    dtype = np.dtype(draw(st.sampled_from(DTYPES))).newbyteorder(draw(st.sampled_from("<>")))
    raw = draw(st.binary(min_size=dtype.itemsize * math.prod(shape), max_size=dtype.itemsize * math.prod(shape)))
    array = np.frombuffer(raw, dtype=dtype).reshape(shape)
    return array.T if draw(st.booleans()) else array  # a transposed view: not C order


TEXTS = st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)


@settings(max_examples=300, deadline=None)
@given(array=arrays(), seq=LONG, produced_at=st.integers(min_value=0, max_value=2**63 - 1), label=st.none() | LONG,
       metadata=st.none() | TEXTS, target=st.none() | st.lists(st.floats(width=64), max_size=4).map(tuple))
def test_encode_array_writes_what_encoding_the_sample_of_the_array_writes(
        array: np.ndarray, seq: int, produced_at: int, label: int | None, metadata: dict[str, str] | None,
        target: tuple[float, ...] | None) -> None:
    value, headers = encode_array("dev-1", seq, array, label=label, produced_at=produced_at, metadata=metadata,
                                  target=target)
    sample = Sample.from_array("dev-1", seq, array, label=label, produced_at=produced_at, metadata=metadata,
                               target=target)
    assert (value, headers) == encode(sample)  # any dtype, byte order and layout; the fastavro fallback too
    if target is None:  # (a float64 target reads back as the float32 the wire holds)
        assert decode(value, headers, Sample, validate=False) == sample
