"""The bridge on the real broker with each kind of decoder: raw arrays, a user's module, and JSON with bad records
among good ones: every source record is bridged once or dead-lettered with its reason, and the bridge goes on."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from bridge_helpers import (
    EXAMPLES,
    bridge_until_caught_up,
    bridged,
    create_source,
    dead_letters,
    reasons,
    source_tallies,
)

from streamtrain.config import KafkaConfig, StreamtrainConfig
from streamtrain.kafka import make_producer

pytestmark = pytest.mark.integration

DEVICES = ("d0", "d1", "d2")


def _config(kafka: KafkaConfig, sources: list[dict[str, object]], **bridge: object) -> StreamtrainConfig:
    return StreamtrainConfig.model_validate({
        "job": kafka.topic_prefix, "kafka": kafka.model_dump(),
        "bridge": {"sources": sources, "devices": DEVICES, "transaction_records": 50, "transaction_seconds": 0.2,
                   "metrics": False, **bridge}})


def test_raw_arrays_keyed_by_device_are_bridged_once_each(kafka_cfg: KafkaConfig) -> None:
    topic = f"{kafka_cfg.topic_prefix}-raw"
    create_source(kafka_cfg, topic, 2)
    producer = make_producer(kafka_cfg)
    rng = np.random.default_rng(0)
    sent = {}
    for i in range(120):
        frames = rng.standard_normal((1 + i % 4, 8)).astype("<f4")
        producer.produce(topic, key=DEVICES[i % 3].encode(), value=frames.tobytes(), headers=[("y", str(i % 5))])
        sent[frames.tobytes()] = i % 5
    producer.produce(topic, key=b"d0", value=b"\x00" * 7, headers=[("y", "1")])  # not whole float32s
    assert producer.flush(30) == 0
    cfg = _config(kafka_cfg, [{"topic": topic, "decoder": "raw",
                               "layout": {"dtype": "float32", "shape": [-1, 8], "label_header": "y"}}])
    bridge = bridge_until_caught_up(cfg, 121)

    out = bridged(kafka_cfg, DEVICES)
    assert len(out) == 120 and all(len(v) == 1 for v in out.values())
    assert {s[0].data: s[0].label for s in out.values()} == sent  # the bytes, as sent, and their labels
    assert reasons(dead_letters(kafka_cfg)) == {"bad-length": 1}
    registry = bridge.metrics.registry
    assert registry.get_sample_value("streamtrain_bridge_records_rejected_total",
                                     {"job": cfg.job, "topic": topic, "reason": "bad-length"}) == 1
    assert sum(registry.get_sample_value("streamtrain_bridge_samples_out_total", {"job": cfg.job, "device": d}) or 0
               for d in DEVICES) == 120
    for tally in source_tallies(cfg):
        assert tally.exact and tally.fates.complete, tally.summary()


def test_a_user_decoder_bridges_skips_and_rejects_and_the_bridge_goes_on(kafka_cfg: KafkaConfig) -> None:
    sys.path.insert(0, str(EXAMPLES))
    try:
        topic = f"{kafka_cfg.topic_prefix}-lines"
        create_source(kafka_cfg, topic, 3)
        producer = make_producer(kafka_cfg)
        lines = [f"{DEVICES[i % 3]};{1_700_000_000 + i};{i % 2};{','.join(str(v) for v in range(3 * (1 + i % 3)))}"
                 for i in range(60)]
        lines[10], lines[20], lines[30] = "# heartbeat", "d1;x;1;1,2,3", "d9;1;1;1,2,3"
        for i, line in enumerate(lines):
            producer.produce(topic, key=b"gw-%d" % (i % 4), value=line.encode())
        assert producer.flush(30) == 0
        cfg = _config(kafka_cfg, [{"topic": topic, "decoder": "bridge_decoder:decode", "options": {"features": 3}}])
        bridge_until_caught_up(cfg, 60)
    finally:
        sys.path.remove(str(EXAMPLES))
        sys.modules.pop("bridge_decoder", None)
    out = bridged(kafka_cfg, DEVICES)
    assert len(out) == 57 and all(len(v) == 1 for v in out.values())
    assert all(s[0].shape[1] == 3 and s[0].metadata["gateway"].startswith("gw-") for s in out.values())
    assert reasons(dead_letters(kafka_cfg)) == {"skipped": 1, "bad-number": 1, "unknown-device": 1}
    (tally, *others) = [t for t in source_tallies(cfg) if t.fates.records]
    counts = {k: sum(t.summary()[k] for t in (tally, *others)) for k in ("bridged", "rejected", "skipped", "lost")}
    assert counts == {"bridged": 57, "rejected": 2, "skipped": 1, "lost": 0}


def test_bad_json_among_good_is_dead_lettered_with_its_reason(kafka_cfg: KafkaConfig) -> None:
    topic = f"{kafka_cfg.topic_prefix}-json"
    create_source(kafka_cfg, topic, 3)
    producer = make_producer(kafka_cfg)
    good = [json.dumps({"v": [0.5] * 4 * (1 + i % 3), "y": i % 3, "dev": DEVICES[i % 3]}) for i in range(90)]
    bad = ["{not json", json.dumps({"v": [1, 2, 3], "y": 0, "dev": "d0"}), json.dumps({"v": [1, 2, 3, 4], "dev": "d1"}),
           json.dumps({"v": [1, 2, 3, 4], "y": 1, "dev": "nobody"}), json.dumps({"v": [1e39] * 4, "y": 1, "dev": "d2"})]
    for i, value in enumerate(good[:45] + bad + good[45:]):
        producer.produce(topic, key=str(i).encode(), value=value.encode() + b"\n")
    assert producer.flush(30) == 0
    cfg = _config(kafka_cfg, [{"topic": topic, "decoder": "json",
                               "mapping": {"data": "v", "shape": [-1, 4], "label": "y", "device": "dev"}}])
    bridge_until_caught_up(cfg, 95)
    out = bridged(kafka_cfg, DEVICES)
    assert len(out) == 90 and all(len(v) == 1 for v in out.values())
    letters = dead_letters(kafka_cfg)
    assert reasons(letters) == {"json-invalid": 1, "bad-shape": 1, "missing-field": 1, "unknown-device": 1,
                                "non-finite": 1}
    assert all(d.service == "bridge" and d.topic == topic and d.value for d in letters)  # the record, kept whole
    assert all(t.exact and t.fates.complete for t in source_tallies(cfg))
