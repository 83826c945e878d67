"""`up --dataset` reads the objective from the data, and checks one that is set against it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from stack.replay import resolve_replay
from streamtrain.config import StreamtrainConfig
from streamtrain.config.loader import load_config

SKTIME = Path((importlib.util.find_spec("sktime").submodule_search_locations or [""])[0]) / "datasets" / "data"
TECATOR = SKTIME / "Tecator" / "Tecator_TRAIN.ts"


def _config(**sets: object) -> StreamtrainConfig:
    return load_config(env={}, overrides=sets)


def test_an_archive_regression_problem_is_regression_standardised_by_its_targets() -> None:
    replay = resolve_replay(str(TECATOR), _config(), devices=4)
    assert replay.objective == "regression" and "float target of 1 value" in replay.objective_why
    settings = replay.settings
    assert settings["trainer.objective"] == "regression" and settings["trainer.target_width"] == 1
    assert 15 < float(settings["trainer.target_shift"]) < 22 and 10 < float(settings["trainer.target_scale"]) < 15
    assert Path(str(settings["trainer.eval_path"])) == (SKTIME / "Tecator" / "Tecator_TEST.ts").resolve()
    assert settings["trainer.num_features"] == 1 and "trainer.num_classes" not in settings


@pytest.mark.parametrize(("arrays", "objective", "key", "value"), [
    ({"x": np.ones((6, 5, 2)), "y": np.array([[1, 0, 1], [0, 1, 1]] * 3)}, "multilabel", "trainer.num_tags", 3),
    ({"x": np.ones((6, 5, 2)), "y": np.arange(6.0)}, "regression", "trainer.target_width", 1),
    ({"x": np.ones((6, 5, 2)), "y": np.array([0, 1, 2] * 2)}, "classification", "trainer.num_classes", 3),
    ({"x": np.ones((30, 2)), "sizes": np.array([10, 20])}, "forecast", "trainer.objective", "forecast"),
])
def test_the_objective_follows_what_the_samples_carry(tmp_path: Path, arrays: dict[str, np.ndarray], objective: str,
                                                      key: str, value: object) -> None:
    np.savez(tmp_path / "d.npz", **arrays)  # type: ignore[arg-type]
    replay = resolve_replay(str(tmp_path / "d.npz"), _config())
    assert replay.objective == objective and replay.settings[key] == value


@pytest.mark.parametrize(("sets", "words"), [
    ({"trainer.objective": "classification"}, "trainer.objective is classification, but the data carries a float"),
    ({"trainer.objective": "multilabel"}, "it fits regression: --set trainer.objective=regression"),
    ({"trainer.target_width": 3}, "its targets have 1 values but trainer.target_width is 3"),
    ({"trainer.objective": "forecast", "trainer.horizon": 100}, "none left to forecast trainer.horizon=100"),
])
def test_a_set_objective_that_does_not_fit_the_data_is_refused_naming_the_setting(sets: dict[str, object],
                                                                                   words: str) -> None:
    with pytest.raises(ValueError, match="--dataset") as excinfo:
        resolve_replay(str(TECATOR), _config(**sets))
    assert words in str(excinfo.value)


def test_a_set_objective_that_fits_is_kept_and_its_settings_too() -> None:
    replay = resolve_replay(str(TECATOR), _config(**{"trainer.objective": "forecast", "trainer.horizon": 8}))
    assert replay.objective == "forecast" and "trainer.objective" not in replay.settings
    mine = resolve_replay(str(TECATOR), _config(**{"trainer.target_shift": 1.5}))
    assert "trainer.target_shift" not in mine.settings and "trainer.target_scale" in mine.settings


@pytest.mark.parametrize("name", ["tecator", "covid3month"])
def test_the_archives_regression_problems_are_packaged_with_their_test_split(name: str) -> None:
    replay = resolve_replay(name, _config())
    assert replay.objective == "regression" and replay.held_out == name
    assert replay.settings["producer.dataset.packaged"] == name and replay.settings["trainer.eval_packaged"] == name
