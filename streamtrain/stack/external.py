"""`streamtrain up --external-devices`: devices the user feeds, with the stack running everything else.

For an external device `up` runs no producer. It creates the device's topic, writes what a client needs
to publish to it in `<out>/external/device-<id>.env` (the broker's address and the topic prefix as
`STREAMTRAIN_KAFKA__*` variables, which `streamtrain.DeviceProducer` reads; on a `--secure` run also the
device's own principal and password, so the file is readable by its owner only), and prints where to
publish. The trainers, the coordinator, the live view and the report treat the device like any other:
its records are accounted by their offsets, whoever wrote them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from streamtrain.config import BrokerConfig, KafkaConfig
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin
from streamtrain.net import is_free

from .secure import Identities

__all__ = ["KAFKA_PORT", "ExternalDevice", "broker_port", "open_external_devices", "parse_external",
           "publish_instructions"]

#: Kafka's usual client port: where `DeviceProducer` and most clients look first (kafka.bootstrap_servers' default).
KAFKA_PORT = 9092


@dataclass(frozen=True)
class ExternalDevice:
    """A device fed from outside, and where to publish its samples."""

    device: str
    topic: str
    env_file: Path
    """`STREAMTRAIN_KAFKA__*` settings that point a client at this run (`set -a; . FILE; set +a`)."""


def parse_external(text: str | None, devices: Sequence[str]) -> tuple[str, ...]:
    """The devices `--external-devices` names: comma-separated ids of the run's devices, or `all`.

    Raises:
        ValueError: an id that is not one of the run's devices, or nothing named.
    """
    if text is None:
        return ()
    if text.strip().lower() == "all":
        return tuple(devices)
    named = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [d for d in named if d not in devices]
    if not named or unknown:
        raise ValueError(f"--external-devices {text!r}: name devices of this run ({', '.join(devices)}) or 'all'"
                         + (f"; not one of them: {', '.join(unknown)}" if unknown else ""))
    return tuple(d for d in devices if d in named)  # in rank order, each once


def broker_port(cfg: BrokerConfig, external: bool = True) -> int:
    """The client port of the run's embedded broker.

    `broker.port` when set, always (a port the user chose is where their clients look); else, when devices are
    fed from outside (`external`), Kafka's usual 9092 when it is free, so a client with default settings finds
    the run; else 0 (any free port, printed when the broker starts).
    """
    if cfg.port:
        return cfg.port
    return KAFKA_PORT if external and is_free(cfg.host, KAFKA_PORT) else 0


def open_external_devices(kafka: KafkaConfig, devices: Sequence[str], out: Path,
                          identities: Identities | None) -> list[ExternalDevice]:
    """Create the devices' topics (existing ones are left alone) and write each one's settings file.

    Args:
        kafka: the run's Kafka settings (with permission to create topics: the admin role on a secure run).
        devices: the external devices.
        out: the run directory.
        identities: the role principals of a secure run (each device publishes as its own producer principal).

    Raises:
        KafkaException: the topics could not be created.
    """
    topics = kafka.topics
    ensure_topics(make_admin(kafka), [TopicSpec.from_config(kafka, topics.device(d)) for d in devices])
    folder = out / "external"
    folder.mkdir(parents=True, exist_ok=True)
    opened = []
    for device in devices:
        settings = {"STREAMTRAIN_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
                    "STREAMTRAIN_KAFKA__TOPIC_PREFIX": kafka.topic_prefix}
        if identities is not None:
            settings |= identities.env(identities.producers[device])
        path = folder / f"device-{device}.env"
        # Created owner-only before anything is written: on a secure run it holds the device's password.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(f"# How device {device} publishes to this run of streamtrain up: `set -a; . {path}; set +a`,\n"
                       "# then streamtrain.DeviceProducer(device=...) needs no other argument.\n")
            file.writelines(f"{key}={value}\n" for key, value in settings.items())
        opened.append(ExternalDevice(device, topics.device(device), path))
    return opened


def publish_instructions(kafka: KafkaConfig, opened: Sequence[ExternalDevice], ending: str,
                         secure: bool) -> list[str]:
    """What `up` prints for a person whose application feeds the external devices.

    Args:
        kafka: the run's Kafka settings.
        opened: the external devices.
        ending: when the run ends, in words.
        secure: whether clients must log in (then only the settings files hold what they need).
    """
    names = ", ".join(d.device for d in opened)
    lines = [f"external devices {names}: no producer of ours; publish to Kafka at {kafka.bootstrap_servers}, "
             f"topics {', '.join(d.topic for d in opened)}"]
    first = opened[0]
    if not secure and kafka.topic_prefix == KafkaConfig.model_fields["topic_prefix"].default:
        lines.append(f'  from Python: DeviceProducer("{kafka.bootstrap_servers}", device="{first.device}")')
    lines.append(f"  settings for any client (address, topic prefix{', login' if secure else ''}): {first.env_file}"
                 + (" and beside it" if len(opened) > 1 else "")
                 + f" — `set -a; . {first.env_file}; set +a`, then DeviceProducer(device=\"{first.device}\")")
    lines.append(f"  {ending}; then the trainers get up to --drain-timeout seconds to work off what is in Kafka, "
                 "and what is sent after that stays there, reported as pending")
    return lines
