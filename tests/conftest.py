"""Fixtures shared by every suite: a real Kafka broker (never a mock) and configs pointing at it.

`broker` is one embedded KRaft broker for the whole session, or an external one when
STREAMTRAIN_TEST_BOOTSTRAP=host:port is set. `kafka_cfg` gives each test its own topic prefix so
tests never see each other's records. `broker_factory` gives a private broker a test may stop,
kill and restart.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from streamtrain.broker import EmbeddedBroker
from streamtrain.config import BrokerConfig, KafkaConfig, StreamtrainConfig


@dataclass(frozen=True)
class BrokerHandle:
    """The session broker as tests see it."""

    bootstrap: str
    embedded: EmbeddedBroker | None  # None when the tests run against an external broker


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerHandle]:
    external = os.environ.get("STREAMTRAIN_TEST_BOOTSTRAP")
    if external:
        yield BrokerHandle(external, None)
        return
    embedded = EmbeddedBroker(BrokerConfig(data_dir=tmp_path_factory.mktemp("kafka"), heap="1g"))
    bootstrap = embedded.start()
    try:
        yield BrokerHandle(bootstrap, embedded)
    finally:
        embedded.stop()


@pytest.fixture
def kafka_cfg(broker: BrokerHandle) -> KafkaConfig:
    """Kafka settings for the session broker with a topic prefix of this test's own."""
    return KafkaConfig(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:12]}")


@pytest.fixture
def streamtrain_cfg(kafka_cfg: KafkaConfig) -> StreamtrainConfig:
    """A whole configuration around `kafka_cfg`."""
    return StreamtrainConfig(kafka=kafka_cfg)


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Callable[..., EmbeddedBroker]]:
    """Make private brokers (`b = broker_factory(); b.start(); b.kill(); b.start()`); all stopped after the test."""
    made: list[EmbeddedBroker] = []

    def make(**settings: object) -> EmbeddedBroker:
        data_dir = tmp_path / f"broker{len(made)}"
        b = EmbeddedBroker(BrokerConfig.model_validate({"data_dir": data_dir, **settings}))
        made.append(b)
        return b

    yield make
    for b in made:
        b.stop(timeout=30)
