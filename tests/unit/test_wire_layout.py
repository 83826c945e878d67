"""The byte layout: Avro's single-object encoding as an independent implementation sees it, the previous layout
still read, how the two are told apart, the errors of a value in neither, and the docs' test vector and table.

The fingerprints here are computed from the `.avsc` files by this file's own Parsing Canonical Form and
CRC-64-AVRO (written from the Avro specification), not by fastavro, and one is checked against the number
Java's `SchemaNormalization.parsingFingerprint64` printed for Sample v1 (reported in issue 25).
"""

from __future__ import annotations

import io
import json
import re
import struct
from importlib import resources
from typing import Any

import fastavro
import numpy as np
import pytest
from docs_vector import DOCS_PAGE, docs_block, docs_test_vector  # tests/docs_vector.py
from fastavro.schema import to_parsing_canonical_form
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain.wire import (
    SCHEMA_HEADER,
    SIZE_HEADER,
    Assignment,
    CorruptRecordError,
    DeadLetter,
    DeviceLineage,
    DevicePlan,
    DeviceProfile,
    Evaluation,
    ModelVersion,
    PendingSample,
    Prediction,
    ProducedCount,
    Sample,
    StepFeedback,
    UnknownSchemaError,
    decode,
    encode,
)
from streamtrain.wire.layout import writer_schemas
from streamtrain.wire.legacy import encode_previous

# --- an independent Parsing Canonical Form and CRC-64-AVRO (Avro specification, "Schema Fingerprints") ----------

_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_KEEP = ("name", "type", "fields", "symbols", "items", "values", "size")  # [STRIP] and [ORDER]


def _canonical(schema: Any, namespace: str = "", seen: set[str] | None = None) -> str:
    seen = set() if seen is None else seen
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return json.dumps(schema)
        return json.dumps(schema if "." in schema or not namespace else f"{namespace}.{schema}")  # [FULLNAMES]
    if isinstance(schema, list):
        return "[" + ",".join(_canonical(s, namespace, seen) for s in schema) + "]"
    kind = schema["type"]
    if kind in _PRIMITIVES:
        return json.dumps(kind)  # [PRIMITIVES]
    parts = []
    if kind in ("record", "enum", "fixed"):
        name = schema["name"]
        namespace = schema.get("namespace", namespace) if "." not in name else name.rsplit(".", 1)[0]
        full = name if "." in name else (f"{namespace}.{name}" if namespace else name)
        if full in seen:
            return json.dumps(full)
        seen.add(full)
        parts.append(f'"name":{json.dumps(full)}')
    parts.append(f'"type":{json.dumps(kind)}')
    for key in _KEEP[2:]:
        if key not in schema:
            continue
        if key == "fields":
            fields = [f'{{"name":{json.dumps(f["name"])},"type":{_canonical(f["type"], namespace, seen)}}}'
                      for f in schema["fields"]]
            parts.append(f'"fields":[{",".join(fields)}]')
        elif key == "symbols":
            parts.append(f'"symbols":[{",".join(json.dumps(s) for s in schema["symbols"])}]')
        elif key in ("items", "values"):
            parts.append(f'"{key}":{_canonical(schema[key], namespace, seen)}')
        else:
            parts.append(f'"size":{int(schema["size"])}')
    return "{" + ",".join(parts) + "}"


_EMPTY = 0xC15D213AA4D7A795


def _crc64_avro(data: bytes) -> int:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY & -(fp & 1))
        table.append(fp)
    fp = _EMPTY
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def _schema_files() -> dict[tuple[str, int], dict[str, Any]]:
    """(name, version) → the parsed JSON of every schema file, current and older."""
    root = resources.files("streamtrain.wire").joinpath("schemas")
    older = {(e.name.split(".")[0], int(e.name.split(".")[1])): json.loads(e.read_text())
             for e in root.joinpath("older").iterdir() if e.name.endswith(".avsc")}
    current = {}
    for entry in root.iterdir():
        if entry.name.endswith(".avsc"):
            name = entry.name.removesuffix(".avsc")
            current[(name, 1 + max((v for n, v in older if n == name), default=0))] = json.loads(entry.read_text())
    return older | current


def _fingerprint(schema: dict[str, Any]) -> bytes:
    return struct.pack("<Q", _crc64_avro(_canonical(schema).encode()))


# --- records ------------------------------------------------------------------------------------------------------


