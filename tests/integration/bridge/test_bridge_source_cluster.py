"""The bridge reading another cluster (`bridge.source_cluster`), on two real brokers: the source records are on
broker B (SCRAM, its authorizer on, the bridge's user allowed READ on the source topic and nothing else), the
stack's topics on the session broker A. Every source record becomes exactly one Sample (or dead letter) in A; the
bridge's progress is kept in A, in the same transactions, so a bridge SIGKILLed mid-stream and restarted neither
loses nor duplicates a record; and a setting of the source cluster that cannot work stops it at start, naming it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from bridge_helpers import bridge_until_caught_up, bridged, dead_letters, reasons, settled, source_tallies
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
from prometheus_client import CollectorRegistry

from streamtrain.bridge.checks import check_sources
from streamtrain.bridge.errors import BridgeSetupError
from streamtrain.bridge.progress import BridgeProgress
from streamtrain.bridge.service import Bridge
from streamtrain.broker import EmbeddedBroker
from streamtrain.config import BrokerConfig, KafkaConfig, StreamtrainConfig
from streamtrain.decoders import build_decoder
from streamtrain.kafka import (
    TopicSpec,
    committed_offsets,
    ensure_topics,
    list_topics,
    make_admin,
    make_consumer,
    make_producer,
    make_transactional_producer,
)

pytestmark = pytest.mark.integration

DEVICES = ("0", "1", "2")
READER, READER_PW = "bridge-reader", "reader-Secret-1"
MAPPING = {"data": "values", "shape": [-1, 4], "label": "label"}


@pytest.fixture(scope="module")
def source_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """Broker B: another cluster, SCRAM logins and its own authorizer (nobody may do what no ACL allows)."""
    broker = EmbeddedBroker(BrokerConfig(data_dir=tmp_path_factory.mktemp("source-kafka"), heap="512m",
                                         security_protocol="SASL_PLAINTEXT", scram_users={READER: READER_PW}))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def _source(broker: EmbeddedBroker, password: str = READER_PW) -> dict[str, str]:
    return {"bootstrap_servers": broker.bootstrap, "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": READER, "sasl_password": password}


def _make_source_topic(broker: EmbeddedBroker, topic: str, count: int, partitions: int = 3) -> KafkaConfig:
    """`topic` on B with `count` JSON lines keyed by device (every 50th one not decodable), READ on it granted to
    the bridge's user and nothing else; returns the super user's settings on B."""
    owner = broker.own_identity(KafkaConfig())
    admin = make_admin(owner)
    ensure_topics(admin, [TopicSpec(topic, partitions)])
    binding = AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, f"User:{READER}", "*",
                         AclOperation.READ, AclPermissionType.ALLOW)
    for future in admin.create_acls([binding]).values():
        future.result(30)
    _produce(owner, topic, range(count))
    return owner


def _produce(owner: KafkaConfig, topic: str, numbers: range, rate: float | None = None) -> None:
    producer = make_producer(owner)
    began = time.monotonic()
    for i in numbers:
        value = "{broken" if i % 50 == 49 else json.dumps({"values": [i / 10.0] * (4 * (1 + i % 3)), "label": i % 4})
        producer.produce(topic, key=DEVICES[i % len(DEVICES)].encode(), value=value.encode())
        if rate is not None:
            producer.poll(0)
            time.sleep(max(0.0, began + (i - numbers.start + 1) / rate - time.monotonic()))
    assert producer.flush(30) == 0


def _config(kafka: KafkaConfig, broker: EmbeddedBroker, topic: str, password: str = READER_PW,
            **bridge: object) -> StreamtrainConfig:
    return StreamtrainConfig.model_validate({
        "job": kafka.topic_prefix, "kafka": kafka.model_dump(),
        "bridge": {"sources": [{"topic": topic, "decoder": "json", "mapping": MAPPING}], "devices": DEVICES,
                   "source_cluster": _source(broker, password), "metrics": False, "transaction_seconds": 0.2,
                   **bridge}})


def _good(count: int) -> int:
    return sum(1 for i in range(count) if i % 50 != 49)


def test_records_of_another_cluster_are_bridged_once_each_with_the_progress_kept_on_the_stacks(
        kafka_cfg: KafkaConfig, source_broker: EmbeddedBroker) -> None:
    topic, count = f"{kafka_cfg.topic_prefix}-remote", 300
    _make_source_topic(source_broker, topic, count)
    cfg = _config(kafka_cfg, source_broker, topic)
    bridge_until_caught_up(cfg, count)

    samples = bridged(kafka_cfg, DEVICES)
    assert len(samples) == _good(count) and all(len(s) == 1 for s in samples.values())
    assert {where[0] for where in samples} == {topic}
    assert reasons(dead_letters(kafka_cfg)) == {"json-invalid": count - _good(count)}
    tallies = source_tallies(cfg)  # the sources read on B, the samples and the group's offsets on A
    assert sum(t.fates.records for t in tallies) == count
    assert all(t.exact and t.fates.complete and not t.fates.pending for t in tallies), [t.summary() for t in tallies]

    # The stack's cluster holds no copy of the source topic: the group's offsets are its twin's, partition for
    # partition, at the source partitions' ends.
    twin = kafka_cfg.topics.bridge_offsets(topic)
    on_a = list_topics(make_admin(kafka_cfg), 30).topics
    assert topic not in on_a and len(on_a[twin].partitions) == 3
    reader = make_consumer(KafkaConfig.model_validate(_source(source_broker)), "unused")
    member = make_consumer(kafka_cfg, cfg.bridge.group(cfg.job))
    try:
        ends = [reader.get_watermark_offsets(TopicPartition(topic, p), 30)[1] for p in range(3)]
        offsets = committed_offsets(member, [TopicPartition(twin, p) for p in range(3)], 30)
        # (an empty partition is never committed, as on one cluster)
        assert [max(tp.offset, 0) for tp in offsets] == ends and sum(ends) == count
    finally:
        reader.close()
        member.close()


def _bridge_process(cfg: StreamtrainConfig, log: Path) -> subprocess.Popen[bytes]:
    """`python -m streamtrain.bridge bridge` configured through the environment, as Compose configures it."""
    source = cfg.bridge.source_cluster
    assert source is not None and source.sasl_password is not None
    env = {**os.environ, "STREAMTRAIN_JOB": cfg.job,
           "STREAMTRAIN_KAFKA__BOOTSTRAP_SERVERS": cfg.kafka.bootstrap_servers,
           "STREAMTRAIN_KAFKA__TOPIC_PREFIX": cfg.kafka.topic_prefix,
           "STREAMTRAIN_BRIDGE__SOURCES": json.dumps([s.model_dump() for s in cfg.bridge.sources]),
           "STREAMTRAIN_BRIDGE__DEVICES": ",".join(DEVICES),
           "STREAMTRAIN_BRIDGE__TRANSACTION_RECORDS": "50",
           "STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__BOOTSTRAP_SERVERS": source.bootstrap_servers,
           "STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
           "STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__SASL_MECHANISM": "SCRAM-SHA-512",
           "STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__SASL_USERNAME": READER,
           "STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__SASL_PASSWORD": source.sasl_password.get_secret_value(),
           "STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__SSL_CA_LOCATION": ""}  # empty: unset, as Compose's ${VAR:-} gives
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "streamtrain.bridge", "bridge", "--port", "0"], env=env,
                                stdout=out, stderr=subprocess.STDOUT)


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.2)


def test_a_bridge_sigkilled_mid_stream_resumes_from_the_stacks_cluster_without_loss_or_duplicates(
        kafka_cfg: KafkaConfig, source_broker: EmbeddedBroker, tmp_path: Path) -> None:
    topic, first, count = f"{kafka_cfg.topic_prefix}-killed", 100, 600
    owner = _make_source_topic(source_broker, topic, first)
    cfg = _config(kafka_cfg, source_broker, topic)
    log = tmp_path / "bridge.log"
    bridge = _bridge_process(cfg, log)
    writer = threading.Thread(target=_produce, args=(owner, topic, range(first, count), 100.0), daemon=True)
    try:
        _wait_for(log, "into the topics of", bridge, 120)
        writer.start()
        deadline = time.monotonic() + 60
        while sum(len(s) for s in bridged(kafka_cfg, DEVICES).values()) < 150:  # committed transactions seen
            assert time.monotonic() < deadline and bridge.poll() is None, log.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        assert writer.is_alive()  # mid-stream
        bridge.send_signal(signal.SIGKILL)  # its open transaction is left to the next start to abort
        bridge.wait(30)
        bridge = _bridge_process(cfg, log)
        writer.join(60)
        deadline = time.monotonic() + 120
        while True:  # (read while the bridge commits: a record may show as lost until its transaction's markers)
            tallies = source_tallies(cfg)
            if sum(t.fates.records for t in tallies) == count and all(t.exact and t.fates.complete
                                                                     and not t.fates.pending for t in tallies):
                break
            assert time.monotonic() < deadline and bridge.poll() is None, [t.summary() for t in tallies]
            time.sleep(1.0)
    finally:
        bridge.send_signal(signal.SIGTERM)
        bridge.wait(60)
    assert log.read_text(errors="replace").count("into the topics of") == 2  # it did start again
    settled([kafka_cfg.topics.device(d) for d in DEVICES] + [kafka_cfg.topics.dead_letter], kafka_cfg)
    samples = bridged(kafka_cfg, DEVICES)  # read_committed: what the trainers would be given
    assert sum(len(s) for s in samples.values()) == len(samples) == _good(count)
    assert reasons(dead_letters(kafka_cfg)) == {"json-invalid": count - _good(count)}


def test_the_start_check_does_not_wait_behind_an_open_transaction_holding_the_groups_offsets(
        kafka_cfg: KafkaConfig, source_broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture) -> None:
    """A bridge killed mid-transaction leaves the group's offset commit open, and a read of the offsets waits until
    the next bridge fences it (after its start-up check) or the broker aborts it: the check must not wait that
    long. Here the open transaction outlives the check by far (transaction timeout 120 s)."""
    topic = f"{kafka_cfg.topic_prefix}-open"
    _make_source_topic(source_broker, topic, 60)
    cfg = _config(kafka_cfg, source_broker, topic)
    progress = BridgeProgress(cfg)
    progress.ensure_twins({topic: 3})
    member = make_consumer(kafka_cfg, cfg.bridge.group(cfg.job))
    dead = make_transactional_producer(kafka_cfg, f"{kafka_cfg.topic_prefix}.killed-bridge", 120.0)
    dead.init_transactions(30)
    dead.begin_transaction()
    dead.send_offsets_to_transaction(progress.tracked([TopicPartition(topic, p, 5) for p in range(3)]),
                                     member.consumer_group_metadata(), 30)
    try:
        decoders = {s.topic: build_decoder(s, f"bridge.sources.{i}") for i, s in enumerate(cfg.bridge.sources)}
        began = time.monotonic()
        with caplog.at_level("WARNING"):
            checks = check_sources(cfg, decoders, DEVICES)
        waited = time.monotonic() - began
        assert f"the group's committed offsets of {topic} could not be read in time" in caplog.text
        # Tried on the log's first records instead: 20 of them, the one broken line among them dead-lettered later.
        assert checks[0].records == 20 and checks[0].samples == 20, checks
        assert waited < 60, waited  # COMMITTED_WAIT_S and the peek; before, it waited for the transaction timeout
    finally:
        dead.abort_transaction(30)
        member.close()


def test_a_wrong_source_password_stops_the_bridge_at_start_naming_the_source_clusters_settings(
        kafka_cfg: KafkaConfig, source_broker: EmbeddedBroker) -> None:
    topic = f"{kafka_cfg.topic_prefix}-locked"
    _make_source_topic(source_broker, topic, 5)
    began = time.monotonic()
    text = _refused_at_start(_config(kafka_cfg, source_broker, topic, password="not-the-Password-1"))
    assert time.monotonic() - began < 20  # the refusal ends it, not a timeout
    assert f"refused to authenticate user '{READER}'" in text and "bridge.source_cluster.sasl_password" in text, text
    assert source_broker.bootstrap in text and "not-the-Password-1" not in text
    assert "kafka.sasl_password" not in text  # the stack's own login is not the one at fault


def test_a_source_topic_absent_or_a_source_cluster_that_does_not_answer_is_named_at_start(
        kafka_cfg: KafkaConfig, source_broker: EmbeddedBroker) -> None:
    topic = f"{kafka_cfg.topic_prefix}-only-on-a"
    ensure_topics(make_admin(kafka_cfg), [TopicSpec(topic, 1)])  # on the stack's cluster, not the source's
    absent = _refused_at_start(_config(kafka_cfg, source_broker, topic))
    assert absent.startswith(f"bridge.sources.0.topic: topic {topic} is not on the source cluster "
                             f"(bridge.source_cluster.bootstrap_servers={source_broker.bootstrap})"), absent

    nowhere = _config(kafka_cfg, source_broker, topic, check_seconds=1.0).model_dump()
    nowhere["bridge"]["source_cluster"] = {"bootstrap_servers": "127.0.0.1:1"}
    unanswered = _refused_at_start(StreamtrainConfig.model_validate(nowhere))
    assert unanswered.startswith("bridge.source_cluster.bootstrap_servers: no broker of the source cluster "
                                 "(bridge.source_cluster.bootstrap_servers=127.0.0.1:1) answered"), unanswered


def _refused_at_start(cfg: StreamtrainConfig) -> str:
    """The message of the `BridgeSetupError` a bridge of `cfg` stops with at start."""
    bridge = Bridge(cfg, CollectorRegistry())
    try:
        with pytest.raises(BridgeSetupError) as refused:
            bridge.start()
    finally:
        bridge.close(commit=False)
    return str(refused.value)
