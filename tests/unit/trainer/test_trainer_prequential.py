"""A rank's test-then-train figures: the sums counted as they come, the metrics running and over the window, and a
model version's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from prometheus_client import CollectorRegistry

from streamtrain.config import KafkaConfig, StreamtrainConfig, VersionsConfig
from streamtrain.config.trainer import TrainerConfig
from streamtrain.kafka import make_producer
from streamtrain.models import build_model
from streamtrain.objectives import SumWindow, build_objective
from streamtrain.synthetic import synthetic_samples
from streamtrain.trainer.distributed import DistContext
from streamtrain.trainer.metrics import ObjectiveMetrics, TrainerMetrics
from streamtrain.trainer.publish import VersionPublisher
from streamtrain.versions import load_model


def test_the_window_keeps_the_last_steps_that_trained_and_the_run_keeps_all() -> None:
    window = SumWindow(2)
    for sums in ({"count": 4.0, "correct": 1.0}, {}, {"count": 2.0, "correct": 2.0}, {"count": 4.0, "correct": 3.0}):
        window.add(sums)
    assert window.running == {"count": 10.0, "correct": 6.0}
    assert window.recent == {"count": 6.0, "correct": 5.0}  # the empty step counts for nothing
    with pytest.raises(ValueError, match="at least one step"):
        SumWindow(0)


def test_prequential_sums_are_counters_and_metrics_gauges_per_window() -> None:
    registry = CollectorRegistry()
    scores = ObjectiveMetrics(registry, "cam0", "job", build_objective(TrainerConfig()), window=1)
    scores.record_step({"count": 4.0, "loss_sum": 2.0, "correct": 1.0, "baseline_correct": 0.0})
    scores.record_step({})
    scores.record_step({"count": 4.0, "loss_sum": 1.0, "correct": 3.0, "baseline_correct": 2.0})
    labels = {"device": "cam0", "job": "job"}

    def value(name: str, **more: str) -> float | None:
        return registry.get_sample_value(name, {**labels, **more})

    assert value("streamtrain_trainer_prequential_sums_total", key="count") == 8.0
    assert value("streamtrain_trainer_prequential_sums_total", key="correct") == 4.0
    assert value("streamtrain_trainer_prequential", metric="accuracy", window="running") == 0.5
    assert value("streamtrain_trainer_prequential", metric="accuracy", window="recent") == 0.75
    assert value("streamtrain_trainer_prequential", metric="baseline_accuracy", window="running") == 0.25
    assert value("streamtrain_trainer_prequential", metric="loss", window="running") == pytest.approx(3 / 8)
    scores.record_heldout({"accuracy": 0.9, "baseline_accuracy": 0.4})
    assert value("streamtrain_trainer_heldout", metric="accuracy") == 0.9


def test_every_version_the_final_one_included_carries_the_windows_test_then_train_figures(tmp_path: Path) -> None:
    config = StreamtrainConfig(job="j", kafka=KafkaConfig(bootstrap_servers="127.0.0.1:1"),
                               versions=VersionsConfig(dir=tmp_path), trainer=TrainerConfig(prequential_window=2))
    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
    producer = make_producer(config.kafka)  # its announcements stay queued: no broker is needed to write versions
    publisher = VersionPublisher(config, ctx, producer, TrainerMetrics(CollectorRegistry(), "0", "j"))
    model = build_model(config.trainer)
    samples = synthetic_samples([3, 4], 16, 10)
    for correct in (1.0, 2.0, 2.0):  # three steps of 2 samples; the window holds the last two
        publisher.note_trained(samples, {"count": 2.0, "loss_sum": 1.0, "correct": correct, "baseline_correct": 0.0})
    assert publisher.publish(3, model, "0", 6, {"heldout_accuracy": 0.5, "heldout_step": 3.0}) == 1
    assert publisher.publish(4, model, "0", 6, {"heldout_accuracy": 0.6, "heldout_step": 4.0}) == 2  # trained nothing
    for version in (1, 2):
        metrics = load_model(tmp_path, version=version).metrics
        assert metrics["prequential_accuracy"] == 1.0 and metrics["prequential_samples"] == 4.0
        assert "heldout_accuracy" in metrics
    assert load_model(tmp_path).metrics["prequential_step"] == 4.0
    producer.purge()


def test_a_version_is_asked_for_at_the_step_that_crosses_the_interval_and_never_for_an_idle_fleet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = StreamtrainConfig(job="j", kafka=KafkaConfig(bootstrap_servers="127.0.0.1:1"),
                               versions=VersionsConfig(dir=tmp_path, publish_every_seconds=1.0))
    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
    producer = make_producer(config.kafka)
    publisher = VersionPublisher(config, ctx, producer, TrainerMetrics(CollectorRegistry(), "0", "j"))
    clock = [100.0]
    monkeypatch.setattr("streamtrain.trainer.publish.time.monotonic", lambda: clock[0])
    publisher._last = 100.0  # the last version: now
    asked = []
    for _ in range(6):  # steps of 0.3 s: the one that ends past 1 s asks, not the one after it
        asked.append(publisher.due(samples=4))
        clock[0] += 0.3
    assert asked == [False, False, False, True, True, True]
    publisher.publish(3, build_model(config.trainer), "0", 0, {})
    assert not publisher.due(samples=0)  # nothing trained since the version, nor in this step
    clock[0] += 5.0
    assert not publisher.due(samples=0)  # an idle fleet: the weights did not change, no version however long
    publisher.note_trained(synthetic_samples([3], 16, 1), {})
    assert publisher.due(samples=0)  # trained since the last version: due once the interval is past
    producer.purge()
