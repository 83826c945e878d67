"""`streamtrain up --steps N` end to end: embedded broker, producers, coordinator, gloo ranks, report."""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from streamtrain.config import KafkaConfig
from streamtrain.runtime.commands import CLI_MODULE, module_command

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REQUIRED = ("policy", "devices", "steps", "samples_produced", "samples_trained", "samples_truncated",
            "samples_dead_lettered", "samples_unaccounted", "straggler_effect_median", "step_seconds_median",
            "throughput_samples_per_s", "plan_latency_ms_median", "final_loss")


@pytest.mark.timeout(300)
def test_up_for_n_steps_stops_in_order_and_accounts_for_every_sample(tmp_path: Path) -> None:
    out = tmp_path / "run"
    steps = 12
    cmd = module_command(CLI_MODULE, "up", "--devices", "2", "--steps", str(steps), "--rates", "20,40", "--sizes",
                         "24,12", "--broker", "embedded", "--no-prometheus", "--no-live", "--drain-timeout", "60",
                         "--out", str(out), sets={"trainer.hidden_size": 16})
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMTRAIN_")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env={**env, "COLUMNS": "200"})
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"

    report = json.loads((out / "report.json").read_text())
    for key in REQUIRED:
        assert key in report, key
    assert report["stopped_by"] == f"--steps {steps}" and report["drained"] is True
    assert report["devices"] == 2 and report["steps"] >= steps
    assert report["samples_produced"] > 0 and report["samples_trained"] > 0
    assert report["samples_unaccounted"] == 0 and report["samples_pending"] == 0
    # Every record in exactly one bin, by offset; a run without faults trains no sample twice.
    assert (report["samples_trained"] + report["samples_truncated"] + report["samples_dead_lettered"]
            + report["samples_pending"] + report["samples_lost"]) == report["samples_produced"]
    assert report["samples_duplicated"] == 0 and report["records_written_twice"] == 0
    assert report["plan_latency_ms_median"] is not None and report["final_loss"] is not None
    assert report["failures"] == []
    assert {p.name for p in (out / "plots").glob("*.png")} >= {
        "batch_and_step_time.png", "straggler_effect.png", "lag_and_buffer.png", "truncation.png", "loss.png",
        "samples_per_second.png"}
    # Stopped in order: the ranks wrote a final checkpoint and exited 0 after the producers had flushed.
    trainers = (out / "logs" / "trainers.log").read_text()
    assert trainers.count("stopped after step") == 2
    for device in ("0", "1"):
        assert "stopped by interrupt" in (out / "logs" / f"producer-{device}.log").read_text()  # flushed, then exit
    assert not (out / "kafka").exists()  # the embedded broker's data is removed unless --keep-kafka


@pytest.mark.timeout(400)
def test_up_stopped_with_a_backlog_left_exits_0_and_reports_it_pending(tmp_path: Path, kafka_cfg: KafkaConfig) -> None:
    """A stop before the backlog is worked off is not a loss: what is left stays in Kafka, reported as pending."""
    out = tmp_path / "run"
    per_device = 20_000
    cmd = module_command(CLI_MODULE, "up", "--devices", "2", "--backlog", str(per_device), "--steps", "3",
                         "--drain-timeout", "0", "--sizes", "24,12", "--broker", "external", "--no-prometheus",
                         "--no-live", "--out", str(out),
                         # Small steps: on a quiet machine steps of the default global batch worked off the whole
                         # backlog (24 steps) in the second `up` took to see that step 3 was done. The session's
                         # broker, topics of this test's own: a broker's start is no part of the check.
                         sets={"trainer.hidden_size": 16, "coordinator.global_batch": 16,
                               "kafka.bootstrap_servers": kafka_cfg.bootstrap_servers,
                               "kafka.topic_prefix": kafka_cfg.topic_prefix})
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMTRAIN_")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=380, env={**env, "COLUMNS": "200"})
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"

    report = json.loads((out / "report.json").read_text())
    assert report["samples_produced"] == 2 * per_device and report["samples_unaccounted"] == 0
    assert report["samples_trained"] > 0 and report["samples_pending"] > 0, report
    assert (report["samples_trained"] + report["samples_truncated"] + report["samples_dead_lettered"]
            + report["samples_pending"]) == report["samples_produced"]
    assert report["samples_duplicated"] == 0 and report["failures"] == []
    assert f"{report['samples_pending']:,} samples pending" in " ".join(proc.stdout.split())


@pytest.mark.timeout(300)
def test_up_that_trains_none_of_its_samples_fails_naming_why_and_keeps_no_model(kafka_cfg: KafkaConfig,
                                                                                 tmp_path: Path) -> None:
    """Every sample dead-lettered (here the trainers accept no float32) is a failed run, not a model."""
    out = tmp_path / "run"
    cmd = module_command(CLI_MODULE, "up", "--devices", "1", "--duration", "3", "--broker", "external",
                         "--no-prometheus", "--no-live", "--drain-timeout", "30", "--out", str(out),
                         sets={"kafka.bootstrap_servers": kafka_cfg.bootstrap_servers,
                               "kafka.topic_prefix": f"up{uuid.uuid4().hex[:8]}", "trainer.hidden_size": 16,
                               "trainer.accepted_dtypes": ["int8"]})
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMTRAIN_")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env={**env, "COLUMNS": "400"})
    assert proc.returncode == 1, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"

    report = json.loads((out / "report.json").read_text())
    assert report["samples_produced"] > 0 and report["samples_trained"] == 0
    (failure,) = report["failures"]
    assert failure.startswith(f"none of the {report['samples_produced']:,} samples was trained")
    assert "dtype-not-accepted" in failure and failure.endswith("check trainer.accepted_dtypes")
    assert "model: none kept" in proc.stdout and not (out / "model").exists()
    # The rank's last line says the same: what it trained and dead-lettered over the run.
    assert re.search(r"stopped after step \d+: 0 samples trained, [1-9]\d* dead-lettered",
                     (out / "logs" / "trainers.log").read_text())
