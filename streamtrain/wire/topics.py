"""Topic names: the one place that knows how streamtrain names its Kafka topics."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["TopicNames", "validate_name_part"]

_LEGAL = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
_MAX_TOPIC = 249  # Kafka's limit on topic name length


def validate_name_part(what: str, value: str) -> str:
    """Return `value` if it can be part of a topic name, else raise ValueError naming `what`."""
    if not value or not _LEGAL.match(value):
        raise ValueError(f"{what} {value!r} must be letters, digits, '_', '-' and single dots")
    return value


@dataclass(frozen=True)
class TopicNames:
    """Topic names under one prefix: `<prefix>.device.<id>`, `.feedback`, `.assignments`, `.dead-letter`,
    `.evaluations`, `.models`, `.requests`, `.predictions`."""

    prefix: str = "streamtrain"

    def __post_init__(self) -> None:
        validate_name_part("topic prefix", self.prefix)

    def device(self, device_id: str) -> str:
        """The topic of one device's sample stream."""
        validate_name_part("device id", device_id)
        return _within_limit(f"{self.prefix}.device.{device_id}")

    def device_of(self, topic: str) -> str | None:
        """The device id of a device topic under this prefix, or None for any other topic."""
        return _after(f"{self.prefix}.device.", topic)

    def bridge_offsets(self, source_topic: str) -> str:
        """The empty topic under which a bridge reading another cluster keeps its progress in `source_topic`: its
        group's committed offset of partition p is the next offset of the source's partition p (a broker keeps
        offsets only of topics it holds)."""
        return _within_limit(f"{self.prefix}.bridge-offsets.{source_topic}")

    def bridge_source_of(self, topic: str) -> str | None:
        """The source topic a `bridge_offsets` topic keeps the progress of, or None for any other topic."""
        return _after(f"{self.prefix}.bridge-offsets.", topic)

    @property
    def feedback(self) -> str:
        return f"{self.prefix}.feedback"

    @property
    def assignments(self) -> str:
        return f"{self.prefix}.assignments"

    @property
    def dead_letter(self) -> str:
        return f"{self.prefix}.dead-letter"

    @property
    def evaluations(self) -> str:
        """Held-out evaluations (rank 0 writes one every `trainer.eval_every` steps)."""
        return f"{self.prefix}.evaluations"

    @property
    def models(self) -> str:
        """Model versions as they are published (rank 0 announces each one, `ModelVersion`)."""
        return f"{self.prefix}.models"

    @property
    def requests(self) -> str:
        """Samples to predict, on the same wire as the device topics (`serve` reads them)."""
        return f"{self.prefix}.requests"

    @property
    def predictions(self) -> str:
        """`serve`'s answers, one `Prediction` per request, naming the version that made it."""
        return f"{self.prefix}.predictions"


def _within_limit(name: str) -> str:
    if len(name) > _MAX_TOPIC:
        raise ValueError(f"topic {name[:40]}... is longer than Kafka's {_MAX_TOPIC} characters")
    return name


def _after(head: str, topic: str) -> str | None:
    """What follows `head` in `topic`, or None when it does not start with it (or nothing follows)."""
    return topic[len(head):] if topic.startswith(head) and len(topic) > len(head) else None
