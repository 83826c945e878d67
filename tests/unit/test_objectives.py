"""The objectives: losses per sample, metric sums that add up exactly, baselines, target checks, predictions, and the
start-up check of an objective of one's own."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from streamtrain.config.trainer import TrainerConfig
from streamtrain.models.batching import collate_for_prediction, collate_packed, pack_samples
from streamtrain.models.conv import last_frames
from streamtrain.models.plugins import build_collate, build_model, check_plugins
from streamtrain.models.predicting import predict_samples
from streamtrain.objectives import (
    MISSING_TARGET,
    SERIES_TOO_SHORT,
    TARGET_RANGE,
    TARGET_WIDTH,
    Objective,
    add_sums,
    build_objective,
)
from streamtrain.plugins import SetupError
from streamtrain.synthetic import synthetic_samples
from streamtrain.wire import Sample

BASE = TrainerConfig(num_features=2, num_classes=3, hidden_size=8, num_layers=1, kernel_size=3, precision="float64")
CONFIGS = {
    "classification": BASE,
    "regression": BASE.model_copy(update={"objective": "regression", "target_width": 2}),
    "multilabel": BASE.model_copy(update={"objective": "multilabel", "num_tags": 3}),
    "forecast": BASE.model_copy(update={"objective": "forecast", "horizon": 2}),
}


def with_targets(config: TrainerConfig, samples: list[Sample]) -> list[Sample]:
    """`samples` with the target `config.objective` trains on, drawn from their payloads (so it can be learned)."""
    if config.objective == "regression":
        return [replace(s, target=(float(s.array()[:, 0].mean()), 0.5 * (s.label or 0))) for s in samples]
    if config.objective == "multilabel":
        return [replace(s, target=(float(s.label == 0), float(s.label == 1), float(s.array().mean() > 0)))
                for s in samples]
    return samples


def batch_of(name: str, sizes: list[int], seed: int = 0) -> tuple[Objective, list[Sample]]:
    config = CONFIGS[name]
    grown = [n + 2 for n in sizes] if name == "forecast" else sizes
    samples = with_targets(config, synthetic_samples(grown, 2, 3, seed=seed))
    return build_objective(config), samples


@pytest.mark.parametrize("name", list(CONFIGS))
def test_losses_are_per_sample_and_metric_sums_add_up_over_any_split(name: str) -> None:
    objective, samples = batch_of(name, [3, 5, 1, 4, 2, 6])
    config = objective.config
    model = build_model(config)
    whole = collate_packed(samples, config)
    outputs = model(whole)
    assert outputs.shape == (6, objective.output_width())
    losses = objective.losses(outputs, whole)
    assert losses.shape == (6,) and losses.requires_grad
    state = torch.arange(objective.baseline_size(), dtype=torch.float64) + 1.0  # any fixed baseline
    summed: dict[str, float] = {}
    for part in (samples[:2], samples[2:3], samples[3:]):
        batch = collate_packed(part, config)
        add_sums(summed, {k: float(v) for k, v in objective.metric_sums(model(batch).detach(), batch, state).items()})
    at_once = {k: float(v) for k, v in objective.metric_sums(outputs.detach(), whole, state).items()}
    assert summed.keys() == at_once.keys() and summed["count"] == 6
    for key, value in at_once.items():
        assert summed[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert at_once["loss_sum"] == pytest.approx(float(losses.detach().sum()), rel=1e-12)
    metrics = objective.summarise(at_once)
    assert objective.headline in metrics and (objective.baseline is None or objective.baseline in metrics)


def test_classification_metrics_and_its_most_common_class_baseline() -> None:
    objective = build_objective(BASE)
    samples = [Sample.from_array("d", i, np.zeros((2, 2), np.float32), label=y) for i, y in enumerate([2, 2, 0, 1])]
    batch = collate_packed(samples, BASE)
    outputs = torch.tensor([[0.0, 0.0, 5.0], [5.0, 0.0, 0.0], [5.0, 0.0, 0.0], [0.0, 0.0, 5.0]], dtype=torch.float64)
    before = objective.summarise({k: float(v) for k, v in objective.metric_sums(outputs, batch).items()})
    assert before["accuracy"] == 0.5 and before["baseline_accuracy"] == 0.25  # class 0 before anything was seen
    objective.observe(batch)
    after = objective.summarise({k: float(v) for k, v in objective.metric_sums(outputs, batch).items()})
    assert after["baseline_accuracy"] == 0.5  # class 2, the most common so far
    assert after["loss"] == pytest.approx(float(torch.nn.functional.cross_entropy(outputs, batch.labels)))


def test_regression_errors_are_in_target_units_and_its_baseline_is_the_running_mean() -> None:
    config = BASE.model_copy(update={"objective": "regression", "target_shift": 10.0, "target_scale": 4.0})
    objective = build_objective(config)
    samples = [Sample.from_array("d", i, np.zeros((2, 2), np.float32), target=t) for i, t in enumerate([6.0, 14.0])]
    batch = collate_packed(samples, config)
    outputs = torch.tensor([[-1.0], [0.0]], dtype=torch.float64)  # standard units: predicts 6 and 10
    assert objective.predict(outputs, batch).values.tolist() == [[6.0], [10.0]]
    sums = {k: float(v) for k, v in objective.metric_sums(outputs, batch).items()}
    metrics = objective.summarise(sums)
    assert metrics["mae"] == 2.0 and metrics["rmse"] == pytest.approx(math.sqrt(8.0))
    assert metrics["baseline_mae"] == 10.0  # the mean before any target was trained is 0
    assert metrics["loss"] == pytest.approx(0.5)  # MSE in standard units: (0 + 1) / 2
    objective.observe(batch)
    again = objective.summarise({k: float(v) for k, v in objective.metric_sums(outputs, batch).items()})
    assert again["baseline_mae"] == 4.0 and again["baseline_rmse"] == 4.0  # predicting the mean, 10
    huber = build_objective(config.model_copy(update={"regression_loss": "huber", "huber_delta": 0.5}))
    assert huber.losses(outputs, batch).tolist() == pytest.approx([0.0, 0.5 * (1 - 0.25)])  # linear past delta


def test_multilabel_f1_per_tag_mean_and_micro() -> None:
    config = CONFIGS["multilabel"]
    objective = build_objective(config)
    targets = [(1, 0, 0), (1, 1, 0), (0, 1, 0), (0, 0, 0)]
    samples = [Sample.from_array("d", i, np.zeros((2, 2), np.float32), target=t) for i, t in enumerate(targets)]
    batch = collate_packed(samples, config)
    said = torch.tensor([[1, 0, 0], [1, 0, 0], [0, 1, 1], [0, 0, 0]], dtype=torch.float64)
    outputs = (said * 2 - 1) * 10  # logits: sigmoid far from the threshold
    metrics = objective.summarise({k: float(v) for k, v in objective.metric_sums(outputs, batch).items()})
    # tag 0: TP 2 -> F1 1; tag 1: TP 1, FN 1 -> 2/3; tag 2: FP 1, no positive -> 0.
    assert metrics["f1_0"] == 1.0 and metrics["f1_1"] == pytest.approx(2 / 3) and metrics["f1_2"] == 0.0
    assert metrics["f1_mean"] == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert metrics["f1_micro"] == pytest.approx(2 * 3 / (2 * 3 + 1 + 1))
    assert metrics["baseline_f1_mean"] == 0.0  # nothing seen: every tag predicted absent
    prediction = objective.predict(outputs, batch)
    assert prediction.tags.tolist() == said.bool().tolist()
    assert prediction.rows()[0]["tags"] == [0] and prediction.rows()[2]["tags"] == [1, 2]  # the tags present


def test_forecast_holds_the_horizon_back_and_scores_against_the_last_value() -> None:
    config = CONFIGS["forecast"].model_copy(update={"num_features": 1, "max_input_abs": 0.0})
    objective = build_objective(config)
    series = [np.arange(6, dtype=np.float32)[:, None], np.array([[5], [5], [5], [7], [9]], np.float32)]
    samples = [Sample.from_array("d", i, s) for i, s in enumerate(series)]
    batch = collate_packed(samples, config)
    assert batch.total_size == 11 and batch.lengths.tolist() == [4, 3]  # sizes as declared; inputs without the future
    assert batch.targets.tolist() == [[4.0, 5.0], [7.0, 9.0]]
    zero = torch.zeros(2, 2, dtype=torch.float32)
    metrics = objective.summarise({k: float(v) for k, v in objective.metric_sums(zero, batch).items()})
    # An output of 0 is the last value: 3 for the first series (errors 1, 2), 5 for the second (errors 2, 4).
    assert metrics["mae"] == metrics["baseline_mae"] == pytest.approx(9 / 4)
    steps = torch.tensor([[1.0, 2.0], [0.0, 0.0]])  # one mean step (1) per step ahead: the ramp exactly
    assert objective.predict(steps, batch).values[0, :, 0].tolist() == pytest.approx([4.0, 5.0], abs=1e-2)
    whole = collate_for_prediction(samples[:1], config)  # serving: the whole series in, its next values out
    assert whole.lengths.tolist() == [6] and objective.predict(steps[:1], whole).values.shape == (1, 2, 1)


@pytest.mark.parametrize(("name", "change", "reason"), [
    ("regression", {"target": None}, MISSING_TARGET),
    ("regression", {"target": (1.0,)}, TARGET_WIDTH),
    ("multilabel", {"target": (1.0, 0.0)}, TARGET_WIDTH),
    ("multilabel", {"target": (1.0, 0.0, 2.0)}, TARGET_RANGE),
    ("forecast", {"size": 2, "shape": (2, 2), "data": bytes(32)}, SERIES_TOO_SHORT),
    ("classification", {"label": None}, "untrainable"),
    ("classification", {"label": 3}, "untrainable"),
])
def test_a_sample_without_what_its_objective_needs_is_refused_naming_the_field(name: str, change: dict[str, object],
                                                                               reason: str) -> None:
    objective, samples = batch_of(name, [4])
    assert objective.target_problem(samples[0]) is None
    problem = objective.target_problem(replace(samples[0], **change))  # type: ignore[arg-type]
    assert problem is not None and problem.reason == reason
    field = "label" if name == "classification" else "size" if name == "forecast" else "target"
    assert problem.detail.startswith(field)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_builtin_objectives_pass_the_start_up_probe(name: str) -> None:
    config = CONFIGS[name]
    check_plugins(build_model(config), build_collate(config), config)


def test_an_objective_of_ones_own_by_dotted_path() -> None:
    config = BASE.model_copy(update={"objective": "objective_plugins:Pinball"})
    objective = build_objective(config)
    assert objective.name == "median" and objective.output_width() == 1
    check_plugins(build_model(config), build_collate(config), config)
    duck = build_objective(BASE.model_copy(update={"objective": "objective_plugins:Duck"}))
    assert isinstance(duck, Objective) and duck.output_width() == 3
    check_plugins(build_model(duck.config), build_collate(duck.config), duck.config)
    batch = pack_samples(synthetic_samples([3, 4], 2, 3), 2, dtype=torch.float64)
    assert duck.summarise({"count": 2.0, "loss_sum": 3.0}) == {"loss": 1.5}
    assert duck.predict(torch.zeros(2, 3), batch).values.shape == (2, 3)  # an objective's own: its raw outputs


@pytest.mark.parametrize(("path", "words"), [
    ("objective_plugins:MeanLoss", "losses of shape ()"),
    ("objective_plugins:Detached", "detached"),
    ("objective_plugins:NoCount", "'count' = 3"),
    ("objective_plugins:NegativeSum", "negative metric sums for a probe batch of 3 samples of shape (size, 2) (err"),
    ("objective_plugins:Lacking", "lacks losses, metric_sums"),
    ("objective_plugins:raising", "raised RuntimeError"),
    ("objective_plugins:Nowhere", "has no attribute"),
    ("no_such_module:Thing", "cannot import module"),
])
def test_a_bad_objective_fails_at_start_up_naming_the_setting(path: str, words: str) -> None:
    config = BASE.model_copy(update={"objective": path})
    with pytest.raises(SetupError) as excinfo:
        objective = build_objective(config)
        check_plugins(build_model(config, objective.output_width()), build_collate(config), config, objective)
    assert str(excinfo.value).startswith("trainer.objective: ") and words in str(excinfo.value)


@pytest.mark.parametrize("model", ["conv", "seq"])
def test_a_forecasting_model_sees_where_each_series_ends_and_keeps_series_apart(model: str) -> None:
    config = CONFIGS["forecast"].model_copy(update={"model": model, "length_buckets": 0})
    net = build_model(config)
    assert net.last_state  # type: ignore[union-attr]
    samples = synthetic_samples([5, 9, 3, 12], 2, 3, seed=4)
    together = net(collate_packed(samples, config))
    alone = torch.cat([net(collate_packed([s], config)) for s in samples])
    torch.testing.assert_close(together, alone, rtol=1e-9, atol=1e-12)
    values = torch.arange(12.0).reshape(6, 2)
    ends = last_frames(values, torch.tensor([0, 2, 2, 6]))  # segments of 2, 0 and 4 rows
    assert ends.tolist() == [[2.0, 3.0], [0.0, 0.0], [10.0, 11.0]]


@pytest.mark.parametrize(("name", "field", "shape"), [
    ("classification", "probabilities", (2, 3)), ("regression", "values", (2, 2)), ("multilabel", "tags", (2, 3)),
    ("forecast", "values", (2, 2, 2))])
def test_predictions_need_no_target_and_come_in_the_objectives_terms(name: str, field: str,
                                                                     shape: tuple[int, ...]) -> None:
    config = CONFIGS[name]
    model = build_model(config)
    model.train()
    bare = [Sample.from_array("d", i, np.ones((n, 2), np.float32)) for i, n in enumerate([4, 9])]
    predictions = predict_samples(model, bare, config)
    assert predictions.objective == name and getattr(predictions, field).shape == shape and len(predictions.rows()) == 2
    assert model.training  # left as it was found


@pytest.mark.parametrize(("name", "check"), [
    ("regression", lambda p, n: p.values.shape == (n, 2) and p.labels is None),
    ("multilabel", lambda p, n: p.probabilities.shape == (n, 3) and p.tags.shape == (n, 3)),
    ("forecast", lambda p, n: p.values.shape == (n, 2, 2)),  # horizon 2 x 2 features
])
def test_a_published_version_of_every_objective_loads_and_predicts_as_the_objective_says(
        tmp_path: Path, name: str, check: Any) -> None:
    from streamtrain.versions import load_model, spec_for, write_version

    config = CONFIGS[name].model_copy(update={"precision": "float32", "target_shift": 3.0, "target_scale": 2.0})
    model = build_model(config)
    spec = spec_for(config, job="j", version=1, step=5, class_names=None, offsets={"0": 5}, metrics={})
    write_version(tmp_path, spec, model.state_dict())
    arrays = [np.ones((n, 2), np.float32) for n in (4, 9, 30)]
    loaded = load_model(tmp_path)
    assert loaded.config.target_shift == 3.0 and loaded.config.horizon == config.horizon  # kept in model.json
    predictions = loaded.predict(arrays)
    assert predictions.objective == name and check(predictions, 3)
    expected = predict_samples(model.eval(), [Sample.from_array("d", i, a) for i, a in enumerate(arrays)], config)
    key = "probabilities" if name == "multilabel" else "values"
    np.testing.assert_allclose(getattr(predictions, key), getattr(expected, key), rtol=1e-5)
    assert loaded.classes is None and loaded.spec.to_json()["classes"] == {"count": 0, "names": None}  # no classes
