"""On the real broker: forged feedback is dead-lettered and steers nothing; one wild report cannot move the model."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from coordinator_it_helpers import JOB, Plans, Trainers, config, get, produce_samples, running
from fuzzing import forged_feedback

from streamtrain.config import KafkaConfig
from streamtrain.kafka import make_producer, read_to_end
from streamtrain.wire import DeadLetter, StepFeedback, decode, encode

pytestmark = pytest.mark.integration


def _model(port: int | None) -> tuple[float, float]:
    device = json.loads(get(port, "/status")[1])["devices"][0]
    return device["model"]["a"], device["model"]["b"]


def test_forged_feedback_is_rejected_and_a_wild_report_does_not_steer_the_plans(kafka_cfg: KafkaConfig) -> None:
    produce_samples(kafka_cfg, {"cam0": 400})
    trainers, plans = Trainers(kafka_cfg), Plans(kafka_cfg)
    forger = make_producer(kafka_cfg)
    try:
        with running(config(kafka_cfg, devices=("cam0",), policy="ett-stream")) as service:
            plans.wait(0, timeout=30)
            for step in range(12):  # a steady device: 8 samples of size 20 in 0.2 s, step after step
                trainers.report(step, "cam0", 0, [], lowest=0, depth=0, seconds=0.2)
                plans.wait(step + 1)
            a, b = _model(service.port)
            before = a * 160 + b

            # Forged reports for the next step (and one a million steps ahead): none may count as its report.
            forged = [*forged_feedback(18, JOB, "cam0", step=12)]
            ahead = StepFeedback(JOB, 1_000_012, "cam0", 0, 1_000_012, 8, 160, 0.2, 0.0, 0.01, 0.2, 1 << 20, 0, 0)
            for record in forged:
                forger.produce(kafka_cfg.topics.feedback, value=record.value, headers=record.headers)
            value, headers = encode(ahead)
            forger.produce(kafka_cfg.topics.feedback, value=value, headers=headers)
            # A wild report that passes every check (a 20 s step of the same batch): an outlier, not a forgery.
            value, headers = encode(replace(ahead, step=12, plan_step=12, compute_seconds=20.0, step_seconds=20.0))
            forger.produce(kafka_cfg.topics.feedback, value=value, headers=headers)
            assert forger.flush(30) == 0
            plan13 = plans.wait(13, timeout=30)  # planned from the wild report: the step goes on
            a, b = _model(service.port)
            assert abs(a * 160 + b - before) / before < 0.02
            for step in range(13, 16):  # and the fleet keeps stepping: the far-ahead report stalled nothing
                trainers.report(step, "cam0", 0, [], lowest=0, depth=0, seconds=0.2)
                plans.wait(step + 1)
            a, b = _model(service.port)
            assert abs(a * 160 + b - before) / before < 0.02
            assert plan13.step_time_target < 1.0  # the 20 s report did not become the step-time target
            reg = service.metrics.registry
            counted = {reason: reg.get_sample_value("streamtrain_coordinator_dead_lettered_records_total",
                                                    {"job": JOB, "reason": reason})
                       for reason in ("feedback-non-finite", "feedback-negative", "feedback-impossible",
                                      "feedback-step-window")}
    finally:
        trainers.close()
        plans.close()
    want = {"feedback-non-finite": 4.0, "feedback-negative": 4.0, "feedback-impossible": 10.0,
            "feedback-step-window": 1.0}
    assert counted == want
    letters = [decode(m.value(), m.headers(), DeadLetter)
               for m in read_to_end(kafka_cfg, [kafka_cfg.topics.dead_letter], timeout=30)]
    assert sorted(dl.reason for dl in letters) == sorted(r for r, n in want.items() for _ in range(int(n)))
    assert {dl.service for dl in letters} == {"coordinator"} and {dl.topic for dl in letters} == {
        kafka_cfg.topics.feedback}
    assert all("cam0 step" in dl.detail for dl in letters)
