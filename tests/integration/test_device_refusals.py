"""A remote device with a setting the broker refuses, against a real broker with a SASL_SSL listener (SCRAM over
TLS, as the compose stack's EXTERNAL one): without TLS, with a wrong password, without the CA, by a name its
certificate does not hold, TLS at the plain listener. Each `DeviceProducer` stops within seconds with a message
naming the cause and the setting to change (rather than "unreachable", then a delivery timeout two minutes later),
and nothing else stops: the broker goes on serving a well-configured device on the same listener.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamtrain import DeviceProducer, DeviceProducerError
from streamtrain.broker import EmbeddedBroker
from streamtrain.config import BrokerConfig, KafkaConfig
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin, read_to_end
from streamtrain.net import free_port

pytestmark = pytest.mark.integration

USER, PASSWORD = "device-7", "device-Secret-7"


@dataclass(frozen=True)
class TlsBroker:
    broker: EmbeddedBroker
    tls_port: int
    ca: Path

    def kafka(self, host: str = "localhost", **settings: Any) -> KafkaConfig:
        """Settings of a device at the TLS listener (by `host`): SASL_SSL with the CA and its password, unless
        `settings` say otherwise (None: unset)."""
        base: dict[str, Any] = {"bootstrap_servers": f"{host}:{self.tls_port}", "topic_prefix": "refusals",
                                "security_protocol": "SASL_SSL", "ssl_ca_location": self.ca,
                                "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": USER, "sasl_password": PASSWORD}
        base.update(settings)
        return KafkaConfig.model_validate({k: v for k, v in base.items() if v is not None})


def _certificates(out: Path) -> tuple[Path, Path]:
    """A CA, and the broker's key and certificate for `localhost` only (as one PEM keystore): (ca, keystore)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")

    def run(*args: object) -> None:
        subprocess.run([openssl, *map(str, args)], check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=refusals test CA",
        "-keyout", out / "ca.key", "-out", out / "ca.crt")
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", out / "broker.key",
        "-out", out / "broker.csr")
    (out / "ext.cnf").write_text("subjectAltName=DNS:localhost\n")
    run("x509", "-req", "-in", out / "broker.csr", "-CA", out / "ca.crt", "-CAkey", out / "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", out / "ext.cnf", "-out", out / "broker.crt")
    run("pkcs8", "-topk8", "-nocrypt", "-in", out / "broker.key", "-out", out / "broker.pk8")
    keystore = out / "broker.pem"  # Kafka reads a PEM keystore: the key, then the certificate
    keystore.write_text((out / "broker.pk8").read_text() + (out / "broker.crt").read_text())
    return out / "ca.crt", keystore


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    """An embedded SCRAM broker with a second listener, EXTERNAL: SASL_SSL (SCRAM-SHA-512 over TLS)."""
    work = tmp_path_factory.mktemp("tls-kafka")
    ca, keystore = _certificates(work)
    port, tls, controller = free_port(), free_port(), free_port()
    props = {
        "listeners": f"SASL_PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller},"
                     f"EXTERNAL://127.0.0.1:{tls}",
        "advertised.listeners": f"SASL_PLAINTEXT://127.0.0.1:{port},EXTERNAL://localhost:{tls}",
        "listener.security.protocol.map": "CONTROLLER:SASL_PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,"
                                          "EXTERNAL:SASL_SSL",
        "listener.name.external.sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.external.scram-sha-512.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "listener.name.external.ssl.keystore.type": "PEM",
        "listener.name.external.ssl.keystore.location": str(keystore),
    }
    broker = EmbeddedBroker(BrokerConfig(data_dir=work / "broker", heap="512m", port=port, controller_port=controller,
                                         security_protocol="SASL_PLAINTEXT", scram_users={USER: PASSWORD},
                                         acls=False, properties=props))
    broker.start()
    try:
        setup = TlsBroker(broker, tls, ca)
        ensure_topics(make_admin(broker.own_identity(setup.kafka())), [TopicSpec(setup.kafka().topics.device("7"))])
        yield setup
    finally:
        broker.stop()


def _refusal(kafka: KafkaConfig) -> str:
    """What a device with these settings is told: a `DeviceProducerError`, from `send` or `flush`, within 15 s."""
    began = time.monotonic()
    producer = DeviceProducer(kafka, device="7")
    with pytest.raises(DeviceProducerError) as refused:
        try:
            while time.monotonic() - began < 30:
                producer.send(np.ones((3, 2), dtype=np.float32))
                producer.flush(0.5)
        finally:
            with pytest.raises(DeviceProducerError):
                producer.close(1)  # what it held is given up, and it says why again
    assert time.monotonic() - began < 15, "the refusal came only from a timeout"
    text = str(refused.value)
    assert text.startswith("device '7': ") and PASSWORD not in text
    return text


def test_a_device_without_tls_at_a_tls_listener_is_told_to_turn_tls_on(tls_broker: TlsBroker) -> None:
    text = _refusal(tls_broker.kafka(security_protocol="SASL_PLAINTEXT", ssl_ca_location=None))
    assert f"the listener at localhost:{tls_broker.tls_port} speaks TLS" in text, text
    assert "kafka.security_protocol=SASL_SSL" in text and "kafka.ssl_ca_location" in text, text
    bare = _refusal(tls_broker.kafka(security_protocol=None, ssl_ca_location=None, sasl_mechanism=None,
                                     sasl_username=None, sasl_password=None))
    assert "speaks TLS" in bare and "kafka.security_protocol=PLAINTEXT" in bare and "Set kafka.security_protocol=SSL" \
        in bare, bare


def test_a_wrong_password_over_tls_is_told_as_a_refused_login(tls_broker: TlsBroker) -> None:
    text = _refusal(tls_broker.kafka(sasl_password="not-the-Password"))
    assert f"refused to authenticate user '{USER}' with SCRAM-SHA-512" in text, text
    assert "kafka.sasl_password" in text and "not-the-Password" not in text


def test_a_certificate_the_device_cannot_trust_names_the_ca_setting_or_the_host(tls_broker: TlsBroker) -> None:
    untrusted = _refusal(tls_broker.kafka(ssl_ca_location=None))
    assert "is not signed by a CA this client trusts" in untrusted and "kafka.ssl_ca_location" in untrusted, untrusted
    by_ip = _refusal(tls_broker.kafka(host="127.0.0.1"))  # the certificate names localhost only
    assert "does not name the host 127.0.0.1" in by_ip, by_ip
    assert "kafka.ssl_endpoint_identification_algorithm=none" in by_ip


def test_tls_at_the_plain_listener_is_told_the_listener_does_not_speak_it(tls_broker: TlsBroker) -> None:
    plain = tls_broker.broker.bootstrap
    text = _refusal(tls_broker.kafka(bootstrap_servers=plain))
    assert f"the listener at {plain} does not speak TLS" in text and "kafka.security_protocol=SASL_PLAINTEXT" in text


def test_the_refusals_stop_nothing_else_a_well_configured_device_delivers(tls_broker: TlsBroker) -> None:
    _refusal(tls_broker.kafka(sasl_password="not-the-Password"))
    _refusal(tls_broker.kafka(security_protocol="SASL_PLAINTEXT", ssl_ca_location=None))
    kafka = tls_broker.kafka()
    with DeviceProducer(kafka, device="7") as device:
        seqs = [device.send(np.full((2, 2), i, dtype=np.float32)) for i in range(5)]
    assert device.delivered == 5 and device.failed == 0
    assert tls_broker.broker.status().running
    read = list(read_to_end(kafka, [kafka.topics.device("7")], timeout=30))
    assert len(read) >= len(seqs)
