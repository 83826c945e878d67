"""The Kafka a run uses: an existing broker (with a topic prefix of the run's own), or an embedded one it starts.

`streamtrain up --broker auto` uses the broker at `kafka.bootstrap_servers` when that is set and answers, else
starts an embedded broker whose data lives under the run directory and which ends with `up`; `--secure` always
starts its own, with fresh SCRAM users and ACLs (`stack.secure`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

from confluent_kafka import KafkaException

from streamtrain.broker import BrokerError, EmbeddedBroker
from streamtrain.config import KafkaConfig, StreamtrainConfig

from .options import BrokerMode, StackError
from .secure import Identities, secure_broker_config, set_up_secure_broker

__all__ = ["embedded_broker", "existing_kafka", "start_embedded"]


def _default_bootstrap() -> str:
    return str(KafkaConfig.model_fields["bootstrap_servers"].default)


def existing_kafka(cfg: StreamtrainConfig, mode: BrokerMode, secure: bool, started_at: datetime,
                   say: Callable[[str], None]) -> KafkaConfig | None:
    """The Kafka settings of the configured broker when the run is to use it and it answers, else None.

    The run's topics get a prefix of their own (`<topic_prefix>.up-<date>-<time>`), so a run never reads what an
    earlier one left on a shared broker.

    Raises:
        StackError: `--broker external` and no broker answers, or `--secure` was asked on an external broker.
    """
    configured = cfg.kafka.bootstrap_servers
    if secure and mode == "external":
        raise StackError("--secure runs its own embedded broker (with fresh users and ACLs); on another cluster "
                         "set up users and ACLs with `streamtrain acl apply` and give each service its role")
    if secure or mode == "embedded" or (mode == "auto" and configured == _default_bootstrap()):
        return None
    if EmbeddedBroker.answers(configured, timeout=5.0, settings=cfg.kafka.security_settings()):
        prefix = f"{cfg.kafka.topic_prefix}.up-{started_at.strftime('%Y%m%d-%H%M%S')}"
        kafka = cfg.kafka.model_copy(update={"topic_prefix": prefix})
        say(f"using the Kafka broker at {configured} (kafka.bootstrap_servers), topics {prefix}.*")
        return kafka
    if mode == "external":
        raise StackError(f"no Kafka broker answers at {configured} (kafka.bootstrap_servers)")
    say(f"no Kafka broker answers at {configured} (kafka.bootstrap_servers): starting an embedded one")
    return None


def embedded_broker(cfg: StreamtrainConfig, out: Path, identities: Identities | None, port: int = 0) -> EmbeddedBroker:
    """The run's own broker (not started): data under `out/kafka`, client `port` (0: a free one), a free controller
    port, SCRAM and ACLs with `identities`."""
    broker_cfg = cfg.broker.model_copy(update={"data_dir": out / "kafka", "port": port, "controller_port": 0})
    if identities is not None:
        broker_cfg = secure_broker_config(broker_cfg, identities)
    return EmbeddedBroker(broker_cfg, die_with_parent=True)  # the run's own: it ends with `up`


def start_embedded(broker: EmbeddedBroker, cfg: StreamtrainConfig, devices: Sequence[str],
                   identities: Identities | None, say: Callable[[str], None]) -> KafkaConfig:
    """Start `broker` (and, with `identities`, create its users, ACLs and topics); returns the run's Kafka settings.

    Raises:
        StackError: the broker did not start, or its users and ACLs could not be set up.
    """
    began = time.monotonic()
    try:
        bootstrap = broker.start()
    except BrokerError as exc:
        raise StackError(f"the embedded Kafka broker did not start: {exc}") from None
    kafka = cfg.kafka.model_copy(update={"bootstrap_servers": bootstrap})
    if identities is not None:
        try:
            set_up_secure_broker(broker, cfg.model_copy(update={"kafka": kafka}), devices)
        except (KafkaException, ValueError) as exc:
            raise StackError(f"could not set up the secure broker's ACLs and topics: {exc}") from None
        kafka = identities.kafka(kafka, identities.admin)  # the run is read back as admin
        users = ", ".join(sorted(identities.passwords))
        say(f"security: SASL/SCRAM with ACLs, each service as its own principal ({users})")
    say(f"embedded Kafka broker on {bootstrap} after {time.monotonic() - began:.1f} s "
        f"(data in {broker.cfg.data_dir})")
    return kafka
