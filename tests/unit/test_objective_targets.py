"""Float targets in standard units: a shift and scale per value of a vector target, metrics per value beside the
pooled ones, the same standardisation for an objective of one's own, and the baseline state `metric_sums` is given."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from streamtrain.config.loader import ConfigError, load_config
from streamtrain.config.trainer import TrainerConfig
from streamtrain.models.batching import collate_packed
from streamtrain.models.plugins import build_model
from streamtrain.objectives import add_sums, build_objective
from streamtrain.trainer.distributed import DistContext
from streamtrain.trainer.evaluation import HeldOutEvaluator
from streamtrain.wire import Sample

VECTOR = TrainerConfig(objective="regression", num_features=1, target_width=3, hidden_size=8, num_layers=1,
                       kernel_size=3, precision="float64", target_shift=(0.0, 10.0, 100.0),
                       target_scale=(1000.0, 0.01, 1.0))


def _samples(targets: list[list[float]]) -> list[Sample]:
    return [Sample.from_array("d", i, np.zeros((3, 1), np.float32), target=t) for i, t in enumerate(targets)]


def _sums(objective: Any, outputs: torch.Tensor, batch: Any, baseline: torch.Tensor | None = None) -> dict[str, float]:
    return {k: float(v) for k, v in objective.metric_sums(outputs, batch, baseline).items()}


def test_each_value_of_a_vector_target_is_standardised_by_its_own_shift_and_scale() -> None:
    objective = build_objective(VECTOR)
    batch = collate_packed(_samples([[1000.0, 10.01, 101.0], [-1000.0, 9.99, 99.0]]), VECTOR)
    standard = objective.to_standard(batch.targets)
    torch.testing.assert_close(standard, torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]], dtype=torch.float64))
    torch.testing.assert_close(objective.from_standard(standard), batch.targets)
    assert objective.losses(standard, batch).tolist() == [0.0, 0.0]  # every value reaches the model near 0 and 1
    predicted = objective.predict(torch.zeros(2, 3, dtype=torch.float64), batch).values
    assert predicted.tolist() == [[0.0, 10.0, 100.0]] * 2  # an output of 0 is each value's own shift


def test_a_vector_target_is_judged_per_value_beside_the_pooled_figures() -> None:
    config = VECTOR.model_copy(update={"target_names": ("fat", "water", "protein")})
    objective = build_objective(config)
    samples = _samples([[1000.0, 10.0, 100.0], [3000.0, 10.02, 104.0], [-1000.0, 9.98, 98.0]])
    batch = collate_packed(samples, config)
    outputs = torch.zeros(3, 3, dtype=torch.float64)  # predicts (0, 10, 100) for every sample
    metrics = objective.summarise(_sums(objective, outputs, batch))
    assert metrics["rmse_fat"] == pytest.approx(math.sqrt((1000.0**2 + 3000.0**2 + 1000.0**2) / 3))
    assert metrics["mae_water"] == pytest.approx(0.04 / 3) and metrics["mae_protein"] == pytest.approx(6.0 / 3)
    assert metrics["baseline_mae_fat"] == pytest.approx(5000.0 / 3)  # the mean so far: 0 before any was trained
    pooled = (1000.0**2 + 3000.0**2 + 1000.0**2 + 0.02**2 * 2 + 4.0**2 + 2.0**2) / 9
    assert metrics["rmse"] == pytest.approx(math.sqrt(pooled))  # still over every value, beside the per-value ones
    split: dict[str, float] = {}
    for part in (samples[:1], samples[1:]):  # sums add up over batches: per value as for the pooled figures
        piece = collate_packed(part, config)
        add_sums(split, _sums(objective, torch.zeros(len(part), 3, dtype=torch.float64), piece))
    assert objective.summarise(split) == pytest.approx(metrics)
    objective.observe(batch)
    after = objective.summarise(_sums(objective, outputs, batch))
    assert after["baseline_rmse_water"] == pytest.approx(math.sqrt((0.0**2 + 0.02**2 + 0.02**2) / 3))
    indexed = build_objective(VECTOR).summarise(_sums(objective, outputs, batch))
    assert "rmse_0" in indexed and "rmse_fat" not in indexed  # without names, a value is its index


@pytest.mark.parametrize(("sets", "shift"), [
    ({"trainer.target_shift": "[0, 1, 2]", "trainer.target_width": 3}, (0.0, 1.0, 2.0)),
    ({"trainer.target_shift": [0, 1, 2], "trainer.target_width": 3}, (0.0, 1.0, 2.0)),
    ({"trainer.target_shift": 1.5, "trainer.target_width": 3}, 1.5),  # one number applies to every value
    ({"trainer.target_shift": [2.5]}, 2.5),
])
def test_shift_and_scale_take_one_number_or_one_per_value(sets: dict[str, object], shift: object) -> None:
    assert load_config(env={}, overrides=sets).trainer.target_shift == shift
    env = load_config(env={"STREAMTRAIN_TRAINER__TARGET_SCALE": "1,2", "STREAMTRAIN_TRAINER__TARGET_WIDTH": "2"})
    assert env.trainer.target_scale == (1.0, 2.0)


@pytest.mark.parametrize(("sets", "words"), [
    ({"trainer.target_shift": [0, 1]}, "target_shift has 2 values but target_width is 1"),
    ({"trainer.target_scale": [1, 0, 2], "trainer.target_width": 3}, "value 1 (0.0) is not above 0"),
    ({"trainer.target_scale": "nan"}, "nan is not finite"),
    ({"trainer.objective": "multilabel", "trainer.num_tags": 3, "trainer.target_names": "a,b"},
     "target_names has 2 names but num_tags is 3"),
])
def test_a_shift_or_scale_that_does_not_fit_is_refused_naming_it(sets: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match="trainer") as excinfo:
        load_config(env={}, overrides=sets)
    assert words in str(excinfo.value)


@pytest.mark.parametrize("shift", [3.0, (3.0, -1.0)])
def test_a_model_version_keeps_its_shift_and_scale_whether_one_number_or_a_list(tmp_path: Path,
                                                                                 shift: object) -> None:
    from streamtrain.versions import load_model, spec_for, write_version

    config = VECTOR.model_copy(update={"target_width": 2, "target_shift": shift, "target_scale": 2.0,
                                       "precision": "float32"})
    spec = spec_for(config, job="j", version=1, step=5, class_names=None, offsets={"0": 5}, metrics={})
    write_version(tmp_path, spec, build_model(config).state_dict())  # a scalar one is what older versions hold
    assert load_model(tmp_path).config.target_shift == shift


def test_an_objective_of_ones_own_standardises_and_scores_its_baseline_by_the_contract(tmp_path: Path) -> None:
    config = TrainerConfig(objective="objective_plugins:Standardised", num_features=1, target_shift=20.0,
                           target_scale=10.0, precision="float64")
    objective = build_objective(config)
    batch = collate_packed(_samples([[30.0], [10.0]]), config)
    assert objective.losses(torch.tensor([[1.0], [-1.0]], dtype=torch.float64), batch).tolist() == [0.0, 0.0]
    outputs = torch.zeros(2, 1, dtype=torch.float64)
    assert objective.summarise(_sums(objective, outputs, batch))["baseline_mae"] == 20.0  # no target trained yet
    objective.observe(batch)  # training: None is the objective's own state, what this rank trained so far
    assert objective.summarise(_sums(objective, outputs, batch))["baseline_mae"] == 10.0  # the mean, 20
    fleet = torch.tensor([4.0, 4 * 30.0], dtype=torch.float64)  # as the held-out evaluation passes it
    assert objective.summarise(_sums(objective, outputs, batch, fleet))["baseline_mae"] == 10.0  # the mean, 30
    np.savez(tmp_path / "held.npz", x=np.zeros((6, 1), np.float32), sizes=np.array([3, 3]), y=np.array([30.0, 30.0]))
    one = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
    held = HeldOutEvaluator(config.model_copy(update={"eval_path": tmp_path / "held.npz"}), one, collate_packed,
                            objective=objective)
    result = held.evaluate(build_model(config, 1), step=1)
    assert result.metrics["baseline_mae"] == 10.0  # scored with the state trained so far (the mean, 20)


def test_an_objective_without_baseline_state_is_given_none_at_held_out_time(tmp_path: Path) -> None:
    config = TrainerConfig(objective="objective_plugins:Pinball", num_features=1, precision="float64",
                           eval_path=tmp_path / "held.npz")
    np.savez(tmp_path / "held.npz", x=np.zeros((6, 1), np.float32), sizes=np.array([3, 3]), y=np.array([1.0, 2.0]))
    objective = build_objective(config)
    given: list[object] = []
    scored = objective.metric_sums
    objective.metric_sums = lambda o, b, baseline=None: given.append(baseline) or scored(o, b, baseline)  # type: ignore[method-assign]
    one = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
    HeldOutEvaluator(config, one, collate_packed, objective=objective).evaluate(build_model(config, 1), step=1)
    assert given == [None]  # not an empty tensor: it keeps no baseline
