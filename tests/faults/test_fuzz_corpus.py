"""Bad input on the real broker: 10,000+ broken records into a device topic while a real trainer rank runs,
bad and forged assignments to the trainers and bad and forged feedback to the coordinator. Every bad record is
dead-lettered with its reason and counted in metrics, nothing crashes, and the good records in between are still
trained.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer
from feedback_records import step_feedback
from fuzzing import (
    FuzzRecord,
    assignment_corpus,
    device_corpus,
    feedback_corpus,
    forged_feedback,
    forged_plans,
    good_sample,
    reason_counts,
)
from prometheus_client.parser import text_string_to_metric_families

from streamtrain.config import CoordinatorConfig, KafkaConfig, MetricsConfig, StreamtrainConfig
from streamtrain.coordinator.service import Coordinator
from streamtrain.dead_letters import REASON_HEADER
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin, make_producer, read_to_end
from streamtrain.runtime.commands import CLI_MODULE, module_command
from streamtrain.wire import DeadLetter, decode, encode
from streamtrain.wire.codec import header_value

pytestmark = pytest.mark.faults

JOB = "fuzz"
BAD = 10_200
GOOD_EVERY = 20  # one good sample after every 20 bad records
BUFFER_BYTES = 64 * 1024


def _write(producer: Producer, topic: str, records: list[tuple[bytes | None, list]]) -> None:
    """Write in order (one idempotent producer, one partition: offset = position in the topic)."""
    for value, headers in records:
        while True:
            try:
                producer.produce(topic, value=value, headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(60) == 0


def _dead_letters(kafka: KafkaConfig) -> list[DeadLetter]:
    out = []
    for msg in read_to_end(kafka, [kafka.topics.dead_letter], timeout=60):
        letter = decode(msg.value(), msg.headers(), DeadLetter)
        assert header_value(msg.headers(), REASON_HEADER) == letter.reason.encode()
        out.append(letter)
    return out


def _scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_trainer_rank_dead_letters_every_bad_record_and_keeps_training(kafka_cfg: KafkaConfig,
                                                                       tmp_path: Path) -> None:
    t = kafka_cfg.topics
    ensure_topics(make_admin(kafka_cfg), [TopicSpec.from_config(kafka_cfg, n) for n in (
        t.device("d0"), t.feedback, t.assignments, t.dead_letter)])
    sets = {
        "job": JOB, "kafka.bootstrap_servers": kafka_cfg.bootstrap_servers,
        "kafka.topic_prefix": kafka_cfg.topic_prefix,
        "trainer.device": "cpu", "trainer.torch_threads": 1, "trainer.hidden_size": 8, "trainer.num_layers": 1,
        "trainer.local_batch": 64, "trainer.data_wait_seconds": 0.2, "trainer.log_every": 1000,
        "trainer.buffer_max_bytes": BUFFER_BYTES, "trainer.checkpoint_dir": str(tmp_path / "ckpt"),
        "metrics.port": 0,
    }
    cmd = module_command(CLI_MODULE, "train", "--local-ranks", "1", "--devices", "d0", "--plan-wait", "0.2", sets=sets)
    log = tmp_path / "train.log"
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    bad = list(device_corpus(BAD, "d0", seed=11, oversize_bytes=BUFFER_BYTES))
    # Undecodable plans, and plans that decode but no coordinator makes (NaN weights, a billion steps ahead, ...).
    plans = list(assignment_corpus(350, JOB, seed=12)) + list(forged_plans(140, JOB, ("d0",)))
    try:
        deadline = time.monotonic() + 60
        while not re.search(r"consuming \S+ from offset", log.read_text()):  # assigned: plans now count
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.2)
        port = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", log.read_text())
        assert port, log.read_text()[-4000:]
        url = f"http://127.0.0.1:{port.group(1)}/metrics"

        records: list[tuple[bytes | None, list]] = []
        expected: dict[int, str] = {}
        good = 0
        for i, record in enumerate(bad):
            if i % GOOD_EVERY == 0:
                records.append(encode(good_sample("d0", good)))
                good += 1
            expected[len(records)] = record.reason
            records.append((record.value, record.headers))
        producer = make_producer(kafka_cfg)
        _write(producer, t.assignments, [(r.value, r.headers) for r in plans])
        _write(producer, t.device("d0"), records)

        metrics: dict[str, float] = {}
        while time.monotonic() < deadline + 60:
            assert proc.poll() is None, log.read_text()[-4000:]  # no crash
            metrics = _scrape(url)
            if (metrics.get("streamtrain_trainer_dead_lettered_records_total", 0) >= BAD + len(plans)
                    and metrics.get("streamtrain_trainer_samples_total", 0) >= good):
                break
            time.sleep(0.5)
        assert metrics["streamtrain_trainer_dead_lettered_records_total"] == BAD + len(plans)
        assert metrics["streamtrain_trainer_samples_total"] >= good  # every good sample trained
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

    letters = _dead_letters(kafka_cfg)
    on_device = {dl.offset: dl.reason for dl in letters if dl.topic == t.device("d0")}
    assert on_device == expected  # each bad record, once, with its own reason; no good one
    assert Counter(on_device.values()) == reason_counts(bad)
    assert len(reason_counts(bad)) == 9 and len({r.kind for r in bad}) == 22
    on_plans = Counter(dl.reason for dl in letters if dl.topic == t.assignments)
    assert on_plans == reason_counts(plans)
    assert all(dl.service == "trainer" for dl in letters)
    # Trained means committed past: the rank's group has everything up to the end of the topic behind it.
    fb = step_feedback(read_to_end(kafka_cfg, [t.feedback], timeout=30))
    assert sum(f.samples for f in fb) >= good
    assert max(f.lowest_unprocessed_offset for f in fb) == len(records)


def test_coordinator_dead_letters_bad_feedback_by_reason(kafka_cfg: KafkaConfig) -> None:
    cfg = StreamtrainConfig(job=JOB, kafka=kafka_cfg, metrics=MetricsConfig(port=0), coordinator=CoordinatorConfig(
        poll_interval_seconds=0.2, kafka_timeout_seconds=15.0))
    service = Coordinator(cfg, serve_http=False)
    service.start()
    bad: list[FuzzRecord] = list(feedback_corpus(1_400, JOB, seed=5)) + list(forged_feedback(450, JOB))
    try:
        producer = make_producer(kafka_cfg)
        _write(producer, kafka_cfg.topics.feedback, [(r.value, r.headers) for r in bad])
        registry = service.metrics.registry
        want = reason_counts(bad)

        def counted() -> Counter[str]:
            return Counter({r: int(registry.get_sample_value("streamtrain_coordinator_dead_lettered_records_total",
                                                             {"job": JOB, "reason": r}) or 0) for r in want})

        deadline = time.monotonic() + 45
        while counted() != want and time.monotonic() < deadline:
            service.run_once(0.2)  # no crash: each bad record is handled inside the loop
        assert counted() == want
    finally:
        service.close()
    letters = _dead_letters(kafka_cfg)
    assert Counter(dl.reason for dl in letters) == want
    assert {dl.offset for dl in letters} == set(range(len(bad))) and {dl.service for dl in letters} == {"coordinator"}
