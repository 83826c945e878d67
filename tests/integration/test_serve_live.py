"""`serve` during a live training run on the real broker: versions published and switched, the gate and the
bad-input rules obeyed, and every request answered exactly once (counted by offset)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from streamtrain.config import KafkaConfig, ServeConfig, TrainerConfig
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin, make_producer, read_to_end
from streamtrain.models import build_model
from streamtrain.runtime.commands import CLI_MODULE, module_command
from streamtrain.serve.gate import judge
from streamtrain.synthetic import synthetic_samples
from streamtrain.versions import spec_for, write_version
from streamtrain.wire import ModelVersion, Prediction, Sample, decode, encode

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOB = "served"
DEVICES = ("d0", "d1")
MODEL = {"trainer.num_features": 4, "trainer.num_classes": 3, "trainer.hidden_size": 16, "trainer.num_layers": 1}
GATE = ServeConfig(tolerance=0.05, min_samples=20)


def _common(kafka: KafkaConfig, tmp: Path) -> dict[str, object]:
    return {"job": JOB, "kafka.bootstrap_servers": kafka.bootstrap_servers, "kafka.topic_prefix": kafka.topic_prefix,
            "versions.dir": str(tmp / "versions"), "trainer.eval_path": str(tmp / "held-out.npz"), "metrics.port": 0,
            "serve.tolerance": GATE.tolerance, "serve.min_samples": GATE.min_samples, **MODEL}


def _spawn(tmp: Path, name: str, module: str, *argv: str, sets: dict[str, object]) -> subprocess.Popen[bytes]:
    log = (tmp / f"{name}.log").open("wb")
    return subprocess.Popen(module_command(module, *argv, sets=sets), stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _stream(kafka: KafkaConfig, stop: threading.Event) -> None:
    """Each device's synthetic stream, 40 samples/s, until `stop`."""
    producer = make_producer(kafka)
    seq = 0
    while not stop.is_set():
        for device in DEVICES:
            for sample in synthetic_samples([6, 11], 4, 3, seed=seq, signal=1.5, device_id=device, first_seq=seq):
                value, headers = encode(sample)
                producer.produce(kafka.topics.device(device), value=value, headers=headers)
        seq += 2
        producer.poll(0)
        time.sleep(0.05)
    producer.flush(30)


def _announce(kafka: KafkaConfig, record: ModelVersion) -> None:
    producer = make_producer(kafka)
    value, headers = encode(record)
    producer.produce(kafka.topics.models, value=value, headers=headers)
    assert producer.flush(30) == 0


def _bad_versions(kafka: KafkaConfig, tmp: Path) -> set[int]:
    """A version the gate must refuse, one whose files are gone and one that does not fit serve's settings."""
    cfg = TrainerConfig(**{k.split(".")[1]: v for k, v in MODEL.items()})
    worse = write_version(tmp / "versions", spec_for(cfg, job=JOB, version=1000, step=1, class_names=None, offsets={},
                                                    metrics={"heldout_accuracy": -1.0, "prequential_accuracy": -1.0}),
                          build_model(cfg).state_dict())
    wide = cfg.model_copy(update={"num_features": 5})
    misfit = write_version(tmp / "elsewhere", spec_for(wide, job=JOB, version=1002, step=1, class_names=None,
                                                       offsets={}, metrics={}), build_model(wide).state_dict())
    for number, where in ((1000, worse), (1001, tmp / "versions" / "v001001"), (1002, misfit)):
        _announce(kafka, ModelVersion(job=JOB, version=number, step=1, location=str(where), metrics={}))
    return {1000, 1001, 1002}