def _records() -> list[Sample | StepFeedback | Assignment | DeadLetter | Evaluation | ModelVersion | Prediction
                      | DeviceProfile]:
    sample = Sample.from_array("dev-1", 7, np.arange(15, dtype=np.int16).reshape(5, 3), label=3,
                               metadata={"src": "unit"}, target=[0.5, -1.0], produced_at=1_700_000_000_000)
    feedback = StepFeedback(
        job="job", step=12, device_id="dev-1", rank=1, plan_step=12, samples=30, total_size=1350,
        compute_seconds=0.25, data_wait_seconds=0.01, comm_seconds=0.03, step_seconds=0.3, memory_bytes=123456789,
        lowest_unprocessed_offset=1000, buffer_depth=40, loss=1.25, dropped=2,
        new_samples=(PendingSample(1001, 45),), plan_wait_seconds=0.002, sent_at=1)
    plan = Assignment(job="job", step=13, policy="ett-stream", step_time_target=0.3, global_batch=70, lr_scale=1.5,
                      devices=(DevicePlan("dev-1", 0.29, 0.6, offsets=(1001, 1002)),), basis_step=11, created_at=1)
    letter = DeadLetter(topic="p.device.d", partition=0, offset=17, reason="corrupt", detail="bad", service="trainer",
                        headers={"st-size": b"3"}, key=None, value=b"\x00\xff", failed_at=1)
    evaluation = Evaluation(job="j", step=40, dataset="plaid", samples=537, accuracy=0.75, loss=0.8, seconds=0.2,
                            sent_at=1)
    version = ModelVersion(job="j", version=3, step=40, location="/models/v000003",
                           lineage=(DeviceLineage("dev-1", 1001, (ProducedCount(1_700_000_000_000, 2),)),),
                           metrics={"heldout_accuracy": 0.75}, created_at=1)
    answer = Prediction(job="j", request_topic="p.requests", request_partition=0, request_offset=9, version=3,
                        answered_at=1, request_produced_at=0, label=2, label_name="fan", probabilities=(0.25, 0.75))
    profile = DeviceProfile(job="j", device_id="dev-1", rank=1, sizes=(400, 1600), seconds=(0.02, 0.07), slope=4e-5,
                            intercept=0.005, mean_sample_size=100.0, profile_seconds=0.3, sent_at=1)
    return [sample, feedback, plan, letter, evaluation, version, answer, profile]


@pytest.mark.parametrize("record", _records(), ids=lambda r: type(r).__name__)
def test_every_record_is_avro_single_object_encoding_as_an_independent_reader_sees_it(record: Any) -> None:
    value, _ = encode(record)
    schema = _schema_files()[max((k for k in _schema_files() if k[0] == record.SCHEMA), key=lambda k: k[1])]
    assert value[:2] == b"\xc3\x01"
    assert value[2:10] == _fingerprint(schema)
    body = io.BytesIO(value[10:])
    data = fastavro.schemaless_reader(body, fastavro.parse_schema(schema), None)
    assert body.tell() == len(value) - 10  # the body is the whole rest of the value
    assert type(record).from_dict(data) == record


def test_the_independent_fingerprints_agree_with_the_codec_and_with_java() -> None:
    files = _schema_files()
    assert {(s.name, s.version): s.fingerprint for s in writer_schemas().values()} == {
        key: _fingerprint(schema) for key, schema in files.items()}
    for schema in files.values():  # the canonical form itself, against fastavro's
        assert _canonical(schema) == to_parsing_canonical_form(fastavro.parse_schema(schema, named_schemas={}))
    # What Java's SchemaNormalization.parsingFingerprint64 returned for Sample v1 (issue 25's device), as a long.
    sample_v1 = _fingerprint(files[("Sample", 1)])
    assert struct.unpack("<q", sample_v1)[0] == 0x194C2FC2AA294EB6
    assert sample_v1.hex() == "b64e29aac22f4c19"  # the same 8 bytes in wire order, as fastavro prints them


def test_no_previous_layout_value_can_begin_with_the_marker() -> None:
    # The layouts are told apart by the value's first two bytes: that holds because every schema's first field is a
    # string (or bytes), whose length C3 01 would make -98.
    for (name, version), schema in _schema_files().items():
        assert schema["fields"][0]["type"] in ("string", "bytes"), (name, version)
    length, _ = _zigzag_varint(b"\xc3\x01")
    assert length == -98


def _zigzag_varint(data: bytes) -> tuple[int, int]:
    value, shift, i = 0, 0, 0
    while True:
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), i
        shift += 7


# --- the previous layout --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(_schema_files()), ids=lambda k: f"{k[0]}-v{k[1]}")
def test_every_schema_version_in_the_previous_layout_still_decodes(key: tuple[str, int]) -> None:
    name, version = key
    record = next(r for r in _records() if name == r.SCHEMA)
    value, headers = encode_previous(record, version=version)
    assert not value.startswith(b"\xc3\x01") and dict(headers)[SCHEMA_HEADER] == _fingerprint(
        _schema_files()[key]).hex().encode()
    back = decode(value, headers, type(record))
    # Fields the older version lacks come back as their defaults; the others as written.
    fields = {f["name"] for f in _schema_files()[key]["fields"]}
    assert {k: v for k, v in back.to_dict().items() if k in fields} == {
        k: v for k, v in record.to_dict().items() if k in fields}


def test_the_marker_decides_when_a_value_also_has_a_previous_layout_header() -> None:
    record = _records()[0]
    value, headers = encode(record)
    # A Java device following the old docs might add st-schema, even rendered as Java prints it: ignored.
    for stale in (b"194c2fc2aa294eb6", b"05e0a74cc3ad3be8", b"junk"):
        assert decode(value, [*headers, (SCHEMA_HEADER, stale)], Sample) == record


