"""Per-rank Prometheus metrics, and the environment `--local-ranks` gives each rank."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry

from streamtrain.config import StreamtrainConfig, load_config
from streamtrain.trainer.launch import child_environment
from streamtrain.trainer.metrics import TrainerMetrics
from streamtrain.wire import StepFeedback


def _feedback(step: int, samples: int, dropped: int = 0, loss: float | None = 0.5) -> StepFeedback:
    return StepFeedback(job="j", step=step, device_id="d0", rank=0, plan_step=-1, samples=samples, total_size=10,
                        compute_seconds=0.2, data_wait_seconds=0.1, comm_seconds=0.05, step_seconds=0.4,
                        memory_bytes=1000, lowest_unprocessed_offset=7, buffer_depth=3, loss=loss, dropped=dropped)


def test_rejected_plans_are_counted_by_reason() -> None:
    registry = CollectorRegistry()
    metrics = TrainerMetrics(registry, "d0", "j")
    metrics.count_rejected({"plan-truncation": 2})
    metrics.count_rejected({"plan-truncation": 2, "plan-non-finite": 1})  # running totals: only the news count
    metrics.count_rejected({"plan-truncation": 5, "plan-non-finite": 1})

    def rejected(reason: str) -> float | None:
        return registry.get_sample_value("streamtrain_trainer_plans_rejected_total",
                                         {"device": "d0", "job": "j", "reason": reason})

    assert rejected("plan-truncation") == 5.0 and rejected("plan-non-finite") == 1.0


def test_step_metrics_carry_device_and_job_labels() -> None:
    registry = CollectorRegistry()
    metrics = TrainerMetrics(registry, "d0", "j")
    labels = {"device": "d0", "job": "j"}
    assert registry.get_sample_value("streamtrain_trainer_plans_late_total", labels) == 0.0  # exported up front
    metrics.record_step(_feedback(0, 4, dropped=2), late=True, compressed=True, dead_lettered=3)
    metrics.record_step(_feedback(1, 6, loss=None), late=False, compressed=False, dead_lettered=0)

    def value(name: str) -> float | None:
        return registry.get_sample_value(f"streamtrain_trainer_{name}", labels)

    assert value("samples_total") == 10 and value("batch_samples") == 6
    assert value("truncated_samples_total") == 2 and value("dead_lettered_records_total") == 3
    assert value("plans_late_total") == 1 and value("compressed_steps_total") == 1
    assert value("loss") == 0.5  # a step without samples leaves the last loss
    assert value("samples_per_second") == pytest.approx(6 / 0.5)
    assert value("step_seconds") == 0.4 and value("data_wait_seconds") == 0.1 and value("comm_seconds") == 0.05
    assert value("buffer_depth_samples") == 3 and value("completed_steps") == 2


def test_child_environment_carries_the_resolved_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMTRAIN_TRAINER__LR", "0.5")  # overridden in the parent by a flag
    config = load_config(overrides={"trainer.lr": 0.25, "job": "jobx", "kafka.topic_prefix": "p1"})
    env = child_environment(config, rank=1, world_size=2, port=1234)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]) == ("1", "1", "2", "1234")
    assert "STREAMTRAIN_TRAINER__LR" not in env
    assert json.loads(env["STREAMTRAIN_TRAINER"])["lr"] == 0.25
    child = load_config(env=env)
    assert child == config and isinstance(child, StreamtrainConfig)


def test_child_environment_passes_secrets_in_clear_so_ranks_can_authenticate() -> None:
    config = load_config(overrides={
        "kafka.security_protocol": "SASL_PLAINTEXT", "kafka.sasl_mechanism": "SCRAM-SHA-512",
        "kafka.sasl_username": "alice", "kafka.sasl_password": "s3cret-pw",
    })
    env = child_environment(config, rank=0, world_size=1, port=1234)
    child = load_config(env=env)
    assert child.kafka.sasl_password is not None
    assert child.kafka.sasl_password.get_secret_value() == "s3cret-pw"
    assert child == config
