"""The errors a `DeviceProducer` raises once a sample passed its checks: nothing it accepted is lost silently."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["DeliveryError", "DeviceProducerError", "QueueFullError"]


class DeviceProducerError(RuntimeError):
    """The producer cannot go on, or could not do what was asked (the base of its other errors)."""


class DeliveryError(DeviceProducerError):
    """Samples the producer accepted could not be delivered to Kafka (raised by `flush` and `close`).

    Attributes:
        device: the device whose samples failed.
        topic: the topic they were for.
        failed: how many samples failed since the last `DeliveryError` of this producer.
        reasons: librdkafka's error text -> how many of those samples failed with it.
    """

    def __init__(self, device: str, topic: str, reasons: Mapping[str, int]) -> None:
        self.device = device
        self.topic = topic
        self.reasons = dict(reasons)
        self.failed = sum(self.reasons.values())
        why = "; ".join(f"{n} x {reason}" for reason, n in sorted(self.reasons.items(), key=lambda kv: -kv[1]))
        super().__init__(f"{self.failed} sample(s) of device {device!r} could not be delivered to {topic}: {why}")


class QueueFullError(DeviceProducerError):
    """The local queue stayed full for longer than `queue_wait_seconds`: the sample was not queued.

    Kafka takes records more slowly than they are sent (or is unreachable). Nothing of this sample was
    queued or numbered: send it again later, send less, or allow a longer wait.
    """