@pytest.mark.parametrize(("value", "message"), [
    (b"", r"does not begin with .*C3 01 \(found nothing\)"),
    (b"\xc3", r"found c3\)"),
    (b"\xc3\x02" + bytes(20), r"found c3 02\).*bare Avro body"),
    (b"\x00\x00\x00\x00\x07" + bytes(20), r"Confluent Schema Registry's framing \(magic byte 0, schema id 7\)"),
    (b"\xc3\x01\x05\xe0\xa7", r"ends inside its single-object prefix"),
    (b"\xc3\x01\x05\xe0\xa7\x4c\xc3\xad\x3b\xe8", r"not valid Avro"),
    (None, r"tombstone"),
])
def test_a_value_in_neither_layout_is_corrupt_with_the_reason(value: bytes | None, message: str) -> None:
    with pytest.raises(CorruptRecordError, match=message) as err:
        decode(value, [(SIZE_HEADER, b"3")], Sample)
    assert err.value.reason == "corrupt"


def test_a_bare_body_as_the_issue_s_java_device_sent_it_is_refused_naming_both_renderings() -> None:
    record = _records()[0]
    value, headers = encode(record)
    # Issue 25: a bare body with st-schema holding Java's rendering of the fingerprint (Sample v1 at the time).
    with pytest.raises(UnknownSchemaError) as err:
        decode(value[10:], [*headers, (SCHEMA_HEADER, b"194c2fc2aa294eb6")], Sample)
    text = str(err.value)
    assert "these are Sample v1's bytes in reverse order" in text
    assert "Sample v1 = wire bytes b64e29aac22f4c19 (Java parsingFingerprint64 0x194c2fc2aa294eb6)" in text
    assert "Sample v2 = wire bytes 05e0a74cc3ad3be8 (Java parsingFingerprint64 0xe83badc34ca7e005)" in text


@pytest.mark.parametrize("header", [b"0000", b"not hex at all", b"05e0a74cc3ad3be8ff", b""])
def test_a_previous_layout_header_that_is_no_fingerprint_says_so(header: bytes) -> None:
    value, _ = encode_previous(_records()[0])
    with pytest.raises(UnknownSchemaError, match=r"st-schema header .* is not a schema fingerprint .*known: Sample v2"):
        decode(value, [(SCHEMA_HEADER, header), (SIZE_HEADER, b"5")], Sample)


@settings(max_examples=100, deadline=None)
@given(fp=st.binary(min_size=8, max_size=8))
def test_an_unknown_fingerprint_names_every_known_one_in_both_renderings(fp: bytes) -> None:
    known = writer_schemas()
    value, headers = encode(_records()[0])
    forged = b"\xc3\x01" + fp + value[10:]
    if fp in known:
        assert decode(forged, headers, Sample if known[fp].name == "Sample" else StepFeedback) is not None
        return
    with pytest.raises(UnknownSchemaError) as err:
        decode(forged, headers, Sample)
    text = str(err.value)
    assert err.value.reason == "unknown-schema" and fp.hex() in text and "(Sample expected)" in text
    for schema in known.values():
        wire = schema.fingerprint.hex()
        java = f"0x{struct.unpack('<Q', schema.fingerprint)[0]:016x}"
        assert f"{schema.name} v{schema.version} = wire bytes {wire} (Java parsingFingerprint64 {java})" in text
    assert text.index("Sample v2") < text.index("StepFeedback")  # the expected record's versions first


@settings(max_examples=200, deadline=None)
@given(cut=st.integers(min_value=0, max_value=9), tail=st.binary(max_size=3))
def test_a_truncated_or_damaged_prefix_is_corrupt_never_a_crash(cut: int, tail: bytes) -> None:
    value, headers = encode(_records()[0])
    with pytest.raises((CorruptRecordError, UnknownSchemaError)):
        decode(value[:cut] + tail, headers, Sample)


# --- the docs page: the test vector and the fingerprint table cannot drift -----------------------------------------


def test_the_docs_test_vector_is_what_encode_writes_byte_for_byte() -> None:
    value, headers = docs_test_vector()
    annotated = b"".join(bytes.fromhex(line.split("#")[0]) for line in docs_block("test-vector: annotated")
                         .splitlines())
    assert annotated == value and len(value) == 54
    sample = Sample.from_array("0", 7, np.arange(6, dtype=np.float32).reshape(3, 2), label=1,
                               produced_at=1_700_000_000_000)
    assert encode(sample) == (value, headers)
    assert decode(value, headers, Sample, device="0") == sample


def test_the_docs_fingerprint_table_is_every_readable_schema() -> None:
    text = DOCS_PAGE.read_text().split("<!-- fingerprints")[1].split("\n\n")[0]
    rows = re.findall(r"^\| (\w+) \| (\d+)[^|]*\| `([0-9a-f ]+)` \| `0x([0-9a-f]{16})` \|$", text, re.M)
    assert {(name, int(version), wire.replace(" ", ""), java) for name, version, wire, java in rows} == {
        (s.name, s.version, s.fingerprint.hex(), f"{struct.unpack('<Q', s.fingerprint)[0]:016x}")
        for s in writer_schemas().values()}
