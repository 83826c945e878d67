"""SASL/SCRAM end to end on a real broker: users made at format time, every client path authenticates,
a wrong password fails fast and says why, and no password shows up in logs, config, metrics or /status.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from prometheus_client import CollectorRegistry, generate_latest

from streamtrain.broker import EmbeddedBroker, find_kafka_libs
from streamtrain.config import BrokerConfig, KafkaConfig, MetricsConfig, ProducerConfig, StreamtrainConfig
from streamtrain.coordinator.service import Coordinator
from streamtrain.kafka import TopicSpec, ensure_topics, java_client_properties, make_admin, make_producer, read_to_end
from streamtrain.producers.service import StreamProducer
from streamtrain.runtime.commands import CLI_MODULE, module_command

pytestmark = pytest.mark.faults

ALICE_PW = "alice-Pw-" + uuid.uuid4().hex  # unique, so finding it anywhere is a real leak
BOB_PW = "bob-Pw-" + uuid.uuid4().hex
WRONG_PW = "wrong-Pw-" + uuid.uuid4().hex
SECRETS = (ALICE_PW, BOB_PW, WRONG_PW)


@pytest.fixture(scope="module")
def scram_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    # Authentication alone: any authenticated user may do anything here (authorization is test_security_acl's).
    broker = EmbeddedBroker(BrokerConfig(data_dir=tmp_path_factory.mktemp("scram"), heap="512m",
                                         security_protocol="SASL_PLAINTEXT", scram_users={"alice": ALICE_PW},
                                         acls=False))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop(timeout=30)


def _kafka(broker: EmbeddedBroker, password: str, user: str = "alice", mechanism: str = "SCRAM-SHA-512",
           prefix: str | None = None) -> KafkaConfig:
    return KafkaConfig(bootstrap_servers=broker.bootstrap, topic_prefix=prefix or f"s{uuid.uuid4().hex[:10]}",
                       security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism, sasl_username=user,
                       sasl_password=password)


def _env(kafka: KafkaConfig, password: str) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1",
            "STREAMTRAIN_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
            "STREAMTRAIN_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
            "STREAMTRAIN_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "STREAMTRAIN_KAFKA__SASL_MECHANISM": kafka.sasl_mechanism or "",
            "STREAMTRAIN_KAFKA__SASL_USERNAME": kafka.sasl_username or "",
            "STREAMTRAIN_KAFKA__SASL_PASSWORD": password}


def _cli(*args: str, env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(module_command(CLI_MODULE, *args), env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _assert_clean(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"a password appears in {where}"


def test_right_password_reaches_every_client_and_no_secret_leaks(
        scram_broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    kafka = _kafka(scram_broker, ALICE_PW)
    # The producers service, through the shared factories (admin for topics, idempotent producer).
    registry = CollectorRegistry()
    producer = StreamProducer(kafka, ProducerConfig.model_validate(
        {"metrics": False, "devices": 2, "max_samples": 40, "rate": {"kind": "unlimited"}}), registry=registry)
    assert producer.run().ok
    seqs = sorted((m.topic(), m.offset()) for m in read_to_end(kafka, producer.topics, timeout=30))
    assert len(seqs) == 80
    _assert_clean(generate_latest(registry).decode(), "producer metrics")

    # The coordinator: admin, producer, feedback consumer, and its /status and /metrics endpoint.
    service = Coordinator(StreamtrainConfig(job="sec", kafka=kafka, metrics=MetricsConfig(port=0)))
    service.start()
    try:
        base = f"http://127.0.0.1:{service.port}"
        status = urllib.request.urlopen(f"{base}/status", timeout=10).read().decode()
        assert json.loads(status)["job"] == "sec"
        _assert_clean(status, "/status")
        _assert_clean(urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode(), "coordinator /metrics")
    finally:
        service.close()

    # The CLI in its own process, configured from the environment as a deployment would be.
    kafka_cli = _kafka(scram_broker, ALICE_PW, mechanism="SCRAM-SHA-256")  # both mechanisms were created
    done = _cli("produce", "--devices", "1", "--max-samples", "25", "--rate-kind", "unlimited", "--no-progress",
                env=_env(kafka_cli, ALICE_PW))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _assert_clean(done.stdout + done.stderr, "`streamtrain produce` output")
    assert len(list(read_to_end(kafka_cli, [kafka_cli.topics.device("0")], timeout=30))) == 25

    shown = _cli("config", "show", env=_env(kafka_cli, ALICE_PW))
    assert shown.returncode == 0, shown.stderr
    _assert_clean(shown.stdout + shown.stderr, "`streamtrain config show`")
    data = json.loads(shown.stdout)
    assert data["kafka"]["sasl_username"] == "alice" and data["kafka"]["client_settings"]["sasl.password"] == "***"

    _assert_clean(caplog.text, "the test process's logs")
    _assert_clean(scram_broker.log_path.read_text(errors="replace"), "broker.log")
    # The broker's own credential lives in files only its owner can read, and never in broker.log.
    for private in (scram_broker.properties_path, scram_broker.data_dir / "broker-secret"):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600, private
    broker_secret = (scram_broker.data_dir / "broker-secret").read_text().strip()
    assert broker_secret not in scram_broker.log_path.read_text(errors="replace")


def test_wrong_password_fails_fast_naming_the_settings(scram_broker: EmbeddedBroker,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    kafka = _kafka(scram_broker, WRONG_PW)
    began = time.monotonic()
    with pytest.raises(KafkaException) as err:
        ensure_topics(make_admin(kafka), [TopicSpec.from_config(kafka, kafka.topics.feedback)], timeout=30)
    assert time.monotonic() - began < 10  # the refusal ends it, not the 30 s timeout
    error = err.value.args[0]
    assert error.code() == KafkaError._AUTHENTICATION and error.fatal()
    assert "refused to authenticate user 'alice'" in error.str() and "kafka.sasl_password" in error.str()

    producer = make_producer(kafka)
    producer.produce("anything", b"x")
    began = time.monotonic()
    with pytest.raises(KafkaException, match="refused to authenticate"):
        while time.monotonic() - began < 20:
            producer.poll(0.5)  # what the services' produce loops do
    assert time.monotonic() - began < 10

    began = time.monotonic()
    with pytest.raises(KafkaException, match="refused to authenticate user 'nobody'"):
        list(read_to_end(_kafka(scram_broker, WRONG_PW, user="nobody"), ["anything"], timeout=30))
    assert time.monotonic() - began < 10

    began = time.monotonic()
    done = _cli("produce", "--devices", "1", "--max-samples", "5", "--no-progress", env=_env(kafka, WRONG_PW))
    assert done.returncode != 0 and time.monotonic() - began < 60
    output = done.stdout + done.stderr
    assert "refused to authenticate" in output and "kafka.sasl_password" in output, output[-3000:]
    _assert_clean(output, "`streamtrain produce` output")
    _assert_clean(caplog.text, "the test process's logs")


def test_java_tools_get_the_same_credentials(scram_broker: EmbeddedBroker, tmp_path: Path) -> None:
    kafka = _kafka(scram_broker, ALICE_PW)
    topic = kafka.topics.device("java")
    ensure_topics(make_admin(kafka), [TopicSpec.from_config(kafka, topic)])
    props = tmp_path / "client.properties"
    fd = os.open(props, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.writelines(f"{k}={v}\n" for k, v in java_client_properties(kafka).items())
    cmd = ["java", "-Xmx256m", "-cp", f"{find_kafka_libs()}/*", "org.apache.kafka.tools.ProducerPerformance",
           "--topic", topic, "--num-records", "500", "--record-size", "100", "--throughput", "-1",
           "--producer.config", str(props)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "500 records sent" in done.stdout
    _assert_clean(done.stdout + done.stderr, "the Java tool's output")
    assert len(list(read_to_end(kafka, [topic], timeout=30))) == 500


def test_users_added_later_are_created_at_the_next_start(scram_broker: EmbeddedBroker) -> None:
    bob = _kafka(scram_broker, BOB_PW, user="bob")
    with pytest.raises(KafkaException, match="refused to authenticate"):
        ensure_topics(make_admin(bob), [TopicSpec.from_config(bob, bob.topics.feedback)], timeout=10)
    scram_broker.stop(timeout=30)
    later = EmbeddedBroker(BrokerConfig.model_validate(
        {**scram_broker.cfg.model_dump(), "scram_users": {"alice": ALICE_PW, "bob": BOB_PW}}))
    later.start()  # same data directory; the module fixture stops it
    bob = _kafka(later, BOB_PW, user="bob")
    assert ensure_topics(make_admin(bob), [TopicSpec.from_config(bob, bob.topics.feedback)], timeout=30)
    assert EmbeddedBroker.answers(later.bootstrap, settings=later.admin_settings())
    assert not EmbeddedBroker.answers(later.bootstrap, timeout=2)  # no credentials, no answer
