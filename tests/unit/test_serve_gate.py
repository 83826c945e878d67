"""serve's promotion gate and its check that a version fits serve's settings: pure functions of the figures."""

from __future__ import annotations

from serve.gate import judge, misfit
from streamtrain.config import ServeConfig, StreamtrainConfig, TrainerConfig
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
