"""serve's promotion gate and its check that a version fits serve's settings: pure functions of the figures."""

from __future__ import annotations

import logging

import pytest

from streamtrain.config import ServeConfig, StreamtrainConfig, TrainerConfig
from streamtrain.serve.gate import judge, misfit
from streamtrain.versions import ModelSpec, spec_for

GATE = ServeConfig(tolerance=0.05)


def test_a_version_passes_unless_worse_than_the_live_one_by_more_than_the_tolerance() -> None:
    assert judge({"heldout_accuracy": 0.70}, None, GATE).passed  # nothing live: the first version is served
    within = judge({"heldout_accuracy": 0.76}, {"heldout_accuracy": 0.80}, GATE)
    assert within.passed and within.metric == "heldout_accuracy" and "worse by 0.0400, within" in within.reason
    beyond = judge({"heldout_accuracy": 0.74}, {"heldout_accuracy": 0.80}, GATE)
    assert not beyond.passed and (beyond.candidate, beyond.live) == (0.74, 0.80) and "beyond" in beyond.reason


def test_the_first_metric_both_carry_decides_and_losses_improve_downwards() -> None:
    gate = ServeConfig(gate_metrics=("heldout_loss", "prequential_accuracy"), tolerance=0.1)
    assert judge({"prequential_accuracy": 0.2}, {"prequential_accuracy": 0.5}, gate).metric == "prequential_accuracy"
    assert not judge({"heldout_loss": 1.3, "prequential_accuracy": 0.9},
                     {"heldout_loss": 1.1, "prequential_accuracy": 0.1}, gate).passed
    assert judge({"heldout_loss": 0.5}, {"heldout_loss": 1.1}, gate).passed


def test_a_version_the_gate_cannot_compare_follows_serve_unmeasured() -> None:
    assert judge({}, {"heldout_accuracy": 0.9}, GATE).passed
    refused = judge({}, {"heldout_accuracy": 0.9}, GATE.model_copy(update={"unmeasured": "reject"}))
    assert not refused.passed and "serve.unmeasured" in refused.reason


def test_a_version_that_does_not_fit_serves_settings_names_the_field() -> None:
    served = StreamtrainConfig(job="cams", trainer=TrainerConfig(num_features=4, num_classes=3))

    def spec(job: str = "cams", **trainer: object) -> ModelSpec:
        cfg = TrainerConfig.model_validate({"num_features": 4, "num_classes": 3, **trainer})
        return spec_for(cfg, job=job, version=1, step=1, class_names=None, offsets={}, metrics={})

    assert misfit(spec(), served) is None
    assert "(trainer.num_features)" in (misfit(spec(num_features=5), served) or "")
    assert "(trainer.num_classes)" in (misfit(spec(num_classes=4), served) or "")
    assert "(trainer.objective)" in (misfit(spec(objective="regression"), served) or "")
    assert "(job)" in (misfit(spec(job="other"), served) or "")


def test_a_regression_versions_error_gates_downwards() -> None:
    gate = ServeConfig(gate_metrics=("heldout_rmse",), tolerance=0.5)
    assert judge({"heldout_rmse": 2.9}, {"heldout_rmse": 2.5}, gate).passed  # worse by 0.4: within
    assert not judge({"heldout_rmse": 3.2}, {"heldout_rmse": 2.5}, gate).passed
    assert judge({"heldout_rmse": 1.0}, {"heldout_rmse": 2.5}, gate).passed  # better


def test_a_metric_over_too_few_samples_does_not_decide() -> None:
    gate = ServeConfig(tolerance=0.05, min_samples=100)
    live = {"heldout_accuracy": 0.80, "heldout_samples": 537.0, "heldout_step": 100.0,
            "prequential_accuracy": 0.90, "prequential_samples": 300.0, "prequential_step": 110.0}
    few = {"prequential_accuracy": 0.40, "prequential_samples": 27.0, "prequential_step": 120.0}
    verdict = judge(few, live, gate)
    assert verdict.passed and verdict.metric is None  # nothing else to go by: serve.unmeasured (accept)
    assert "prequential_accuracy is over 27 samples, fewer than serve.min_samples=100" in verdict.reason
    assert not judge(few, live, gate.model_copy(update={"min_samples": 20})).passed


def test_a_held_out_figure_decides_only_when_it_is_a_newer_evaluation_and_the_reason_says_which() -> None:
    live = {"heldout_accuracy": 0.4022, "heldout_samples": 537.0, "heldout_step": 175.0,
            "prequential_accuracy": 0.60, "prequential_samples": 300.0, "prequential_step": 180.0}
    same = {**live, "prequential_accuracy": 0.30, "prequential_step": 184.0}  # the live version's own evaluation
    verdict = judge(same, live, GATE)
    assert verdict.metric == "prequential_accuracy" and not verdict.passed  # the fresh figure decides
    newer = {**live, "heldout_accuracy": 0.3501, "heldout_step": 200.0, "prequential_step": 204.0}
    verdict = judge(newer, live, GATE)
    assert not verdict.passed and verdict.metric == "heldout_accuracy" and verdict.measured_step == 200
    assert verdict.reason.startswith("heldout_accuracy 0.3501 (step 200, 537 samples) vs live 0.4022 (step 175, "
                                     "537 samples): worse by 0.0521, beyond the tolerance 0.05")


