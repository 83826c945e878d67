"""Devices streamtrain did not write, trained on the real broker with every record accounted: the Java example
(Apache Avro's single-object encoder, Kafka's Java client), kcat sending the docs' test vector byte for byte,
and an older streamtrain's records in the previous layout (bare body + `st-schema`) beside new ones."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from docs_vector import docs_test_vector  # tests/docs_vector.py: the vector as docs/guides/wire-format.md gives it
from outside_devices import assert_all_trained, create_device_topics, train_outside_devices

from streamtrain.config import KafkaConfig
from streamtrain.kafka import java_client_properties, make_producer, produce, read_to_end
from streamtrain.wire import SCHEMA_HEADER, Sample, decode, encode
from streamtrain.wire.legacy import encode_previous

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
JAVA_DEVICE_JAR = REPO / "examples" / "java-device" / "target" / "streamtrain-java-device.jar"


def test_the_java_device_s_samples_are_trained_and_accounted(kafka_cfg: KafkaConfig, tmp_path: Path) -> None:
    if not JAVA_DEVICE_JAR.exists():
        pytest.skip(f"{JAVA_DEVICE_JAR.relative_to(REPO)} is not built: `make setup` builds it "
                    "(mvn -q -B -f examples/java-device/pom.xml package)")
    count = 40
    create_device_topics(kafka_cfg, ["java"])
    # The broker's connection and security settings as Kafka's Java clients take them.
    props = tmp_path / "producer.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in java_client_properties(kafka_cfg).items()))
    props.chmod(0o600)
    sent = subprocess.run(
        ["java", "-jar", str(JAVA_DEVICE_JAR), "--producer.config", str(props), "--prefix", kafka_cfg.topic_prefix,
         "--device", "java", "--count", str(count), "--rows", "6", "--features", "16", "--classes", "4"],
        capture_output=True, text=True, timeout=120)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert f"sent {count} samples (seq 0..{count - 1}, 6 x 16 float32)" in sent.stdout

    # Java's bytes as streamtrain reads them: single-object encoded, the current Sample's fingerprint.
    records = list(read_to_end(kafka_cfg, [kafka_cfg.topics.device("java")]))
    samples = [decode(m.value(), m.headers(), Sample, device="java") for m in records]
    assert [s.seq for s in samples] == list(range(count))
    assert all(s.shape == (6, 16) and s.label == s.seq % 4 and s.metadata == {"source": "java-device"}
               for s in samples)
    assert all(m.value()[:2] == b"\xc3\x01" and SCHEMA_HEADER not in dict(m.headers() or []) for m in records)

    fates = train_outside_devices(kafka_cfg, tmp_path, {"java": count}, features=16)
    assert_all_trained(fates, {"java": count})


def test_kcat_sends_the_docs_test_vector_and_it_is_trained(kafka_cfg: KafkaConfig, tmp_path: Path) -> None:
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    if kcat is None:
        pytest.skip("kcat is not installed (`make system-deps` installs it from Debian: apt-get install kcat)")
    value, headers = docs_test_vector()
    create_device_topics(kafka_cfg, ["0"])
    record = tmp_path / "sample.bin"
    record.write_bytes(value)
    config = tmp_path / "kcat.conf"  # the connection's security settings, as librdkafka properties
    config.write_text("".join(f"{k}={v}\n" for k, v in kafka_cfg.security_settings().items()))
    sent = subprocess.run(
        [kcat, "-P", "-b", kafka_cfg.bootstrap_servers, "-F", str(config), "-t", kafka_cfg.topics.device("0"),
         *(arg for name, v in headers for arg in ("-H", f"{name}={v.decode()}")),
         "-X", "enable.idempotence=true", "-X", "acks=all", str(record)],
        capture_output=True, text=True, timeout=60)
    assert sent.returncode == 0, sent.stderr

    [msg] = read_to_end(kafka_cfg, [kafka_cfg.topics.device("0")])
    assert msg.value() == value and msg.headers() == headers
    assert decode(msg.value(), msg.headers(), Sample, device="0") == Sample.from_array(
        "0", 7, np.arange(6, dtype=np.float32).reshape(3, 2), label=1, produced_at=1_700_000_000_000)

    fates = train_outside_devices(kafka_cfg, tmp_path, {"0": 1}, features=2)
    assert_all_trained(fates, {"0": 1})


def test_records_of_the_previous_layout_are_still_trained_beside_new_ones(
        kafka_cfg: KafkaConfig, tmp_path: Path) -> None:
    # As a topic looks across the upgrade: an older streamtrain wrote Sample v1 then v2 in the previous layout (bare
    # body, fingerprint hex in st-schema), then the upgraded producer goes on in the single-object encoding.
    old_v1, old_v2, new = 15, 15, 15
    create_device_topics(kafka_cfg, ["old"])
    rng = np.random.default_rng(3)
    producer = make_producer(kafka_cfg)
    for seq in range(old_v1 + old_v2 + new):
        sample = Sample.from_array("old", seq, rng.standard_normal((5, 8)).astype(np.float32), label=seq % 4)
        if seq < old_v1 + old_v2:
            produce(producer, kafka_cfg.topics.device("old"), *encode_previous(sample, 1 if seq < old_v1 else 2))
        else:
            produce(producer, kafka_cfg.topics.device("old"), *encode(sample))
    assert producer.flush(30) == 0
    topic = [kafka_cfg.topics.device("old")]
    layouts = [SCHEMA_HEADER in dict(m.headers() or []) for m in read_to_end(kafka_cfg, topic)]
    assert layouts == [True] * (old_v1 + old_v2) + [False] * new

    written = {"old": old_v1 + old_v2 + new}
    fates = train_outside_devices(kafka_cfg, tmp_path, written, features=8)
    assert_all_trained(fates, written)
