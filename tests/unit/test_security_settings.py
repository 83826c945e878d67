"""Security settings: typed, validated at start-up, passed to every client, and never shown in clear."""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from prometheus_client import CollectorRegistry, Counter

from streamtrain.config import BrokerConfig, ConfigError, KafkaConfig, MetricsConfig, load_config
from streamtrain.coordinator.status import StatusServer
from streamtrain.kafka import client_settings, java_client_properties
from streamtrain.metrics import serve_metrics

PW = "s3cret-Passw0rd-xyz"


def _sasl(**extra: object) -> KafkaConfig:
    return KafkaConfig.model_validate({"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                                       "sasl_username": "alice", "sasl_password": PW, **extra})


def test_security_settings_reach_client_settings_and_nowhere_else(tmp_path: Path) -> None:
    files = {}
    for name in ("ca.pem", "cert.pem", "key.pem"):
        files[name] = tmp_path / name
        files[name].write_text("-----BEGIN-----\n")
    cfg = _sasl(ssl_ca_location=files["ca.pem"], ssl_certificate_location=files["cert.pem"],
                ssl_key_location=files["key.pem"], ssl_key_password="key-Pw-123",
                ssl_endpoint_identification_algorithm="none", client={"socket.timeout.ms": "5000"})
    settings = client_settings(cfg, **{"group.id": "g"})
    assert settings["security.protocol"] == "SASL_SSL" and settings["sasl.mechanism"] == "SCRAM-SHA-512"
    assert settings["sasl.username"] == "alice" and settings["sasl.password"] == PW
    assert settings["ssl.ca.location"] == str(files["ca.pem"])
    assert settings["ssl.certificate.location"] == str(files["cert.pem"])
    assert settings["ssl.key.location"] == str(files["key.pem"]) and settings["ssl.key.password"] == "key-Pw-123"
    assert settings["ssl.endpoint.identification.algorithm"] == "none"
    assert settings["socket.timeout.ms"] == "5000" and settings["group.id"] == "g"
    for shown in (repr(cfg), str(cfg), cfg.model_dump_json(), str(cfg.redacted_client())):
        assert PW not in shown and "key-Pw-123" not in shown
    assert cfg.redacted_client()["sasl.password"] == "***" and cfg.redacted_client()["ssl.key.password"] == "***"


def test_secrets_given_in_client_are_moved_to_masked_fields() -> None:
    client = json.dumps({"sasl.password": PW, "ssl.keystore.password": "k"})
    cfg = load_config(env={"STREAMTRAIN_KAFKA__CLIENT": client})
    assert cfg.kafka.client == {} and cfg.kafka.sasl_password is not None
    assert PW not in repr(cfg) and client_settings(cfg.kafka)["ssl.keystore.password"] == "k"


@pytest.mark.parametrize(("env", "names"), [
    ({"STREAMTRAIN_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT", "STREAMTRAIN_KAFKA__SASL_MECHANISM": "SCRAM-SHA-256",
      "STREAMTRAIN_KAFKA__SASL_PASSWORD": PW}, ["kafka.sasl_username"]),
    ({"STREAMTRAIN_KAFKA__SASL_MECHANISM": "SCRAM-SHA-1"}, ["kafka.sasl_mechanism", "SCRAM-SHA-512"]),
    ({"STREAMTRAIN_KAFKA__SSL_CA_LOCATION": "/nonexistent/ca.pem"}, ["kafka.ssl_ca_location", "not a readable file"]),
    ({"STREAMTRAIN_KAFKA__SASL_USERNAME": "a", "STREAMTRAIN_KAFKA__CLIENT": '{"sasl.username": "b"}'},
     ["sasl.username is set twice"]),
    ({"STREAMTRAIN_BROKER__SECURITY_PROTOCOL": "SASL_PLAINTEXT"}, ["broker.scram_users"]),
    ({"STREAMTRAIN_BROKER__SCRAM_USERS": '{"alice": "short"}'}, ["broker.scram_users", "shorter than 8"]),
    ({"STREAMTRAIN_METRICS__BIND_ADDRESS": "everywhere"}, ["metrics.bind_address", "not an IP address"]),
])
def test_bad_security_settings_fail_at_start_up_without_echoing_secrets(env: dict[str, str],
                                                                        names: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(env=env)
    for name in names:
        assert name in str(err.value)
    assert PW not in str(err.value) and "short" not in str(err.value).replace("shorter", "")


def test_java_tools_get_a_jaas_line() -> None:
    props = java_client_properties(_sasl(bootstrap_servers="h:1"))
    assert props["bootstrap.servers"] == "h:1" and props["sasl.mechanism"] == "SCRAM-SHA-512"
    assert props["sasl.jaas.config"].startswith("org.apache.kafka.common.security.scram.ScramLoginModule required")
    assert f'password="{PW}"' in props["sasl.jaas.config"]


def test_broker_users_are_masked() -> None:
    broker = BrokerConfig(security_protocol="SASL_PLAINTEXT", scram_users={"alice": PW})
    assert PW not in repr(broker) and PW not in broker.model_dump_json()


def _other_address() -> str | None:
    """A non-loopback IPv4 address of this machine, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outgoing interface
            addr = str(s.getsockname()[0])
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def test_endpoints_bind_loopback_by_default() -> None:
    default = MetricsConfig().bind_address
    assert default == "127.0.0.1"
    registry = CollectorRegistry()
    Counter("probe", "a probe", registry=registry).inc()
    port = serve_metrics(registry, default, 0)
    status = StatusServer(default, 0, lambda: {"ok": True}, registry)
    status.start()
    try:
        assert b"probe_total 1.0" in urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        assert urllib.request.urlopen(f"http://127.0.0.1:{status.port}/status", timeout=5).read() == b'{"ok": true}'
        other = _other_address()
        if other is None:
            pytest.skip("this machine has no non-loopback address to check from")
        assert not _reachable(other, port) and not _reachable(other, status.port)
        assert _reachable(other, serve_metrics(CollectorRegistry(), "0.0.0.0", 0))  # the check can tell
    finally:
        status.close()


def test_a_refused_login_stops_the_client_but_a_handshake_cut_off_is_retried() -> None:
    cfg = KafkaConfig(bootstrap_servers="b:9092", security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
                      sasl_username="alice", sasl_password="pw")
    on_error = client_settings(cfg)["error_cb"]
    refused = KafkaError(KafkaError._AUTHENTICATION, "sasl://b:9092/1: SASL authentication error: Authentication "
                         "failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512")
    with pytest.raises(KafkaException, match="refused to authenticate user 'alice'"):
        on_error(refused)
    # librdkafka's words when the connection drops mid-handshake (a busy broker): it retries by itself
    on_error(KafkaError(KafkaError._AUTHENTICATION, "GroupCoordinator: SASL SCRAM-SHA-512 mechanism handshake "
                        "failed: Local: Broker transport failure: broker's supported mechanisms: (n/a)"))
