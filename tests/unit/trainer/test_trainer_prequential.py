"""A rank's test-then-train figures: the sums counted as they come, and the metrics running and over the window."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from streamtrain.config.trainer import TrainerConfig
from streamtrain.objectives import SumWindow, build_objective
from trainer.metrics import ObjectiveMetrics


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
