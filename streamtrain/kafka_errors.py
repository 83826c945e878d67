"""What a Kafka client's failure to connect means, told in words that name the setting to fix.

librdkafka retries a login the broker refuses, a certificate it cannot verify and a listener that speaks another
protocol than the client's, for good, and tells the application little more than "1/1 brokers are down": a
client pointed at a TLS listener without TLS looks exactly like one whose broker is unreachable. `guard` wraps
every client's error callback (`streamtrain.kafka.client_settings`) and turns each such misconfiguration into a
fatal `KafkaError` whose text says what is wrong and which settings to change (under the section the client's
settings come from: `kafka.*`, or `bridge.source_cluster.*`). It raises from the client's next
poll/flush/consume; an inner callback is handed the explained error first.

What cannot be told from librdkafka's words is found out with a short TLS handshake of our own to the listener
(`probe_tls`), at most every `PROBE_EVERY_S` per address, never when the address does not answer at all: a
broker that is down or restarting is retried as before, only a listener that answers in the wrong way stops the
client.
"""

from __future__ import annotations

import re
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException

from .authz import REFUSED_CODES, raise_if_refused
from .config import ClusterConfig

__all__ = ["PROBE_EVERY_S", "TlsProbe", "auth_failure_message", "explain", "guard", "probe_tls"]

#: Shortest time between two probes of one address by one client.
PROBE_EVERY_S = 30.0
#: Longest a probe waits for a connection and a handshake.
PROBE_TIMEOUT_S = 2.0

# librdkafka's address in its error texts: "sasl_ssl://localhost:9094/bootstrap: ..." or "host:9092/1: ...".
_ADDRESS = re.compile(r"(?:\b[a-z_]+://)?(\[[^\]]+\]:\d+|[A-Za-z0-9_.-]+:\d+)/")
_VERIFY_HOST = (62, 64)  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH


def guard(cfg: ClusterConfig, inner: Callable[[KafkaError], None] | None) -> Callable[[KafkaError], None]:
    """An error callback that stops the client when `explain` finds a setting at fault (see the module docstring).

    The exception surfaces from the client's next poll/flush/consume (confluent-kafka re-raises callback errors).
    """
    probes = _Probes()

    def on_error(err: KafkaError) -> None:
        explained = explain(cfg, err, probes.probe)
        if inner is not None:
            inner(explained or err)
        if explained is not None:
            raise KafkaException(explained)
        if err.fatal() and err.code() in REFUSED_CODES:
            # The one fatal refusal: an idempotent producer's InitProducerId, allowed by WRITE on any topic.
            raise_if_refused(cfg, err, "IDEMPOTENT_WRITE (implied by WRITE on a topic)")
    return on_error


@dataclass(frozen=True)
class TlsProbe:
    """What a TLS handshake of our own with a listener found."""

    answered: bool
    """A TCP connection was made (False: the listener is down or unreachable; nothing can be told)."""
    tls: bool = False
    """It speaks TLS (the handshake went through, or failed only at verifying the certificate)."""
    verify_code: int | None = None
    """OpenSSL's verification error when the certificate was refused (62/64: it does not name the host)."""
    detail: str = ""


