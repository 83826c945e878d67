"""`streamtrain up --secure`: the local stack on a broker with SASL/SCRAM and ACLs, one principal per role.

The embedded broker is formatted with a SCRAM user for every role principal (fresh random passwords,
known only to this run), starts with Kafka's authorizer on, and gets each role's least-privilege
ACLs (`streamtrain.acl`) and the job's topics from its own super user, the one identity that may grant
them. Each service then runs as its role: the producer of device d as `acl.producer` for d, the
trainer ranks as `acl.trainer`, the coordinator as `acl.coordinator`, and `up` itself (backlog aside,
which each device's producer writes) reads the run back as `acl.admin`. Credentials reach a child
through its environment, which only the same user can read, never through its command line.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import SecretStr

from streamtrain.acl import apply_acls, create_topics
from streamtrain.broker import EmbeddedBroker
from streamtrain.config import BrokerConfig, KafkaConfig, StreamtrainConfig
from streamtrain.kafka import make_admin

__all__ = ["Identities", "secure_broker_config", "set_up_secure_broker"]

logger = logging.getLogger(__name__)

_MECHANISM = "SCRAM-SHA-512"


@dataclass(frozen=True)
class Identities:
    """The role principals of one secure run and their generated SCRAM passwords."""

    admin: str
    coordinator: str
    trainer: str
    producers: dict[str, str]
    """Device -> its producer's principal."""
    passwords: dict[str, str]
    """User -> password (held in this process and given to children through their environment only)."""

    @classmethod
    def generate(cls, cfg: StreamtrainConfig, devices: Sequence[str]) -> Identities:
        """Fresh passwords for every role principal of `cfg.acl` over `devices`."""
        roles = cfg.acl
        producers = {d: roles.producer_of(d) for d in devices}
        users = {roles.admin, roles.coordinator, roles.trainer, *producers.values()}
        return cls(roles.admin, roles.coordinator, roles.trainer, producers,
                   {u: secrets.token_urlsafe(24) for u in sorted(users)})

    def kafka(self, base: KafkaConfig, user: str) -> KafkaConfig:
        """`base` logged in as `user`."""
        return KafkaConfig.model_validate({
            **base.model_dump(exclude={"sasl_password"}), "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": _MECHANISM, "sasl_username": user, "sasl_password": self.passwords[user]})

    def producer_kafka(self, base: KafkaConfig, device: str) -> KafkaConfig:
        """`base` logged in as `device`'s producer."""
        return self.kafka(base, self.producers[device])

    def env(self, user: str) -> dict[str, str]:
        """The environment variables that make a streamtrain service log in as `user`."""
        return {"STREAMTRAIN_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "STREAMTRAIN_KAFKA__SASL_MECHANISM": _MECHANISM,
                "STREAMTRAIN_KAFKA__SASL_USERNAME": user,
                "STREAMTRAIN_KAFKA__SASL_PASSWORD": self.passwords[user]}


def secure_broker_config(base: BrokerConfig, identities: Identities) -> BrokerConfig:
    """`base` with a SASL/SCRAM listener, the authorizer on, and a user for every role principal."""
    return base.model_copy(update={
        "security_protocol": "SASL_PLAINTEXT", "acls": True,
        "scram_users": {u: SecretStr(pw) for u, pw in identities.passwords.items()}})


def set_up_secure_broker(broker: EmbeddedBroker, cfg: StreamtrainConfig, devices: Sequence[str],
                         timeout: float = 60.0) -> None:
    """Give the roles their ACLs and create the job's topics, as the broker's own super user.

    Raises:
        KafkaException: when the broker refuses or does not answer.
    """
    admin = make_admin(broker.own_identity(cfg.kafka))
    plan = apply_acls(admin, cfg, devices, timeout=timeout)
    created = create_topics(admin, cfg, devices, timeout=timeout)
    logger.info("secure stack: %d ACLs for %d principals, topics %s", len(plan.create) + len(plan.present),
                len({a.principal for a in plan.create + plan.present}), ", ".join(created) or "already there")