def test_serve_says_when_the_gate_refuses_again_on_the_same_old_figure(caplog: pytest.LogCaptureFixture) -> None:
    from streamtrain.config import KafkaConfig
    from streamtrain.serve.service import ModelServer
    from streamtrain.wire import ModelVersion

    server = ModelServer(StreamtrainConfig(kafka=KafkaConfig(bootstrap_servers="127.0.0.1:1")))  # never connects
    live = {"heldout_accuracy": 0.4022, "heldout_samples": 537.0, "heldout_step": 175.0}
    stale = {"heldout_accuracy": 0.3501, "heldout_samples": 537.0, "heldout_step": 200.0}
    try:
        with caplog.at_level(logging.INFO, logger="streamtrain.serve.service"):
            for number in (51, 52, 53):
                record = ModelVersion(job="j", version=number, step=200 + number, location="", metrics=stale)
                server._refuse_by_gate(record, judge(stale, live, GATE), quiet=False)
    finally:
        server.close()
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "streamtrain.serve.service"]
    assert [level for level, _ in said] == [logging.WARNING, logging.INFO, logging.INFO]
    assert "version 52 (step 252) not served, the promotion gate refused it on the same figure that refused version " \
           "51: heldout_accuracy 0.3501 (step 200, 537 samples)" in said[1][1]


def test_a_version_worse_than_the_trivial_baseline_is_refused_even_with_nothing_live() -> None:
    losing = {"heldout_rmse": 165.4, "heldout_baseline_rmse": 73.1, "heldout_samples": 133.0, "heldout_step": 240.0}
    verdict = judge(losing, None, GATE, "regression")  # the metric follows the objective: rmse, lower is better
    assert not verdict.passed and verdict.metric == "heldout_rmse"
    assert "heldout_rmse 165.4000 (step 240, 133 samples) is worse than the trivial baseline's 73.1000" \
        in verdict.reason and "serve.beat_baseline" in verdict.reason
    assert judge({**losing, "heldout_rmse": 54.5}, None, GATE, "regression").passed
    assert judge(losing, None, GATE.model_copy(update={"beat_baseline": False}), "regression").passed
    few = {**losing, "heldout_samples": 20.0}  # too few samples to say: the next figure (none here) decides
    assert judge(few, None, GATE, "regression").passed
    classifier = {"prequential_accuracy": 0.30, "prequential_baseline_accuracy": 0.45, "prequential_samples": 500.0}
    assert not judge(classifier, None, GATE).passed  # below always answering the most common class


def test_the_gate_metric_follows_the_objective_unless_set() -> None:
    better = {"heldout_rmse": 1.0, "heldout_baseline_rmse": 2.0, "heldout_step": 20.0}
    live = {"heldout_rmse": 0.5, "heldout_baseline_rmse": 2.0, "heldout_step": 10.0}
    verdict = judge(better, live, GATE, "regression")
    assert verdict.metric == "heldout_rmse" and not verdict.passed  # worse by 0.5, beyond the tolerance 0.05
    assert judge(better, live, ServeConfig(gate_metrics=("heldout_accuracy",)), "regression").metric is None
    forecast = judge({"prequential_mae": 0.2, "prequential_baseline_mae": 0.1, "prequential_samples": 300.0}, None,
                     GATE, "forecast")
    assert not forecast.passed and forecast.metric == "prequential_mae"


def test_up_says_when_a_run_learned_nothing_and_what_to_try() -> None:
    from streamtrain.report.objective import learned_nothing_lines
    from streamtrain.report.schema import MetricFigures, ObjectiveFigures

    losing = ObjectiveFigures(name="regression", headline="rmse", baseline="baseline_rmse",
                              baseline_note="the mean of the targets trained so far",
                              prequential=MetricFigures(recent={"rmse": 0.5, "baseline_rmse": 0.8}),
                              heldout_final={"rmse": 165.4, "baseline_rmse": 73.1})
    line, = learned_nothing_lines(losing)  # held-out decides first: 165.4 against the mean's 73.1
    assert line.startswith("the model learned nothing worth serving: held-out RMSE 165.400 is no better than the "
                           "trivial baseline's 73.100 (the mean of the targets trained so far)")
    assert "--set trainer.model=" in line and "--duration" in line
    assert learned_nothing_lines(losing.model_copy(update={"heldout_final": {"rmse": 54.5,
                                                                             "baseline_rmse": 73.1}})) == []
    classifier = ObjectiveFigures(name="classification", headline="accuracy", baseline="baseline_accuracy",
                                  higher_is_better=True,
                                  prequential=MetricFigures(recent={"accuracy": 0.3, "baseline_accuracy": 0.3}))
    assert "test-then-train accuracy" in learned_nothing_lines(classifier)[0]  # no held-out set: the window says
