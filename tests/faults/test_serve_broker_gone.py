"""serve with its broker gone for good: it says so a few times (not at every reconnect) and exits 1 after
serve.broker_timeout_seconds, for its supervisor to restart it."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from streamtrain.broker import EmbeddedBroker
from streamtrain.runtime.commands import module_command

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.slow]

TIMEOUT_S = 6.0


def test_serve_exits_after_its_timeout_without_the_broker_and_keeps_its_log_readable(
        broker_factory: Callable[..., EmbeddedBroker], tmp_path: Path) -> None:
    broker = broker_factory(heap="512m")
    bootstrap = broker.start()
    log_path = tmp_path / "serve.log"
    sets = {"kafka.bootstrap_servers": bootstrap, "kafka.topic_prefix": "gone", "metrics.port": 0,
            "versions.dir": str(tmp_path / "versions"), "serve.broker_timeout_seconds": TIMEOUT_S}
    with log_path.open("wb") as log:
        argv = module_command("streamtrain.serve", "serve", sets=sets)
        server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 90
        while "metrics on http" not in log_path.read_text() and time.monotonic() < deadline:
            assert server.poll() is None, log_path.read_text()
            time.sleep(0.5)
        broker.kill()
        killed = time.monotonic()
        status = server.wait(TIMEOUT_S + 60)
        took = time.monotonic() - killed
    finally:
        if server.poll() is None:
            server.kill()
    text = log_path.read_text()
    assert status == 1, text[-3000:]
    assert TIMEOUT_S < took < TIMEOUT_S + 45, text[-3000:]
    assert "is unreachable" in text and "serve.broker_timeout_seconds" in text
    assert "no Kafka broker at" in " ".join(text.split())  # the reason it exits, for the one reading the log
    failures = [line for line in text.splitlines() if "librdkafka" in line and "FAIL" in line]
    assert len(failures) <= 3, failures[:10]  # not one line per reconnect of every client
