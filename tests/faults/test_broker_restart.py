"""The embedded broker survives stops and crashes: restart on the same data keeps every record, once."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import KafkaError, Message
from typer.testing import CliRunner

from streamtrain.broker import BrokerError, EmbeddedBroker
from streamtrain.cli import app
from streamtrain.config import BrokerConfig, KafkaConfig
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin, make_producer, read_to_end
from streamtrain.report.accounting import SeqLedger
from streamtrain.runtime.commands import CLI_MODULE, module_command
from streamtrain.wire import Sample, decode, encode

pytestmark = [pytest.mark.faults, pytest.mark.integration]

BATCH = 1500


def _produce(cfg: KafkaConfig, device: str, seqs: range) -> list[KafkaError]:
    failures: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(err)

    producer = make_producer(cfg)
    rng = np.random.default_rng(seqs.start)
    for seq in seqs:
        arr = rng.standard_normal((int(rng.integers(1, 90)), 8)).astype(np.float32)
        value, headers = encode(Sample.from_array(device, seq, arr))
        producer.produce(cfg.topics.device(device), value=value, headers=headers, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0
    return failures


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_records_survive_a_broker_stop_or_crash_exactly_once(
    broker_factory: Callable[..., EmbeddedBroker], how: signal.Signals
) -> None:
    broker = broker_factory()
    bootstrap = broker.start()
    cfg = KafkaConfig(bootstrap_servers=bootstrap, topic_prefix="restart")
    ensure_topics(make_admin(cfg), [TopicSpec.from_config(cfg, cfg.topics.device("d"))])
    assert _produce(cfg, "d", range(BATCH)) == []  # acked with acks=all: durable on the (single) replica

    if how == signal.SIGTERM:
        assert broker.stop() is True  # clean controlled shutdown, no kill needed
    else:
        broker.kill()
    assert broker.pid() is None and not EmbeddedBroker.answers(bootstrap, timeout=1)

    assert broker.start() == bootstrap  # same data directory, same port: old clients reconnect
    assert _produce(cfg, "d", range(BATCH, 2 * BATCH)) == []
    ledger = SeqLedger()
    for msg in read_to_end(cfg, [cfg.topics.device("d")]):
        ledger.add("d", decode(msg.value(), msg.headers(), Sample).seq)
    account = ledger.account("d", 2 * BATCH)
    assert account.exact, account


def test_cli_start_status_stop_restart_keeps_data(tmp_path: Path) -> None:
    runner = CliRunner()
    data_dir = str(tmp_path / "cli-broker")
    started = runner.invoke(app, ["broker", "start", "--data-dir", data_dir])
    assert started.exit_code == 0, started.output
    bootstrap = started.stdout.strip().splitlines()[0]
    try:
        status = runner.invoke(app, ["broker", "status", "--data-dir", data_dir, "--json"])
        assert status.exit_code == 0
        report = json.loads(status.stdout)
        assert report["healthy"] and report["bootstrap"] == bootstrap and report["version"].startswith("4.")

        cfg = KafkaConfig(bootstrap_servers=bootstrap, topic_prefix="cli")
        ensure_topics(make_admin(cfg), [TopicSpec.from_config(cfg, cfg.topics.device("x"))])
        assert _produce(cfg, "x", range(10)) == []
        again = runner.invoke(app, ["broker", "start", "--data-dir", data_dir])  # already running: same address
        assert again.exit_code == 0 and again.stdout.strip().splitlines()[0] == bootstrap

        assert runner.invoke(app, ["broker", "stop", "--data-dir", data_dir]).exit_code == 0
        down = runner.invoke(app, ["broker", "status", "--data-dir", data_dir])
        assert down.exit_code == 1 and "not running" in down.output

        restarted = runner.invoke(app, ["broker", "start", "--data-dir", data_dir])
        assert restarted.exit_code == 0
        assert len(list(read_to_end(cfg, [cfg.topics.device("x")]))) == 10
    finally:
        runner.invoke(app, ["broker", "stop", "--data-dir", data_dir])


def test_start_failure_names_the_problem(broker_factory: Callable[..., EmbeddedBroker]) -> None:
    """A port that is taken is reported with the setting to change, before any JVM starts."""
    first = broker_factory()
    port = int(first.start().rsplit(":", 1)[1])
    clash = broker_factory(port=port)
    with pytest.raises(BrokerError, match=r"port .* in use \(broker.port"):
        clash.start()


def test_broker_run_stays_in_the_foreground_and_stops_on_sigterm(tmp_path: Path) -> None:
    """`broker run` is the process a container supervisor sees: it answers, and SIGTERM ends it cleanly."""
    data_dir = tmp_path / "fg"
    log = tmp_path / "fg.log"
    with log.open("wb") as out:  # a file, not a pipe: an unread pipe would block the broker's logging
        proc = subprocess.Popen(module_command(CLI_MODULE, "broker", "run", "--data-dir", str(data_dir)),
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        broker = EmbeddedBroker(BrokerConfig(data_dir=data_dir))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (broker.read_state() and broker.answers(broker.bootstrap)):
            assert proc.poll() is None, log.read_text()
            time.sleep(0.3)
        assert broker.pid() == proc.pid  # exec'd in place: the supervisor's pid is the broker's
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) in (0, 143)
        output = log.read_text()
        assert "Kafka Server started" in output and "shut down completed" in output.lower()
    finally:
        if proc.poll() is None:
            proc.kill()
