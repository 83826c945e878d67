"""librdkafka's connection errors told as the setting to fix (`streamtrain.kafka_errors`), with our own TLS probe
replaced by what it would find: a refused login, a TLS listener a client without TLS reaches, a certificate the
client cannot trust or that does not name the host, a TLS client at a plain listener; and a broker that does not
answer at all is none of these (librdkafka keeps retrying). The same errors against real listeners:
tests/integration/test_device_refusals.py."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from streamtrain.config import KafkaConfig, SourceClusterConfig
from streamtrain.kafka import client_settings
from streamtrain.kafka_errors import TlsProbe, explain, probe_tls

DOWN = KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")
VERIFY = KafkaError(KafkaError._SSL, "sasl_ssl://kafka.example:9094/bootstrap: SSL handshake failed: error:0A000086:"
                    "SSL routines::certificate verify failed: broker certificate could not be verified")


class Probe:
    """Stands in for `probe_tls`: what it would find, and the addresses it was asked about."""

    def __init__(self, found: TlsProbe) -> None:
        self.found = found
        self.asked: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, address: str, *args: Any, **kwargs: Any) -> TlsProbe:
        self.asked.append((address, {"args": args, **kwargs}))
        return self.found


def _sasl(protocol: str = "SASL_PLAINTEXT", **extra: Any) -> KafkaConfig:
    return KafkaConfig(bootstrap_servers="kafka.example:9094,kafka-2.example:9094", security_protocol=protocol,
                       sasl_mechanism="SCRAM-SHA-512", sasl_username="cam-3", sasl_password="pw", **extra)


def test_a_client_without_tls_at_a_tls_listener_is_told_to_set_tls_and_the_ca() -> None:
    probe = Probe(TlsProbe(True, True))
    found = explain(_sasl(), DOWN, probe)
    assert found is not None and found.fatal() and found.code() == KafkaError._TRANSPORT
    assert "the listener at kafka.example:9094 speaks TLS" in found.str()
    assert "kafka.security_protocol=SASL_SSL" in found.str() and "kafka.ssl_ca_location" in found.str()
    assert probe.asked[0][0] == "kafka.example:9094"  # the bootstrap servers: "brokers are down" names none


def test_a_broker_that_does_not_answer_or_does_not_speak_tls_is_left_to_librdkafkas_retries() -> None:
    assert explain(_sasl(), DOWN, Probe(TlsProbe(False))) is None  # down: nothing can be told
    assert explain(_sasl(), DOWN, Probe(TlsProbe(True, False))) is None  # a plain listener: just unreachable now
    timed_out = KafkaError(KafkaError._TIMED_OUT, "Local: Timed out")
    assert explain(_sasl(), timed_out, Probe(TlsProbe(True, True))) is None  # not a connection set-up's time-out


def test_a_certificate_not_signed_by_a_trusted_ca_names_the_ca_setting() -> None:
    found = explain(_sasl("SASL_SSL"), VERIFY, Probe(TlsProbe(True, True, 20, "unable to get local issuer")))
    assert found is not None and found.fatal() and found.code() == KafkaError._SSL
    assert "the certificate of the broker at kafka.example:9094 is not signed by a CA this client trusts" in found.str()
    assert "no kafka.ssl_ca_location" in found.str() and "set kafka.ssl_ca_location" in found.str()


def test_a_certificate_that_does_not_name_the_host_names_the_host_and_the_check_setting(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    probe = Probe(TlsProbe(True, True, 62, "Hostname mismatch, certificate is not valid for 'kafka.example'."))
    found = explain(_sasl("SASL_SSL", ssl_ca_location=ca), VERIFY, probe)
    assert found is not None and "does not name the host kafka.example" in found.str()
    assert "kafka.ssl_endpoint_identification_algorithm=none" in found.str()
    assert probe.asked == [("kafka.example:9094", {"args": (str(ca),), "verify": True, "check_host": True})]


def test_a_tls_client_at_a_plain_listener_is_told_so_and_a_handshake_that_passes_is_not_explained() -> None:
    plain = explain(_sasl("SASL_SSL"), VERIFY, Probe(TlsProbe(True, False)))
    assert plain is not None and "does not speak TLS" in plain.str()
    assert "kafka.security_protocol=SASL_PLAINTEXT" in plain.str()
    assert explain(_sasl("SASL_SSL"), VERIFY, Probe(TlsProbe(True, True))) is None


def test_messages_name_the_section_the_settings_come_from() -> None:
    source = SourceClusterConfig(bootstrap_servers="upstream:9092", security_protocol="SASL_PLAINTEXT",
                                 sasl_mechanism="SCRAM-SHA-512", sasl_username="reader", sasl_password="pw")
    found = explain(source, DOWN, Probe(TlsProbe(True, True)))
    assert found is not None and "bridge.source_cluster.security_protocol=SASL_SSL" in found.str()
    on_error = client_settings(source)["error_cb"]
    refused = KafkaError(KafkaError._AUTHENTICATION, "sasl://upstream:9092/1: SASL authentication error: "
                         "Authentication failed during authentication due to invalid credentials")
    with pytest.raises(KafkaException, match=r"user 'reader'.*bridge\.source_cluster\.sasl_password"):
        on_error(refused)


def test_the_inner_callback_is_handed_the_explained_error_before_it_is_raised() -> None:
    seen: list[KafkaError] = []
    cfg = KafkaConfig(bootstrap_servers="127.0.0.1:1", security_protocol="SASL_PLAINTEXT",
                      sasl_mechanism="SCRAM-SHA-512", sasl_username="cam-3", sasl_password="pw")
    on_error = client_settings(cfg, error_cb=seen.append)["error_cb"]
    on_error(DOWN)  # nothing listens on port 1: not explained, handed on as it was
    assert seen == [DOWN]
    with pytest.raises(KafkaException, match="refused to authenticate"):
        on_error(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: Authentication failed"))
    assert seen[-1].fatal() and "refused to authenticate user 'cam-3'" in seen[-1].str()


@pytest.fixture
def plain_listener() -> Iterator[str]:
    """A TCP listener that answers every connection with bytes that are not TLS, then closes it."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"\x00\x00\x00\x04not-tls")
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        server.close()


def test_the_probe_tells_a_closed_port_from_a_listener_that_is_not_tls(plain_listener: str) -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    assert not probe_tls(f"127.0.0.1:{port}", timeout=1.0).answered
    found = probe_tls(plain_listener, timeout=2.0)
    assert found.answered and not found.tls
