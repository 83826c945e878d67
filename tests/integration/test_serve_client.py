"""`streamtrain.ServeClient` against a real `serve` on the real broker: a version announced by hand is served,
each request gets its own prediction back, the same as `load_model(...).predict`, and a bad one its reason."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import streamtrain
from streamtrain.config import KafkaConfig, TrainerConfig
from streamtrain.models import build_model
from streamtrain.runtime.commands import module_command
from streamtrain.versions import spec_for, write_version

pytestmark = [pytest.mark.integration]


def test_a_client_gets_each_requests_prediction_back(kafka_cfg: KafkaConfig, tmp_path: Path) -> None:
    config = TrainerConfig(model="seq", num_features=1, num_classes=3, hidden_size=8)
    spec = spec_for(config, job="demo", version=1, step=0, class_names=("fan", "heater", "lamp"), offsets={},
                    metrics={})
    version = write_version(tmp_path / "versions", spec, build_model(config).state_dict())
    sets = {"job": "demo", "kafka.bootstrap_servers": kafka_cfg.bootstrap_servers,
            "kafka.topic_prefix": kafka_cfg.topic_prefix, "versions.dir": str(tmp_path / "versions"),
            "metrics.port": 0, "trainer.model": "seq", "trainer.num_features": 1, "trainer.num_classes": 3}
    log = (tmp_path / "serve.log").open("wb")
    argv = module_command("streamtrain.serve", "serve", sets=sets)
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 90
        while "metrics on http" not in (tmp_path / "serve.log").read_text():
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.5)
        streamtrain.announce_version(kafka_cfg, version)
        arrays = [np.sin(np.arange(120.0))[:, None], np.ones((40, 1)), np.zeros((7, 2)), np.arange(9.0)[:, None]]
        with streamtrain.ServeClient(kafka_cfg) as client:
            answers = client.answers(client.send(arrays), timeout=60)
            predicted = client.predict([arrays[i] for i in (0, 1, 3)], timeout=60)
            with pytest.raises(ValueError, match="1 of 1 requests were refused: wrong-shape"):
                client.predict([arrays[2]], timeout=60)
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
    finally:
        if server.poll() is None:
            server.kill()
    expected = streamtrain.load_model(version).predict([arrays[i] for i in (0, 1, 3)])
    assert [a.error for a in answers] == [None, None, "wrong-shape", None]
    served = [answers[i] for i in (0, 1, 3)]
    assert all(a.version == 1 for a in served)
    assert [a.label_name for a in served] == list(expected.names)
    np.testing.assert_allclose([a.probabilities for a in served], expected.probabilities, rtol=1e-5)
    # predict answers in the shape a loaded model's predict does, with the version of each row
    assert predicted.objective == expected.objective == "classification" and predicted.names == expected.names
    np.testing.assert_array_equal(predicted.labels, expected.labels)
    np.testing.assert_allclose(predicted.probabilities, expected.probabilities, rtol=1e-5)
    assert predicted.versions.tolist() == [1, 1, 1]
