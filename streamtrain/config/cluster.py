"""How a client reaches one Kafka cluster: its address and security (`kafka`, and the bridge's source cluster).

`ClusterConfig` is every client setting that is about the cluster rather than about streamtrain's topics, so a
section that points at another cluster (`bridge.source_cluster`) takes exactly these fields and names them under
its own path in every message (`setting`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

__all__ = ["SECURITY_KEYS", "ClusterConfig", "is_secret_key"]

_SECRET_KEYS = ("sasl.password", "ssl.key.password", "ssl.keystore.password", "sasl.oauthbearer.client.secret")

#: librdkafka key of each typed security field of `ClusterConfig` (the field name is the key with _ for . and -).
SECURITY_KEYS: dict[str, str] = {
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_username": "sasl.username",
    "sasl_password": "sasl.password",
    "ssl_ca_location": "ssl.ca.location",
    "ssl_certificate_location": "ssl.certificate.location",
    "ssl_key_location": "ssl.key.location",
    "ssl_key_password": "ssl.key.password",
    "ssl_endpoint_identification_algorithm": "ssl.endpoint.identification.algorithm",
}
_SECRET_FIELDS = ("sasl_password", "ssl_key_password")
_PATH_FIELDS = ("ssl_ca_location", "ssl_certificate_location", "ssl_key_location")


def is_secret_key(key: str) -> bool:
    """Whether a librdkafka setting holds a secret (masked wherever it is shown)."""
    return key in _SECRET_KEYS or "password" in key or "secret" in key


class ClusterConfig(BaseModel):
    """How a client reaches one Kafka cluster: its brokers, security and extra librdkafka settings."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    setting: ClassVar[str] = "kafka"
    """Where the configuration holds this section: messages name its fields under it (`kafka.sasl_password`)."""

    bootstrap_servers: str = "127.0.0.1:9092"
    """Comma-separated host:port list of brokers (`streamtrain broker start` prints one)."""

    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] | None = None
    """How clients talk to the brokers (librdkafka security.protocol); None leaves librdkafka's PLAINTEXT."""

    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI"] | None = None
    """SASL mechanism (sasl.mechanism) when security_protocol is SASL_*; SCRAM-SHA-512 for the embedded broker."""

    sasl_username: str | None = None
    """SASL user name (sasl.username)."""

    sasl_password: SecretStr | None = None
    """SASL password (sasl.password); masked in `config show`, logs, metrics and /status. Prefer the environment
    (STREAMTRAIN_KAFKA__SASL_PASSWORD; the bridge's source cluster STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__SASL_PASSWORD)
    or a TOML file readable only by the service user."""

    ssl_ca_location: Path | None = None
    """PEM file of the CA that signed the brokers' certificates (ssl.ca.location)."""

    ssl_certificate_location: Path | None = None
    """Client certificate (PEM) for mutual TLS (ssl.certificate.location)."""

    ssl_key_location: Path | None = None
    """Client private key (PEM) for mutual TLS (ssl.key.location)."""

    ssl_key_password: SecretStr | None = None
    """Password of the client private key (ssl.key.password); masked like sasl_password."""

    ssl_endpoint_identification_algorithm: Literal["https", "none"] | None = None
    """Check the broker's host name against its certificate (https, librdkafka's default) or not (none)."""

    client: dict[str, str] = Field(default_factory=dict)
    """Extra librdkafka settings for every client, by dotted key (socket.timeout.ms, ...). Secret-looking keys
    (*password*, *secret*) are moved to `client_secrets`, and the security keys above to their typed fields."""

    client_secrets: dict[str, SecretStr] = Field(default_factory=dict)
    """Other secret librdkafka settings (ssl.keystore.password, sasl.oauthbearer.client.secret), always masked."""

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers_are_host_ports(cls, value: str) -> str:
        for server in value.split(","):
            host, sep, port = server.strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{server.strip()!r} is not host:port (port 1-65535)")
        return value

    @model_validator(mode="before")
    @classmethod
    def _lift_client_secrets(cls, data: Any) -> Any:
        """Move secrets given in `client` to masked fields, so no repr or dump of the config shows them."""
        if not isinstance(data, dict) or not isinstance(data.get("client"), dict):
            return data
        data, client = dict(data), dict(data["client"])
        secrets = dict(data.get("client_secrets") or {})
        for key in [k for k in client if is_secret_key(k)]:
            value = client.pop(key)
            typed = next((n for n in _SECRET_FIELDS if SECURITY_KEYS[n] == key), None)
            if typed is not None and data.get(typed) is None:
                data[typed] = value
            else:
                secrets[key] = value
        data["client"], data["client_secrets"] = client, secrets
        return data

    @model_validator(mode="after")
    def _security_is_consistent(self) -> ClusterConfig:
        at = self.setting
        for name, key in SECURITY_KEYS.items():
            if getattr(self, name) is not None and (key in self.client or key in self.client_secrets):
                raise ValueError(f"{key} is set twice, as {at}.{name} and in {at}.client; keep one")
        protocol = self.protocol
        mechanism = self.sasl_mechanism or self.client.get("sasl.mechanism")
        if protocol.upper().startswith("SASL") and mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and (
                not self.username or self.sasl_password is None):
            raise ValueError(f"{at}.sasl_mechanism={mechanism} needs {at}.sasl_username and {at}.sasl_password")
        for name in _PATH_FIELDS:
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{at}.{name}: {path} is not a readable file")
        return self

    @property
    def protocol(self) -> str:
        """The security protocol in force (typed field, else `client`, else librdkafka's PLAINTEXT)."""
        return (self.security_protocol or self.client.get("security.protocol") or "PLAINTEXT").upper()

    @property
    def username(self) -> str | None:
        """The SASL user name in force (typed field, else `client`)."""
        return self.sasl_username or self.client.get("sasl.username")

    def security_settings(self) -> dict[str, str]:
        """The librdkafka security settings in force, secrets revealed: for client factories only, never to print."""
        settings: dict[str, str] = {}
        for name, key in SECURITY_KEYS.items():
            value = getattr(self, name)
            if value is not None:
                settings[key] = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
        settings.update({k: v.get_secret_value() for k, v in self.client_secrets.items()})
        return settings

    def redacted_client(self) -> dict[str, str]:
        """Every extra librdkafka setting clients get (security included), secrets masked: for logs and status."""
        merged = {**self.client, **self.security_settings()}
        secret = {SECURITY_KEYS[n] for n in _SECRET_FIELDS} | set(self.client_secrets)
        return {k: ("***" if k in secret or is_secret_key(k) else v) for k, v in sorted(merged.items())}
