"""The bridge's decoders and their contract: built-in json and raw, a user's decoder, and the start-up check."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from streamtrain.bridge.checks import try_decoder
from streamtrain.bridge.errors import BridgeSetupError
from streamtrain.config import ConfigError, SourceConfig, load_config
from streamtrain.decoders import (
    ContractError,
    DecoderSetupError,
    Rejected,
    SourceRecord,
    build_decoder,
    source_of,
    to_sample,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
DEVICES = ("cam0", "cam1")


def _record(value: bytes | None, key: bytes | None = b"cam0", offset: int = 7, **kw: object) -> SourceRecord:
    return SourceRecord(topic="events", partition=2, offset=offset, key=key, value=value,
                        timestamp_ms=1_700_000_000_000, **kw)  # type: ignore[arg-type]


def _json_source(**mapping: object) -> SourceConfig:
    return SourceConfig(topic="events", decoder="json", mapping=mapping)  # type: ignore[arg-type]


def _decode(source: SourceConfig, record: SourceRecord) -> object:
    fields = build_decoder(source, "bridge.sources.0")(record)
    return to_sample(fields, record, DEVICES)


def test_json_mapping_reads_every_field_and_the_sample_names_its_source() -> None:
    source = _json_source(data="payload.values", shape=[-1, 2], label="cls", target="y", device="sensor",
                          time="at", time_unit="s", seq="n", metadata=["site"])
    value = json.dumps({"payload": {"values": [1, 2, 3, 4, 5, 6]}, "cls": 2, "y": [0.5, 1.5], "sensor": "cam1",
                        "at": 1700000001.5, "n": 41, "site": "north"}).encode() + b"\n"  # a JSON line, as kcat sends it
    sample = _decode(source, _record(value))
    assert sample.device_id == "cam1" and sample.shape == (3, 2) and sample.dtype == "float32"  # type: ignore[attr-defined]
    assert sample.array().tolist() == [[1, 2], [3, 4], [5, 6]]  # type: ignore[attr-defined]
    assert (sample.label, sample.target, sample.seq, sample.produced_at) == (  # type: ignore[attr-defined]
        2, (0.5, 1.5), 41, 1_700_000_001_500)
    assert sample.metadata == {"site": "north", "source": "events/2/7"}  # type: ignore[attr-defined]
    assert source_of(sample) == ("events", 2, 7)  # type: ignore[arg-type]


def test_json_defaults_take_the_key_the_timestamp_and_the_offset() -> None:
    sample = _decode(_json_source(), _record(b'{"data": [[1, 2], [3, 4]]}'))
    assert (sample.device_id, sample.shape, sample.seq, sample.produced_at) == (  # type: ignore[attr-defined]
        "cam0", (2, 2), 7, 1_700_000_000_000)


@pytest.mark.parametrize(("value", "mapping", "reason", "setting"), [
    (b"not json", {}, "json-invalid", None),
    (b'{"data": [1]}\n{"data": [2]}', {}, "json-invalid", None),  # two lines in one record: one record is one sample
    (b"[1, 2]", {}, "json-invalid", None),
    (b'{"values": [1, 2]}', {}, "missing-field", "mapping.data"),
    (b'{"data": ["a", "b"]}', {}, "bad-data", "mapping.data"),
    (b'{"data": [1, 2, 3]}', {"shape": [-1, 2]}, "bad-shape", "mapping.shape"),
    (b'{"data": 5}', {}, "bad-shape", None),
    (b'{"data": [1, NaN]}', {}, "non-finite", None),
    (b'{"data": [1, 2], "y": 1.5}', {"label": "y"}, "bad-label", None),
    (b'{"data": [1, 2], "y": -1}', {"label": "y"}, "bad-label", None),
    (b'{"data": [1, 2]}', {"label": "y"}, "missing-field", "mapping.label"),
    (b'{"data": [1, 2], "d": "cam9"}', {"device": "d"}, "unknown-device", "bridge.devices"),
    (b'{"data": [1, 2], "d": "a b"}', {"device": "d"}, "bad-device", None),
    (b'{"data": [1, 2], "t": "yesterday"}', {"time": "t", "time_unit": "iso"}, "bad-time", "mapping.time_unit"),
    (b'{"data": [1, 2], "t": "2024-01-01T00:00:00"}', {"time": "t", "time_unit": "iso"}, "bad-time",
     "mapping.time_unit"),
    (b'{"data": [1, 2], "y": [1, "x"]}', {"target": "y"}, "bad-target", None),
])
def test_json_rejections_say_why_and_which_setting(value: bytes, mapping: dict[str, object], reason: str,
                                                   setting: str | None) -> None:
    with pytest.raises(Rejected) as rejected:
        _decode(_json_source(**mapping), _record(value))
    assert rejected.value.reason == reason and rejected.value.setting == setting, rejected.value.detail


def test_a_one_axis_payload_is_a_series_of_scalars_written_as_size_by_one() -> None:
    raw = SourceConfig(topic="events", decoder="raw", layout={"dtype": "int16"})  # type: ignore[arg-type]
    samples = [_decode(_json_source(), _record(b'{"data": [1, 2, 3]}')),
               _decode(_json_source(shape=[-1]), _record(b'{"data": [1, 2, 3]}')),
               _decode(raw, _record(np.arange(3, dtype="<i2").tobytes())),
               to_sample({"data": np.arange(3.0)}, _record(b""), DEVICES)]  # a user decoder's own 1-D array
    for sample in samples:
        assert sample.shape == (3, 1) and sample.problems() == []  # type: ignore[attr-defined]
    assert samples[2].array().tolist() == [[0], [1], [2]]  # type: ignore[attr-defined]
    with pytest.raises(Rejected) as rejected:  # three axes: the wire has [size, features] only
        _decode(_json_source(), _record(b'{"data": [[[1, 2]], [[3, 4]]]}'))
    assert (rejected.value.reason, rejected.value.setting) == ("bad-shape", "mapping.shape")
    assert "shape [-1, 2]" in rejected.value.detail
    with pytest.raises(ConfigError, match=r"bridge\.sources\.0\.layout\.shape.*one or two axes"):
        load_config(env={}, overrides={"bridge.sources": [{"topic": "t", "decoder": "raw",
                                                           "layout": {"shape": [-1, 2, 2]}}]})


def test_rejections_say_what_is_wrong_in_words() -> None:
    with pytest.raises(Rejected) as rejected:  # finite in JSON, beyond float32
        _decode(_json_source(), _record(b'{"data": [1, 1e300]}'))
    assert rejected.value.reason == "non-finite" and "out of float32 range" in rejected.value.detail
    with pytest.raises(Rejected) as rejected:
        to_sample({"data": [1e300], "dtype": "float16"}, _record(b""), DEVICES)
    assert rejected.value.reason == "non-finite" and "out of float16 range" in rejected.value.detail
    raw = SourceConfig(topic="events", decoder="raw", layout={"label_header": "label"})  # type: ignore[arg-type]
    with pytest.raises(Rejected, match=r"^no label header 'label' \(the record has 'kind'\)$"):
        _decode(raw, _record(np.ones(2, "<f4").tobytes(), headers=(("kind", b"x"),)))
    with pytest.raises(ConfigError, match="options is for a user's decoder; this source's decoder is json"):
        load_config(env={}, overrides={"bridge.sources": [{"topic": "t", "options": {"a": 1}}]})


def test_a_record_without_key_or_device_field_has_no_device() -> None:
    with pytest.raises(Rejected) as rejected:
        _decode(_json_source(), _record(b'{"data": [1]}', key=None))
    assert rejected.value.reason == "no-device"


def test_raw_reads_little_endian_arrays_of_the_layout_with_a_label_header() -> None:
    source = SourceConfig(topic="events", decoder="raw", layout={"dtype": "int16", "shape": [-1, 3],  # type: ignore[arg-type]
                                                                  "label_header": "label"})
    values = np.arange(6, dtype="<i2")
    sample = _decode(source, _record(values.tobytes(), headers=(("label", b"4"),)))
    assert sample.dtype == "int16" and sample.array().tolist() == [[0, 1, 2], [3, 4, 5]]  # type: ignore[attr-defined]
    assert sample.label == 4 and sample.device_id == "cam0"  # type: ignore[attr-defined]
    for value, headers, reason, setting in [
        (values.tobytes()[:-1], (("label", b"1"),), "bad-length", "layout.dtype"),
        (values[:4].tobytes(), (("label", b"1"),), "bad-shape", "layout.shape"),
        (values.tobytes(), (), "bad-label", "layout.label_header"),
        (b"", (("label", b"1"),), "empty-value", None),
    ]:
        with pytest.raises(Rejected) as rejected:
            _decode(source, _record(value, headers=headers))
        assert (rejected.value.reason, rejected.value.setting) == (reason, setting)


def test_what_a_decoder_returns_is_held_to_the_contract() -> None:
    record = _record(b"x")
    for bad in ([1, 2], {"data": [1], "colour": "red"}, {"label": 1}):
        with pytest.raises(ContractError):
            to_sample(bad, record, DEVICES)
    sample = to_sample({"data": np.ones((2, 3), np.float64), "dtype": "float16", "metadata": {"source": "forged"}},
                       record, DEVICES)
    assert sample.dtype == "float16" and sample.metadata["source"] == "events/2/7"  # the bridge's own says where


@pytest.fixture
def examples_path() -> object:
    sys.path.insert(0, str(EXAMPLES))
    yield
    sys.path.remove(str(EXAMPLES))
    sys.modules.pop("bridge_decoder", None)


def test_the_example_decoder_decodes_skips_and_rejects(examples_path: object) -> None:
    source = SourceConfig(topic="events", decoder="bridge_decoder:decode", options={"features": 2})
    decoder = build_decoder(source, "bridge.sources.0")
    sample = to_sample(decoder(_record(b"cam1;1700000000.25;1;1,2,3,4,5,6", key=b"gw-7")),
                       _record(b"", key=b"gw-7"), DEVICES)
    assert sample.device_id == "cam1" and sample.shape == (3, 2) and sample.label == 1
    assert sample.produced_at == 1_700_000_000_250 and sample.metadata["gateway"] == "gw-7"
    assert decoder(_record(b"# heartbeat")) is None
    with pytest.raises(Rejected, match="whole frames"):
        decoder(_record(b"cam1;1;1;1,2,3"))
    assert try_decoder(decoder, [_record(b"cam0;1;0;1,2"), _record(b"# hb"), _record(b"junk")], DEVICES,
                       "bridge.sources.0") == (3, 1, 1, 1)


def test_a_user_decoder_that_cannot_load_fails_naming_the_setting(examples_path: object) -> None:
    cases = [("no_such_module_xyz:decode", {}, "cannot import module"),
             ("bridge_decoder:nothing", {}, "has no attribute 'nothing'"),
             ("bridge_decoder:__doc__", {}, "not a callable"),
             ("bridge_decoder:decode", {"colour": 1}, "bridge.sources.3.options")]
    for decoder, options, says in cases:
        with pytest.raises(DecoderSetupError) as failed:
            build_decoder(SourceConfig(topic="t", decoder=decoder, options=options), "bridge.sources.3")
        assert "bridge.sources.3.decoder" in str(failed.value) and says in str(failed.value)


def test_the_start_up_check_fails_when_too_few_first_records_decode_naming_the_setting() -> None:
    decoder = build_decoder(_json_source(data="values", shape=[-1, 4]), "bridge.sources.1")
    wrong_field = [_record(json.dumps({"data": [1, 2, 3, 4]}).encode(), offset=i) for i in range(5)]
    with pytest.raises(BridgeSetupError, match=r"bridge\.sources\.1\.mapping\.data: none of the first 5 records"):
        try_decoder(decoder, wrong_field, DEVICES, "bridge.sources.1")
    wrong_devices = [_record(json.dumps({"values": [1, 2, 3, 4]}).encode(), key=b"other")]
    with pytest.raises(BridgeSetupError, match=r"^bridge\.devices: none of the first 1"):
        try_decoder(decoder, wrong_devices, DEVICES, "bridge.sources.1")
    broken = [*wrong_field, _record(b'{"values": [1, 2, 3, 4]}')]  # one good record among bad ones: bad data,
    assert try_decoder(decoder, broken, DEVICES, "bridge.sources.1", min_decoded=0.1) == (6, 1, 0, 5)
    with pytest.raises(BridgeSetupError, match=r"^bridge\.sources\.1\.mapping\.data: only 1 of the first 6 records "
                       r"of events decode \(bridge\.check_min_decoded = 0\.5 .*\); 5 rejected, 5 as missing-field"):
        try_decoder(decoder, broken, DEVICES, "bridge.sources.1")  # ... or a setting that fits by chance

    def not_a_dict(_record: SourceRecord) -> object:
        return [1, 2, 3]

    with pytest.raises(BridgeSetupError, match=r"bridge\.sources\.1\.decoder: on events/2/7 the decoder broke"):
        try_decoder(not_a_dict, [_record(b"x")], DEVICES, "bridge.sources.1")  # type: ignore[arg-type]
    assert try_decoder(decoder, [], DEVICES, "bridge.sources.1") == (0, 0, 0, 0)  # an empty topic checks nothing


def test_bridge_settings_are_checked_and_name_the_setting() -> None:
    good = {"topic": "events", "decoder": "json", "mapping": {"data": "v"}}
    cases = [
        ({"bridge.sources": [{**good, "decoder": "nope"}]}, "bridge.sources.0.decoder"),
        ({"bridge.sources": [{**good, "layout": {"dtype": "int16"}}]}, "layout is for the raw decoder"),
        ({"bridge.sources": [{**good, "mapping": {"shape": [-1, -1]}}]}, "bridge.sources.0.mapping.shape"),
        ({"bridge.sources": [good, good]}, "listed more than once"),
        ({"bridge.sources": [{**good, "topic": "bad topic"}]}, "bridge.sources.0.topic"),
        ({"bridge.sources": [{**good, "topic": "streamtrain.device.x"}]}, "one of this job's own topics"),
        ({"bridge.transaction_seconds": 20, "bridge.transaction_timeout_seconds": 30}, "must exceed twice"),
        ({"bridge.devices": ["a", "a"]}, "more than once"),
    ]
    for overrides, says in cases:
        with pytest.raises(ConfigError, match=says.replace(".", r"\.")):
            load_config(env={}, overrides=overrides)
    cfg = load_config(env={}, overrides={"job": "j", "bridge.sources": [good], "coordinator.devices": ["a"]})
    assert cfg.bridge.transactional_id(cfg.job) == "j.bridge.0" and cfg.bridge_devices == ("a",)
