"""Refusals by Kafka's authorizer, told in words: who was refused what on which resource.

The broker answers an unauthorised request with a bare error code (TOPIC_AUTHORIZATION_FAILED, ...),
and librdkafka turns some into timeouts or retries. Every client path that can be refused (a
produce's delivery report, a consumer's error event, an admin request) passes the error through
`refusal`, so what reaches the log or the exception names the principal, the resource and the
permission it lacks, and says how to grant it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from .config import ClusterConfig

__all__ = [
    "REFUSED_CODES",
    "AuthorizationError",
    "DeliveryCallback",
    "GuardedProducer",
    "principal_of",
    "raise_if_refused",
    "refusal",
]

logger = logging.getLogger(__name__)

#: What confluent-kafka calls with each produced record's delivery report.
DeliveryCallback = Callable[[KafkaError | None, Message], None]

#: Kafka error code -> the kind of resource the refused permission is on.
REFUSED_CODES: dict[int, str] = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "group",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional id",
}


class AuthorizationError(KafkaException):
    """Kafka's authorizer refused a request; `str()` names the principal, the resource and the permission.

    A `KafkaException` (its `args[0]` is a `KafkaError` with the original code and this message), so code that
    handles Kafka errors handles it too.
    """

    def __init__(self, error: KafkaError, message: str) -> None:
        super().__init__(KafkaError(error.code(), message, fatal=True))
        self.message = message

    def __str__(self) -> str:
        return self.message


def principal_of(cfg: ClusterConfig | None) -> str:
    """The principal a client of `cfg` authenticates as, as the broker's ACLs name it."""
    if cfg is None:
        return "this client's principal"
    user = cfg.sasl_username or cfg.client.get("sasl.username")
    if user:
        return f"User:{user}"
    if cfg.ssl_certificate_location:
        return f"the certificate principal of {cfg.ssl_certificate_location}"
    return f"User:ANONYMOUS (no {cfg.setting}.sasl_username)"


def refusal(cfg: ClusterConfig | None, error: KafkaError | None, operation: str, resource: str | None = None,
            kind: str | None = None) -> AuthorizationError | None:
    """The `AuthorizationError` for `error` when it is an authorizer's refusal, else None.

    Args:
        cfg: the client's settings (for its principal), None when unknown.
        error: what the client reported.
        operation: the permission the request needed (READ, WRITE, DESCRIBE, CREATE, DELETE, ...).
        resource: the topic or group the request was about, when known.
        kind: its resource kind; default the one the error code names.
    """
    if error is None or error.code() not in REFUSED_CODES:
        return None
    kind = kind or REFUSED_CODES[error.code()]
    what = f"{kind} {resource}" if resource else f"the {kind}"
    where = f"Kafka at {cfg.bootstrap_servers}" if cfg is not None else "Kafka"
    message = (f"{where} refused {principal_of(cfg)} {operation} on {what} "
               f"({error.name()}): that principal has no ACL allowing it. `streamtrain acl show` lists the ACLs of "
               "every streamtrain role and `streamtrain acl apply` creates them; check "
               f"{cfg.setting if cfg is not None else 'kafka'}.sasl_username is "
               "the role this service runs as")
    return AuthorizationError(error, message)


def raise_if_refused(cfg: ClusterConfig | None, error: KafkaError | None, operation: str, resource: str | None = None,
                     kind: str | None = None) -> None:
    """Raise `refusal(...)` when `error` is an authorizer's refusal; otherwise do nothing."""
    refused = refusal(cfg, error, operation, resource, kind)
    if refused is not None:
        raise refused


class GuardedProducer(Producer):
    """A producer whose refused writes raise `AuthorizationError` (from the next poll or flush).

    librdkafka reports a write to a topic the principal may not write as a failed delivery, which a
    service would count and carry on from, sample after sample. A refusal is a deployment error, not a
    lost record: it stops the service with a message saying which ACL is missing. The caller's own
    delivery callback still sees every report first.

    Args:
        cfg: the client's settings (for its principal in messages).
        settings: librdkafka settings (`streamtrain.kafka.client_settings`).
    """

    def __init__(self, cfg: ClusterConfig, settings: dict[str, object]) -> None:
        super().__init__(settings)
        self.kafka = cfg

    def produce(self, topic: str, value: str | bytes | None = None, key: str | bytes | None = None,
                partition: int = -1, callback: DeliveryCallback | None = None,
                on_delivery: DeliveryCallback | None = None, timestamp: int = 0,
                headers: Any = None) -> None:
        """`Producer.produce`, with the delivery report checked for a refusal first."""
        super().produce(topic, value, key, partition, on_delivery=self._guard(on_delivery or callback),
                        timestamp=timestamp, headers=headers)

    def _guard(self, inner: DeliveryCallback | None) -> DeliveryCallback:
        cfg = self.kafka

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if inner is not None:
                inner(err, msg)
            refused = refusal(cfg, err, "WRITE", msg.topic())
            if refused is not None:
                logger.error("%s", refused)
                raise refused
        return on_delivery
