"""A pre-produced backlog: a fixed set of samples per device, in Kafka before any trainer starts.

Benchmarks that compare planning policies want step times to reflect the plan, not how fast samples
arrive: with a backlog every rank always has more than it can train, and every run of the same seed
sees exactly the same samples (each device's stream is drawn from its own seeded generator, with the
settings its live producer would use, `stack.services.stream_settings`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from streamtrain.config import KafkaConfig, ProducerConfig
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin
from streamtrain.producers.service import ProducerError, StreamProducer

from .services import DeviceStream, stream_settings

__all__ = ["backlog_config", "produce_backlog"]


def _set_dotted(tree: dict[str, Any], dotted: str, value: object) -> None:
    keys = dotted.split(".")
    for key in keys[:-1]:
        tree = tree.setdefault(key, {})
    tree[keys[-1]] = value


def backlog_config(base: ProducerConfig, stream: DeviceStream, index: int, seed: int, samples: int) -> ProducerConfig:
    """The producer settings that publish `samples` of one device's stream as fast as the broker takes them."""
    tree = base.model_dump()
    for key, value in stream_settings(stream, index, seed).items():
        _set_dotted(tree, key.removeprefix("producer."), value)
    tree["rate"] = {**tree["rate"], "kind": "unlimited", "preset": None, "rates": None, "schedule": [],
                    "bursts": None, "trace": None}
    tree.update(max_samples=samples, duration_seconds=None, metrics=False, metrics_port=None)
    return ProducerConfig.model_validate(tree)


def produce_backlog(kafka: KafkaConfig, base: ProducerConfig, streams: Sequence[DeviceStream], seed: int,
                    samples: int, kafka_for: Callable[[str], KafkaConfig] | None = None) -> float:
    """Publish `samples` samples of every stream (creating the device topics); returns the seconds it took.

    Args:
        kafka: Kafka settings (topics are created with them).
        base: producer settings the streams' own are applied on.
        streams: the device streams.
        seed: seed of the first stream (each next one adds one).
        samples: samples per device.
        kafka_for: the settings device d's samples are written with (its producer's principal under ACLs);
            default `kafka`.

    Raises:
        ProducerError: when a sample cannot be delivered or the producer fails.
    """
    began = time.monotonic()
    # Every device topic in one request (one at a time costs most of a second each on a fresh broker).
    ensure_topics(make_admin(kafka), [TopicSpec.from_config(kafka, kafka.topics.device(s.device_id)) for s in streams])
    for index, stream in enumerate(streams):
        settings = backlog_config(base, stream, index, seed, samples).model_copy(update={"create_topics": False})
        producer = StreamProducer(kafka_for(stream.device_id) if kafka_for else kafka, settings)
        summary = producer.run()
        if not summary.ok or int(producer.sent.sum()) != samples:
            raise ProducerError(f"backlog of device {stream.device_id}: {int(producer.sent.sum())} of {samples} "
                                f"samples delivered ({int(summary.final.failed.sum())} failed)")
    return time.monotonic() - began
