"""`streamtrain up --external-devices`: an application feeds devices with `DeviceProducer` while `up` runs the rest."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from streamtrain import DeviceProducer
from streamtrain.config import KafkaConfig
from streamtrain.runtime.commands import CLI_MODULE, module_command

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SENT = 300
DURATION = 5


def _settings(path: Path, proc: subprocess.Popen[str], timeout: float) -> dict[str, str]:
    """The STREAMTRAIN_* settings `up` writes for an external device, once the file is there."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"up exited with {proc.returncode} before opening its external devices"
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout:.0f} s"
        time.sleep(0.2)
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


@pytest.mark.timeout(480)
def test_up_trains_and_accounts_for_every_record_of_devices_fed_from_outside(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # Device 1 is the stack's own synthetic stream; 0 is fed below; 2 is external and never sends a sample.
    # The settings file is there once the broker is, before the services start, so device 0's samples are all
    # sent by the time the --duration clock starts: a few seconds of device 1's stream are enough; the drain
    # works off the rest.
    cmd = module_command(CLI_MODULE, "up", "--devices", "3", "--external-devices", "0,2", "--duration", str(DURATION),
                         "--rates", "20", "--sizes", "24", "--broker", "embedded", "--no-prometheus", "--no-live",
                         "--drain-timeout", "120", "--out", str(out), sets={"trainer.hidden_size": 16})
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMTRAIN_")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**env, "COLUMNS": "200"})
    try:
        settings = _settings(out / "external" / "device-0.env", proc, 180)
        kafka = KafkaConfig(bootstrap_servers=settings["STREAMTRAIN_KAFKA__BOOTSTRAP_SERVERS"],
                            topic_prefix=settings["STREAMTRAIN_KAFKA__TOPIC_PREFIX"])
        rng = np.random.default_rng(0)
        with DeviceProducer(kafka, device="0") as producer:  # the synthetic task's shape: (size, 16), 10 classes
            for i in range(SENT):
                producer.send(rng.standard_normal((int(rng.integers(8, 40)), 16)).astype(np.float32), label=i % 10)
        assert producer.delivered == SENT
        output, _ = proc.communicate(timeout=420)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, output[-5000:]
    text = " ".join(output.split())
    assert f"external devices 0, 2: no producer of ours; publish to Kafka at {kafka.bootstrap_servers}" in text
    assert f"{kafka.topic_prefix}.device.0, {kafka.topic_prefix}.device.2" in text
    assert f"the run stops {DURATION} s after every service is up" in text

    report = json.loads((out / "report.json").read_text())
    assert report["external_devices"] == ["0", "2"] and [s["device"] for s in report["streams"]] == ["1"]
    assert report["stopped_by"] == f"--duration {DURATION}" and report["failures"] == []
    assert report["samples_unaccounted"] == 0 and report["samples_lost"] == 0
    fed, own, silent = (report["per_device"][d] for d in ("0", "1", "2"))
    assert fed["records"] == SENT and own["records"] > 0 and silent["records"] == 0
    for fates in (fed, own):  # every record in one bin by its offset, whoever wrote it
        assert fates["trained"] + fates["truncated"] + fates["dead_lettered"] + fates["pending"] == fates["records"]
        assert fates["unaccounted"] == 0
    assert fed["trained"] > 0 and fed["dead_lettered"] == 0
    assert not (out / "logs" / "producer-0.log").exists() and (out / "logs" / "producer-1.log").exists()
    assert oct((out / "external" / "device-2.env").stat().st_mode & 0o777) == "0o600"