def probe_tls(address: str, ca_file: str | None = None, verify: bool = False, check_host: bool = True,
              timeout: float = PROBE_TIMEOUT_S) -> TlsProbe:
    """Try a TLS handshake with `address` (host:port): with `verify`, trusting `ca_file` (else the system's CAs)
    and, with `check_host`, requiring the certificate to name the host."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if verify:
        context = ssl.create_default_context(cafile=ca_file)
        context.check_hostname = check_host
    else:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except (OSError, ValueError) as exc:
        return TlsProbe(False, detail=str(exc))
    try:
        with context.wrap_socket(sock, server_hostname=host):
            return TlsProbe(True, True)
    except ssl.SSLCertVerificationError as exc:
        return TlsProbe(True, True, exc.verify_code, exc.verify_message or str(exc))
    except (OSError, ValueError) as exc:  # SSLError, a reset or EOF: the listener did not answer in TLS
        return TlsProbe(True, False, detail=str(exc))
    finally:
        sock.close()


Prober = Callable[..., TlsProbe]


def explain(cfg: ClusterConfig, err: KafkaError, probe: Prober = probe_tls) -> KafkaError | None:
    """The fatal error, naming the settings to fix, that `err` is when a setting is at fault; None when it is not
    (or cannot be told: the broker does not answer at all)."""
    code = err.code()
    if code == KafkaError._AUTHENTICATION and not _lost_mid_handshake(err):
        return KafkaError(KafkaError._AUTHENTICATION, auth_failure_message(cfg, err.str()), fatal=True)
    tls_client = cfg.protocol.endswith("SSL")
    if code in (KafkaError._SSL, KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT) and tls_client:
        return _tls_refused(cfg, err, probe)
    if code in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._TIMED_OUT) and not tls_client:
        if code == KafkaError._TIMED_OUT and "apiversion" not in err.str().lower():
            return None
        for address in _addresses(cfg, err):
            if probe(address).tls:
                return KafkaError(KafkaError._TRANSPORT, _tls_listener_message(cfg, address), fatal=True)
    return None


def auth_failure_message(cfg: ClusterConfig, detail: str) -> str:
    """What to tell someone whose credentials the broker refused (names the settings, never the password)."""
    at = cfg.setting
    who = cfg.username or f"(no {at}.sasl_username)"
    how = cfg.sasl_mechanism or cfg.client.get("sasl.mechanism") or f"(no {at}.sasl_mechanism)"
    return (f"Kafka at {cfg.bootstrap_servers} refused to authenticate user {who!r} with {how}: {detail}. "
            f"Check {at}.sasl_username, {at}.sasl_password and {at}.sasl_mechanism "
            f"(and {at}.security_protocol / {at}.ssl_* for TLS)")


def _lost_mid_handshake(err: KafkaError) -> bool:
    """An _AUTHENTICATION error that is the connection lost during the SASL handshake (a busy or restarting
    broker, retried by librdkafka itself), not a refused login."""
    return any(w in err.str() for w in ("Local: Broker transport failure", "Local: Timed out", "Disconnected"))


def _addresses(cfg: ClusterConfig, err: KafkaError) -> list[str]:
    """The listener an error names, else the bootstrap servers (an "all brokers down" error names none)."""
    named = _ADDRESS.search(err.str())
    if named is not None:
        return [named.group(1)]
    return [s.strip() for s in cfg.bootstrap_servers.split(",") if s.strip()]


def _tls_listener_message(cfg: ClusterConfig, address: str) -> str:
    at, protocol = cfg.setting, cfg.protocol
    wanted = "SASL_SSL" if protocol.startswith("SASL") else "SSL (SASL_SSL, with the sasl_* settings, when it asks " \
        "for a user)"
    return (f"Kafka at {cfg.bootstrap_servers}: the listener at {address} speaks TLS and this client does not "
            f"({at}.security_protocol={protocol}). Set {at}.security_protocol={wanted} and {at}.ssl_ca_location to the "
            "PEM file of the CA that signed the broker's certificate (for the compose stack's external listener: "
            "deploy/tls/certs/ca.crt)")


def _tls_refused(cfg: ClusterConfig, err: KafkaError, probe: Prober) -> KafkaError | None:
    """A TLS handshake librdkafka gave up: told apart by one of our own, with the client's CA and host check."""
    at = cfg.setting
    settings = {**cfg.client, **cfg.security_settings()}
    ca_file = settings.get("ssl.ca.location")
    check_host = settings.get("ssl.endpoint.identification.algorithm", "https") != "none"
    for address in _addresses(cfg, err):
        found = probe(address, ca_file, verify=True, check_host=check_host)
        if not found.answered:
            continue
        host = address.rpartition(":")[0].strip("[]")
        if not found.tls:
            text = (f"Kafka at {cfg.bootstrap_servers}: the listener at {address} does not speak TLS, and this "
                    f"client does ({at}.security_protocol={cfg.protocol}): use the listener's TLS port, or set "
                    f"{at}.security_protocol={cfg.protocol.replace('SSL', 'PLAINTEXT')} if it is a plain one")
        elif found.verify_code in _VERIFY_HOST:
            text = (f"Kafka at {cfg.bootstrap_servers}: the certificate of the broker at {address} does not name "
                    f"the host {host} ({found.detail}): reach it by a name its certificate holds (the one the "
                    f"listener advertises), give the broker a certificate for {host}, or, for a trial only, set "
                    f"{at}.ssl_endpoint_identification_algorithm=none")
        elif found.verify_code is not None:
            trusted = f"{at}.ssl_ca_location={ca_file}" if ca_file else f"no {at}.ssl_ca_location: the system's CAs"
            text = (f"Kafka at {cfg.bootstrap_servers}: the certificate of the broker at {address} is not signed "
                    f"by a CA this client trusts ({trusted}; {found.detail}): set {at}.ssl_ca_location to the PEM "
                    "file of the CA that signed it")
        else:
            continue  # our handshake went through: not a setting we can name (librdkafka retries)
        return KafkaError(KafkaError._SSL, f"{text}. librdkafka: {err.str()}", fatal=True)
    return None


class _Probes:
    """One client's probes, each address at most every `PROBE_EVERY_S` (an error callback may fire often)."""

    def __init__(self) -> None:
        self._last: dict[tuple[object, ...], tuple[float, TlsProbe]] = {}
        self._lock = threading.Lock()

    def probe(self, address: str, ca_file: str | None = None, verify: bool = False,
              check_host: bool = True) -> TlsProbe:
        key = (address, ca_file, verify, check_host)
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
        if last is not None and now - last[0] < PROBE_EVERY_S:
            return last[1]
        found = probe_tls(address, ca_file, verify, check_host)
        with self._lock:
            self._last[key] = (now, found)
        return found
