"""SCRAM users of the embedded broker: created when the storage is formatted, upserted at later starts.

KRaft keeps SCRAM credentials in the metadata log, so the users a SASL listener needs from its very
first start (the broker's own inter-broker user among them) are written by `kafka-storage format
--add-scram`. They are given in salted form (RFC 5802: PBKDF2 of the password), so no password
ever appears on a command line, where any local user could read it in /proc.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)

__all__ = [
    "BROKER_USER",
    "CONTROLLER_USER",
    "ITERATIONS",
    "MECHANISMS",
    "add_scram_args",
    "broker_secret",
    "jaas_config",
    "plain_jaas_config",
    "salted_password",
    "upsert_users",
]

logger = logging.getLogger(__name__)

#: The broker's own user, for its inter-broker connections to its SASL listener.
BROKER_USER = "streamtrain-broker"
#: The controller's own user on its PLAIN-authenticated listener (the broker's connections to its controller).
CONTROLLER_USER = "streamtrain-controller"
#: Both SCRAM mechanisms get a credential for every user, so clients may use either.
MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
#: PBKDF2 iterations (Kafka's minimum and default).
ITERATIONS = 4096
_SECRET_FILE = "broker-secret"


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int = ITERATIONS) -> bytes:
    """SCRAM's SaltedPassword: PBKDF2-HMAC over the password with the mechanism's hash."""
    digest = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
    return hashlib.pbkdf2_hmac(digest, password.encode(), salt, iterations)


def add_scram_args(users: Mapping[str, str], mechanisms: tuple[str, ...] = MECHANISMS) -> list[str]:
    """`--add-scram` arguments creating every user with every mechanism, in salted form."""
    args = []
    for name, password in users.items():
        for mechanism in mechanisms:
            salt = os.urandom(16)
            salted = salted_password(mechanism, password, salt)
            args += ["--add-scram", f"{mechanism}=[name={name},iterations={ITERATIONS},"
                                    f'salt="{base64.b64encode(salt).decode()}",'
                                    f'saltedpassword="{base64.b64encode(salted).decode()}"]']
    return args


def broker_secret(data_dir: Path, create: bool) -> str | None:
    """The password of `BROKER_USER`, kept in `<data_dir>/broker-secret` (mode 0600); made when `create`."""
    path = data_dir / _SECRET_FILE
    if path.exists():
        return path.read_text().strip()
    if not create:
        return None
    secret = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secret)
    return secret


def jaas_config(user: str, password: str) -> str:
    """A `sasl.jaas.config` value for the SCRAM login module."""
    return f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{user}" password="{password}";'


def plain_jaas_config(user: str, password: str) -> str:
    """A `sasl.jaas.config` value for a PLAIN listener whose only user is `user` (it logs in as that user too)."""
    return (f'org.apache.kafka.common.security.plain.PlainLoginModule required username="{user}" '
            f'password="{password}" user_{user}="{password}";')


def upsert_users(admin: AdminClient, users: Mapping[str, str], timeout: float = 30.0) -> None:
    """Create or update users (every mechanism) on a running broker, e.g. ones added after the format.

    Raises:
        confluent_kafka.KafkaException: when the broker refuses.
    """
    if not users:
        return
    for mechanism in MECHANISMS:  # one request per mechanism: a request may alter each user only once
        info = ScramCredentialInfo(getattr(ScramMechanism, mechanism.replace("-", "_")), ITERATIONS)
        alterations: list[UserScramCredentialAlteration] = [
            UserScramCredentialUpsertion(name, info, password.encode()) for name, password in users.items()]
        for name, future in admin.alter_user_scram_credentials(alterations, request_timeout=timeout).items():
            future.result(timeout=timeout)
            logger.debug("%s credential of %s upserted", mechanism, name)
