"""The objective plug-in example (`examples/quantile_objective.py`) as a user runs it: named by dotted path, checked
at start-up, trained by a real rank on the real broker, its metric sums on the wire; and offline, its quantiles
learned (the 10%-90% range holds about four targets in five)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from feedback_records import step_feedback

from streamtrain.config import KafkaConfig
from streamtrain.config.trainer import TrainerConfig
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin, make_producer, read_to_end
from streamtrain.models import build_collate, build_model, check_plugins
from streamtrain.objectives import add_sums, build_objective
from streamtrain.runtime.commands import module_command
from streamtrain.synthetic import synthetic_samples
from streamtrain.trainer.step import build_optimizer
from streamtrain.wire import Sample, encode

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CONFIG = TrainerConfig(objective="quantile_objective:Quantiles", num_features=2, hidden_size=16, num_layers=1,
                       optimizer="adamw", lr=0.01, lr_scaling=False)


def _samples(count: int, seed: int) -> list[Sample]:
    """Series whose target is their first feature's mean plus noise: a spread for the quantiles to find."""
    rng = np.random.default_rng(seed)
    out = synthetic_samples(rng.integers(4, 20, count).tolist(), 2, 3, seed=seed)
    return [replace(s, label=None, target=(float(s.array()[:, 0].mean() + rng.normal(0, 0.5)),)) for s in out]


def test_the_quantile_objective_learns_its_quantiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    objective = build_objective(CONFIG)
    model, collate = build_model(CONFIG, objective.output_width()), build_collate(CONFIG)
    check_plugins(model, collate, CONFIG, objective)
    assert objective.target_problem(replace(_samples(1, 0)[0], target=None)) is not None
    optimizer = build_optimizer(model, CONFIG)
    train = _samples(2000, 1)
    for start in range(0, len(train), 20):
        batch = collate(train[start:start + 20], CONFIG)
        optimizer.zero_grad()
        objective.losses(model(batch), batch).mean().backward()
        optimizer.step()
    sums: dict[str, float] = {}
    batch = collate(_samples(500, 2), CONFIG)
    with torch.no_grad():
        add_sums(sums, {k: float(v) for k, v in objective.metric_sums(model(batch), batch).items()})
    metrics = objective.summarise(sums)
    assert 0.65 < metrics["coverage"] < 0.95, metrics
    assert objective.predict(model(batch), batch).values.shape == (500, 3)


def test_a_rank_trains_the_example_objective_from_its_stream(kafka_cfg: KafkaConfig, tmp_path: Path) -> None:
    topic = kafka_cfg.topics.device("0")
    ensure_topics(make_admin(kafka_cfg), [TopicSpec.from_config(kafka_cfg, topic)])
    producer = make_producer(kafka_cfg)
    for sample in _samples(96, 3):
        value, headers = encode(replace(sample, device_id="0"))
        producer.produce(topic, value=value, headers=headers)
    assert producer.flush(30) == 0
    sets = {"job": "quantiles", "kafka.bootstrap_servers": kafka_cfg.bootstrap_servers,
            "kafka.topic_prefix": kafka_cfg.topic_prefix, "metrics.port": 0, "trainer.device": "cpu",
            "trainer.torch_threads": 1, "trainer.objective": CONFIG.objective, "trainer.num_features": 2,
            "trainer.hidden_size": 16, "trainer.num_layers": 1, "trainer.local_batch": 16,
            "trainer.plan_wait_seconds": 0.05, "trainer.data_wait_seconds": 0.2}
    cmd = module_command("streamtrain.trainer", "train", "--local-ranks", "1", "--devices", "0", "--steps", "6",
                         global_args=[x for k, v in sets.items() for x in ("--set", f"{k}={v}")])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLES), *sys.path])}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "using objective quantile_objective:Quantiles" in done.stdout + done.stderr
    records = read_to_end(kafka_cfg, [kafka_cfg.topics.feedback])
    feedback = step_feedback(records)
    trained = [fb for fb in feedback if fb.samples]
    assert sum(fb.samples for fb in trained) == 96
    assert sum(fb.prequential["count"] for fb in trained) == 96
    assert all(0 <= fb.prequential["covered"] <= fb.samples for fb in trained)