def _wait_for_versions(kafka: KafkaConfig, count: int, trainers: subprocess.Popen[bytes],
                       timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and trainers.poll() is None:
        if len(list(read_to_end(kafka, [kafka.topics.models]))) >= count:
            return
        time.sleep(1)
    raise AssertionError(f"the trainers announced fewer than {count} versions in {timeout:.0f} s "
                         f"(exit status {trainers.poll()})")


def _send_requests(kafka: KafkaConfig, count: int) -> dict[int, str | None]:
    """`count` requests at ~25/s, a corrupt one and one of the wrong shape among them; offset -> expected error."""
    producer = make_producer(kafka)
    samples = synthetic_samples([5 + i % 17 for i in range(count)], 4, 3, seed=77, signal=1.5, device_id="client")
    expected: dict[int, str | None] = {}
    for i, sample in enumerate(samples):
        if i == 7:
            producer.produce(kafka.topics.requests, value=b"\x00not avro")
            expected[i] = "corrupt"  # neither the single-object marker nor a schema header
        elif i == 11:
            value, headers = encode(Sample.from_array("client", i, np.zeros((6, 2), np.float32)))
            producer.produce(kafka.topics.requests, value=value, headers=headers)
            expected[i] = "wrong-shape"
        else:
            value, headers = encode(sample)
            producer.produce(kafka.topics.requests, value=value, headers=headers)
            expected[i] = None
        producer.flush(10)
        time.sleep(0.04)
    return expected


def test_serve_switches_versions_obeys_the_gate_and_answers_each_request_once(kafka_cfg: KafkaConfig,
                                                                               tmp_path: Path) -> None:
    held_out = synthetic_samples([4 + i % 20 for i in range(120)], 4, 3, seed=5, signal=1.5)
    np.savez(tmp_path / "held-out.npz", x=np.concatenate([s.array() for s in held_out]),
             sizes=np.array([s.size for s in held_out]), y=np.array([s.label for s in held_out]))
    names = [*(kafka_cfg.topics.device(d) for d in DEVICES), kafka_cfg.topics.requests, kafka_cfg.topics.models]
    ensure_topics(make_admin(kafka_cfg), [TopicSpec.from_config(kafka_cfg, n) for n in names])
    common = _common(kafka_cfg, tmp_path)
    stop = threading.Event()
    streaming = threading.Thread(target=_stream, args=(kafka_cfg, stop), daemon=True)
    streaming.start()
    trainers = _spawn(tmp_path, "trainers", CLI_MODULE, "train", "--local-ranks", "2", "--devices", ",".join(DEVICES),
                      sets={**common, "trainer.device": "cpu", "trainer.torch_threads": 1, "trainer.local_batch": 8,
                            "trainer.plan_wait_seconds": 0.05, "trainer.eval_every": 1000,
                            "versions.publish_every_seconds": 1.0, "versions.keep": 4})
    server = _spawn(tmp_path, "serve", "streamtrain.serve", "serve", sets=common)
    try:
        _wait_for_versions(kafka_cfg, 2, trainers)  # torch takes a while to start on a busy machine
        bad = _bad_versions(kafka_cfg, tmp_path)
        expected = _send_requests(kafka_cfg, 400)
        stop.set()
        trainers.send_signal(signal.SIGTERM)
        assert trainers.wait(120) == 0
        deadline = time.monotonic() + 60
        answers: list[Prediction] = []
        while time.monotonic() < deadline and len(answers) < len(expected):
            time.sleep(1)
            answers = [decode(m.value(), m.headers(), Prediction)
                       for m in read_to_end(kafka_cfg, [kafka_cfg.topics.predictions])]
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
    finally:
        stop.set()
        for proc in (trainers, server):
            if proc.poll() is None:
                proc.kill()
        streaming.join(30)
    log = (tmp_path / "serve.log").read_text()
    assert "not written" not in (tmp_path / "trainers.log").read_text()  # another writer's files are left alone
    announced = {v.version: v for v in (decode(m.value(), m.headers(), ModelVersion)
                                        for m in read_to_end(kafka_cfg, [kafka_cfg.topics.models]))}

    # Exactly one prediction per request offset, errors where the request was bad and only there.
    assert sorted(a.request_offset for a in answers) == sorted(expected)
    assert {a.request_offset: a.error for a in answers} == expected
    served = [a for a in answers if a.error is None]
    assert all(a.label is not None and len(a.probabilities) == 3 for a in served)
    # Versions were published and switched; never one the gate, its files or its settings ruled out.
    used = sorted({a.version for a in served})
    assert len(used) >= 2, f"one version answered everything: {used}; serve log:\n{log[-3000:]}"
    assert not set(used) & bad and set(used) <= set(announced)
    assert "version 1000 (step 1) not served, the promotion gate refused it: prequential_accuracy -1.0000" in log
    assert "version 1001 (step 1) not served, its files cannot be read" in log
    assert "version 1002 (step 1) not served, it does not fit serve's settings: model.json " \
           "model.settings.num_features is 5" in log
    # Every version the trainers wrote carries its test-then-train figures, the run's final one included.
    trained = [announced[n] for n in sorted(set(announced) - bad)]
    assert all(v.metrics.get("prequential_samples", 0) > 0 and "prequential_accuracy" in v.metrics for v in trained)
    # The devices were fed from outside: the trainers estimated the input standardisation online, and the versions
    # carry it (serve's answers applied it).
    final = json.loads((Path(trained[-1].location) / "model.json").read_text())["model"]["settings"]
    assert len(final["input_shift"]) == 4 and all(scale > 0 for scale in final["input_scale"])
    # Each version that took over passed the gate against the one before it.
    order = [a.version for a in sorted(served, key=lambda a: a.request_offset)]
    assert order == sorted(order)  # a switch only ever moves forward
    switches = [(int(new), int(old)) for new, old in re.findall(r"version (\d+) \(step \d+\) takes over from version "
                                                                 r"(\d+)", log)]
    assert set(used) <= {new for new, _ in switches} | {min(used)}
    for new, old in switches:
        verdict = judge(announced[new].metrics, announced[old].metrics, GATE)
        assert verdict.passed, (old, new, verdict)
