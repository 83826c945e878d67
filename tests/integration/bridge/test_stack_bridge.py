"""The bridge's acceptance: JSON lines that kcat (a C client) wrote to a 3-partition topic keyed by device are
trained through `streamtrain up --bridge`, and the report accounts for every source record by its offset."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest
from bridge_helpers import create_source, kcat_lines

from streamtrain.config import KafkaConfig
from streamtrain.runtime.commands import CLI_MODULE, module_command

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DEVICES = ("0", "1", "2")


@pytest.mark.timeout(400)
def test_kcat_json_lines_are_trained_through_up_and_every_source_record_is_accounted(
        kafka_cfg: KafkaConfig, tmp_path: Path) -> None:
    topic = f"{kafka_cfg.topic_prefix}-sensors"
    create_source(kafka_cfg, topic, 3)
    rng = np.random.default_rng(7)
    lines = [(DEVICES[i % 3], json.dumps({"reading": np.round(rng.standard_normal(16 * (1 + i % 5)), 3).tolist(),
                                          "class": i % 4})) for i in range(240)]
    lines += [("1", "{not json"), ("2", json.dumps({"reading": [1.0] * 15, "class": 1})), ("9", lines[0][1])]
    kcat_lines(kafka_cfg, topic, lines)
    bridge = tmp_path / "bridge.toml"
    bridge.write_text(f'[bridge]\ntransaction_seconds = 0.2\n\n[[bridge.sources]]\ntopic = "{topic}"\n'
                      'decoder = "json"\nmapping = { data = "reading", shape = [-1, 16], label = "class" }\n')

    out = tmp_path / "run"
    # Every source line is written before up starts, and the stop gives the bridge, then the ranks, the drain
    # timeout to catch up: the run itself need not last long for all of it to be bridged and trained.
    cmd = module_command(CLI_MODULE, "up", "--bridge", str(bridge), "--devices", "3", "--duration", "2",
                         "--broker", "external", "--no-prometheus", "--no-live", "--drain-timeout", "90",
                         "--out", str(out), sets={"kafka.bootstrap_servers": kafka_cfg.bootstrap_servers,
                                                  "kafka.topic_prefix": f"up{uuid.uuid4().hex[:8]}",
                                                  "trainer.hidden_size": 16, "trainer.num_classes": 4})
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMTRAIN_")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=380, env={**env, "COLUMNS": "200"})
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"

    report = json.loads((out / "report.json").read_text())
    sources = report["bridge"]
    assert sources["sources"] == [topic] and len(sources["partitions"]) == 3
    # Every source record in one bin by (topic, partition, offset): 240 bridged, 3 rejected, none pending or lost.
    assert (sources["source_records"], sources["source_bridged"], sources["source_rejected"]) == (243, 240, 3)
    assert sources["source_pending"] == sources["source_lost"] == sources["source_duplicated"] == 0
    reasons = {r: n for p in sources["partitions"] for r, n in p["reasons"].items()}
    assert reasons == {"json-invalid": 1, "bad-shape": 1, "unknown-device": 1}
    # ... and every bridged sample trained, through the device topics the bridge wrote in transactions.
    assert report["samples_produced"] == report["samples_trained"] == 240 and report["drained"] is True
    assert report["samples_unaccounted"] == 0 and report["samples_duplicated"] == 0 and report["failures"] == []
    assert "bridge: 243 source records" in proc.stdout
    assert "bridge stopped" in (out / "logs" / "bridge.log").read_text()


@pytest.mark.timeout(200)
def test_up_with_a_source_topic_missing_fails_before_the_trainers_start(kafka_cfg: KafkaConfig,
                                                                         tmp_path: Path) -> None:
    bridge = tmp_path / "bridge.toml"
    bridge.write_text(f'[[bridge.sources]]\ntopic = "{kafka_cfg.topic_prefix}-nowhere"\n')
    out = tmp_path / "run"
    cmd = module_command(CLI_MODULE, "up", "--bridge", str(bridge), "--devices", "2", "--duration", "60",
                         "--broker", "external", "--no-prometheus", "--no-live", "--out", str(out),
                         sets={"kafka.bootstrap_servers": kafka_cfg.bootstrap_servers,
                               "kafka.topic_prefix": f"up{uuid.uuid4().hex[:8]}"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMTRAIN_")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**env, "COLUMNS": "400"})
    assert proc.returncode != 0
    assert "bridge.sources.0.topic: topic" in proc.stderr and "is not there" in proc.stderr, proc.stderr
    assert not (out / "logs" / "trainers.log").exists() and not (out / "logs" / "coordinator.log").exists()
    assert "model:" not in proc.stdout
