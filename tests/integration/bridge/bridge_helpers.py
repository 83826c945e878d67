"""What the bridge tests share: source topics, a bridge run in-process until it has caught up, and reading the
device and dead-letter topics back by source offset."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from prometheus_client import CollectorRegistry

from streamtrain.bridge.service import Bridge
from streamtrain.config import KafkaConfig, StreamtrainConfig
from streamtrain.decoders import source_of
from streamtrain.kafka import (
    TopicSpec,
    ensure_topics,
    make_admin,
    make_consumer,
    read_to_end,
    topic_metadata,
    watermarks,
)
from streamtrain.report.source_accounting import SourceTally, collect_sources, tally_sources
from streamtrain.wire import DeadLetter, Sample, decode

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"


def create_source(kafka: KafkaConfig, topic: str, partitions: int) -> None:
    ensure_topics(make_admin(kafka), [TopicSpec(topic, partitions)])


def kcat_lines(kafka: KafkaConfig, topic: str, lines: Sequence[tuple[str, str]]) -> None:
    """Write `key<TAB>value` lines with kcat, a C client (librdkafka's default partitioner hashes the key)."""
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed (apt-get install kcat; `make system-deps` does)")
    text = "".join(f"{key}\t{value}\n" for key, value in lines)
    done = subprocess.run([kcat, "-P", "-b", kafka.bootstrap_servers, "-t", topic, "-K", "\t"], input=text,
                          text=True, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def bridge_until_caught_up(cfg: StreamtrainConfig, expected: int, timeout: float = 60.0) -> Bridge:
    """Run a bridge in this process until its committed transactions hold `expected` source records."""
    bridge = Bridge(cfg, CollectorRegistry())
    bridge.start()
    try:
        deadline = time.monotonic() + timeout
        while records_in(bridge) < expected:
            assert time.monotonic() < deadline, f"bridged {records_in(bridge)} of {expected} in {timeout} s"
            bridge.run_once(0.1)
    finally:
        bridge.close()
    kafka = cfg.kafka
    settled([kafka.topics.device(d) for d in cfg.bridge_devices] + [kafka.topics.dead_letter], kafka)
    return bridge


def settled(topics: Sequence[str], kafka: KafkaConfig, timeout: float = 15.0) -> None:
    """Wait until the last transaction's commit markers are written in `topics`: a commit returns once the
    coordinator has decided it, and the markers follow, so for a moment a read_committed reader's end (the last
    stable offset) is behind the records, and a read back from it at once would miss them."""
    committed = make_consumer(kafka, "settled")
    uncommitted = make_consumer(kafka, "settled", **{"isolation.level": "read_uncommitted"})
    try:
        deadline = time.monotonic() + timeout
        for topic in topics:
            for pid in topic_metadata(committed, topic, timeout).partitions:
                tp = TopicPartition(topic, pid)
                while watermarks(committed, tp, timeout)[1] < watermarks(uncommitted, tp, timeout)[1]:
                    assert time.monotonic() < deadline, f"{topic}[{pid}]: a transaction stays open"
                    time.sleep(0.1)
    finally:
        committed.close()
        uncommitted.close()


def records_in(bridge: Bridge) -> int:
    """Source records of committed transactions (the bridge's own counter)."""
    registry = bridge.metrics.registry
    return int(sum(registry.get_sample_value("streamtrain_bridge_records_in_total", {"job": bridge.config.job,
                                                                                      "topic": t}) or 0
                   for t in bridge.decoders))


def bridged(kafka: KafkaConfig, devices: Sequence[str]) -> dict[tuple[str, int, int], list[Sample]]:
    """Every sample of the device topics, by the source record it names (a list: a duplicate would show)."""
    out: dict[tuple[str, int, int], list[Sample]] = {}
    for msg in read_to_end(kafka, [kafka.topics.device(d) for d in devices], timeout=30):
        sample = decode(msg.value(), msg.headers(), Sample)
        where = source_of(sample)
        assert where is not None, sample.metadata
        assert kafka.topics.device(sample.device_id) == msg.topic()
        out.setdefault(where, []).append(sample)
    return out


def dead_letters(kafka: KafkaConfig) -> list[DeadLetter]:
    return [decode(m.value(), m.headers(), DeadLetter) for m in read_to_end(kafka, [kafka.topics.dead_letter], 30)]


def reasons(letters: Sequence[DeadLetter]) -> Counter[str]:
    return Counter(d.reason for d in letters)


def source_tallies(cfg: StreamtrainConfig) -> list[SourceTally]:
    return tally_sources(collect_sources(cfg, timeout=60))
