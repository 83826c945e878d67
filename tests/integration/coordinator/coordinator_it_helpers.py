"""What the coordinator's integration tests share: the trainers' side, the plans' reader, small probes."""

from __future__ import annotations

import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from streamtrain.config import CoordinatorConfig, KafkaConfig, MetricsConfig, StreamtrainConfig
from streamtrain.coordinator.service import Coordinator
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin, make_consumer, make_producer
from streamtrain.wire import Assignment, PendingSample, Sample, StepFeedback, decode, encode

JOB = "itjob"


def config(kafka_cfg: KafkaConfig, **coordinator: object) -> StreamtrainConfig:
    settings = {"feedback_wait_seconds": 5.0, "poll_interval_seconds": 0.2, "kafka_timeout_seconds": 15.0,
                **coordinator}
    return StreamtrainConfig(job=JOB, kafka=kafka_cfg, metrics=MetricsConfig(bind_address="127.0.0.1", port=0),
                             coordinator=CoordinatorConfig.model_validate(settings))


def produce_samples(kafka_cfg: KafkaConfig, counts: dict[str, int]) -> dict[str, list[int]]:
    """`counts[d]` samples to each device topic; returns each sample's size by offset."""
    ensure_topics(make_admin(kafka_cfg), [TopicSpec.from_config(kafka_cfg, kafka_cfg.topics.device(d)) for d in counts])
    rng = np.random.default_rng(1)
    producer = make_producer(kafka_cfg)
    sizes = {}
    for device, n in counts.items():
        sizes[device] = [int(s) for s in rng.integers(5, 40, n)]
        for seq, size in enumerate(sizes[device]):
            value, headers = encode(Sample.from_array(device, seq, np.zeros((size, 2), np.float32)))
            producer.produce(kafka_cfg.topics.device(device), value=value, headers=headers)
    assert producer.flush(30) == 0
    return sizes


class Trainers:
    """The trainers' side: feedback records and offset commits under `<job>.trainers`."""

    def __init__(self, kafka_cfg: KafkaConfig) -> None:
        self.cfg = kafka_cfg
        self.producer: Producer = make_producer(kafka_cfg)
        self.committer: Consumer = make_consumer(kafka_cfg, f"{JOB}.trainers")

    def report(self, step: int, device: str, rank: int, new: list[tuple[int, int]], lowest: int, depth: int,
               plan_step: int | None = None, seconds: float = 0.2) -> None:
        fb = StepFeedback(job=JOB, step=step, device_id=device, rank=rank,
                          plan_step=step if plan_step is None else plan_step, samples=8, total_size=160,
                          compute_seconds=seconds, data_wait_seconds=0.0, comm_seconds=0.01, step_seconds=seconds,
                          memory_bytes=1 << 20, lowest_unprocessed_offset=lowest, buffer_depth=depth,
                          new_samples=tuple(PendingSample(o, s) for o, s in new))
        value, headers = encode(fb)
        self.producer.produce(self.cfg.topics.feedback, value=value, headers=headers)
        assert self.producer.flush(10) == 0

    def commit(self, device: str, offset: int) -> None:
        self.committer.commit(offsets=[TopicPartition(self.cfg.topics.device(device), 0, offset)],
                              asynchronous=False)

    def close(self) -> None:
        self.producer.flush(10)
        self.committer.close()


class Plans:
    """Reads Assignments from the assignments topic."""

    def __init__(self, kafka_cfg: KafkaConfig) -> None:
        self.consumer = make_consumer(kafka_cfg, f"plans-{uuid.uuid4().hex[:6]}")
        self.consumer.assign([TopicPartition(kafka_cfg.topics.assignments, 0, OFFSET_BEGINNING)])
        self.seen: dict[int, Assignment] = {}

    def wait(self, step: int, timeout: float = 20.0) -> Assignment:
        deadline = time.monotonic() + timeout
        while step not in self.seen:
            assert time.monotonic() < deadline, f"no plan for step {step}; saw steps {sorted(self.seen)}"
            msg = self.consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            plan = decode(msg.value(), msg.headers(), Assignment)
            assert plan.step not in self.seen, f"step {plan.step} planned twice"
            self.seen[plan.step] = plan
        return self.seen[step]

    def close(self) -> None:
        self.consumer.close()


def get(port: int | None, path: str) -> tuple[str, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        return resp.headers.get("Content-Type", ""), resp.read()


def low_watermark(kafka_cfg: KafkaConfig, topic: str) -> int:
    c = make_consumer(kafka_cfg, f"wm-{uuid.uuid4().hex[:6]}")
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[0])
    finally:
        c.close()


@contextmanager
def running(cfg: StreamtrainConfig) -> Iterator[Coordinator]:
    """The coordinator service in a thread of its own, started (ready) and, on the way out, stopped."""
    service = Coordinator(cfg)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            service.run()
        except BaseException as exc:  # handed to the test, which fails with it
            errors.append(exc)

    thread = threading.Thread(target=run, name="coordinator-under-test")
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not service.ready.wait(0.2):
            assert not errors, f"coordinator failed to start: {errors[0]!r}"
            assert time.monotonic() < deadline, "coordinator did not start in 30 s"
        yield service
    finally:
        service.stop()
        thread.join(30)
        assert not thread.is_alive()
    assert not errors, f"coordinator failed: {errors[0]!r}"
