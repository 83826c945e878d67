"""`up --dataset` reads the objective from the data, and checks one that is set against it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from streamtrain.config import StreamtrainConfig
from streamtrain.config.loader import load_config
from streamtrain.datasets import hold_out, load_dataset
from streamtrain.stack.replay import resolve_replay

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


def _npz(path: Path, targets: np.ndarray | None = None, sizes: list[int] | None = None) -> Path:
    """Series of 2 features with a target per sample (none without `targets`)."""
    sizes = sizes or [5] * (len(targets) if targets is not None else 6)
    arrays = {"x": np.ones((sum(sizes), 2), np.float32), "sizes": np.array(sizes)}
    np.savez(path, **arrays, **({"y": targets} if targets is not None else {}))  # type: ignore[arg-type]
    return path


def test_a_vector_target_is_standardised_value_by_value(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    targets = np.stack([rng.normal(5000, 1000, 200), rng.normal(0.01, 0.002, 200), rng.normal(1, 0.5, 200)], axis=1)
    path = _npz(tmp_path / "scaled.npz", targets)
    replay = resolve_replay(str(path), _config(), workdir=tmp_path / "run")
    shift, scale = replay.settings["trainer.target_shift"], replay.settings["trainer.target_scale"]
    assert isinstance(shift, list) and isinstance(scale, list) and len(shift) == len(scale) == 3
    # A file without a held-out set has a quarter held out: the standardisation is the training side's alone.
    trained = targets[hold_out(load_dataset(path), 0.25).train]  # type: ignore[union-attr]
    assert replay.samples == len(trained) == 150 and replay.held_out == str(tmp_path / "run" / "scaled_TEST.npz")
    assert shift == pytest.approx(trained.mean(axis=0), rel=1e-5)
    assert scale == pytest.approx(trained.std(axis=0), rel=1e-5)
    cfg = _config(**{k: v for k, v in replay.settings.items() if k.startswith("trainer.")})
    assert cfg.trainer.target_shift == tuple(shift)  # as every service reads them


def test_an_objective_of_ones_own_gets_the_targets_width_and_standardisation(tmp_path: Path) -> None:
    targets = np.linspace(10.0, 50.0, 12)
    held = _npz(tmp_path / "held.npz", targets[:3])  # named: the whole file trains
    replay = resolve_replay(str(_npz(tmp_path / "mine.npz", targets)),
                            _config(**{"trainer.objective": "objective_plugins:Pinball",
                                       "trainer.eval_path": str(held)}))
    assert replay.objective == "objective_plugins:Pinball"
    assert replay.objective_why == ("yours, set by trainer.objective; the data carries a float target of 1 value per "
                                    "sample")
    settings = replay.settings
    assert settings["trainer.target_width"] == 1 and settings["trainer.target_shift"] == pytest.approx(30.0)
    assert settings["trainer.target_scale"] == pytest.approx(float(targets.std()), rel=1e-5)


def test_the_objective_says_whether_it_was_read_from_the_data_or_set() -> None:
    assert resolve_replay(str(TECATOR), _config()).objective_why == (
        "read from the data: a float target of 1 value per sample")
    forecast = resolve_replay(str(TECATOR), _config(**{"trainer.objective": "forecast", "trainer.horizon": 8}))
    assert forecast.objective_why == "set by trainer.objective; the data carries a float target of 1 value per sample"


def test_a_set_multilabel_objective_trains_the_tags_and_names_the_samples_it_cannot(tmp_path: Path) -> None:
    tags = np.array([[1, 0, 1, 0]] * 10, dtype=np.float64)
    tags[3, 2] = 2.0
    path = _npz(tmp_path / "tags.npz", tags)
    held = str(_npz(tmp_path / "held.npz", tags[:2]))  # named: the whole file trains
    inferred = resolve_replay(str(path), _config(**{"trainer.eval_path": held}))
    assert inferred.objective == "regression"  # not every value is 0 or 1: the data alone says regression ...
    assert "sample 3 (of " in inferred.warnings[0] and "--set trainer.objective=multilabel" in inferred.warnings[0]
    chosen = resolve_replay(str(path), _config(**{"trainer.objective": "multilabel", "trainer.eval_path": held}))
    assert chosen.objective == "multilabel" and chosen.settings["trainer.num_tags"] == 4  # ... set, it trains
    assert chosen.warnings == (f"1 of 10 samples holds a target value outside [0, 1], the first sample 3 (of {path}) "
                               "holds 2: dead-lettered as target-range as they arrive, the rest trained as tags",)
    tags[:6, 0] = 5.0
    with pytest.raises(ValueError, match=r"trainer.objective is multilabel, but 6 of 10 samples hold a target value "
                                         r"outside \[0, 1\] \(a tag is 1 or 0\), the first sample 0"):
        resolve_replay(str(_npz(tmp_path / "mostly.npz", tags)),
                       _config(**{"trainer.objective": "multilabel", "trainer.eval_path": held}))


def test_csv_target_columns_name_the_values_in_the_metrics(tmp_path: Path) -> None:
    rows = ["sample,a,fat,water"] + [f"s{i},{j},{10 + i},{0.1 * i}" for i in range(6) for j in range(3)]
    (tmp_path / "d_TRAIN.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "d_TEST.csv").write_text("\n".join(rows[:7]) + "\n")
    replay = resolve_replay(str(tmp_path / "d_TRAIN.csv"),
                            _config(**{"producer.dataset.target_columns": "fat,water"}))
    assert replay.settings["trainer.target_names"] == ["fat", "water"] and replay.settings["trainer.target_width"] == 2
    assert replay.held_out == str(tmp_path / "d_TEST.csv")  # the _TEST file beside it, whatever the format


@pytest.mark.parametrize(("train", "test"), [("Reg_TRAIN.npz", "Reg_TEST.npz"), ("reg_train.npz", "reg_test.npz"),
                                             ("Reg_TRAIN.npz", None)])
def test_the_held_out_set_beside_a_training_file_of_any_format(tmp_path: Path, train: str, test: str | None) -> None:
    _npz(tmp_path / train, np.arange(6.0))
    if test is not None:
        _npz(tmp_path / test, np.arange(4.0))
    replay = resolve_replay(str(tmp_path / train), _config())
    assert replay.held_out == (str(tmp_path / test) if test else None)
    assert replay.settings.get("trainer.eval_path") == (str(tmp_path / test) if test else None)


def test_a_forecast_horizon_most_series_are_too_short_for_is_said_before_the_run(tmp_path: Path) -> None:
    path = _npz(tmp_path / "series.npz", sizes=[5, 6, 7, 40])
    replay = resolve_replay(str(path), _config(**{"trainer.horizon": 8}))
    assert replay.objective == "forecast" and "3 of 4 series are no longer than trainer.horizon=8" in replay.warnings[0]
    assert resolve_replay(str(path), _config(**{"trainer.horizon": 4})).warnings == ()


def test_samples_whose_target_is_not_finite_are_left_out_and_said_so(tmp_path: Path) -> None:
    targets = np.arange(8.0)
    targets[[2, 5]] = np.nan
    replay = resolve_replay(str(_npz(tmp_path / "nan.npz", targets)), _config())
    assert replay.samples == 6 and replay.warnings == (
        f"2 samples left out: target holds NaN, infinity or a value beyond float32's range ({tmp_path / 'nan.npz'}: "
        "samples 2, 5)",)


def test_up_checks_an_objective_of_ones_own_before_it_starts_anything(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from streamtrain.cli import app

    path = _npz(tmp_path / "mine_TRAIN.npz", np.linspace(10.0, 50.0, 12))
    _npz(tmp_path / "mine_TEST.npz", np.linspace(10.0, 50.0, 3))  # the held-out set beside it: the whole file trains
    sets = ["--set", "trainer.objective=objective_plugins:NegativeSum"]
    result = CliRunner().invoke(app, [*sets, "up", "--dataset", str(path), "--out", str(tmp_path / "run")],
                                env={"COLUMNS": "300"})
    said = " ".join(result.output.split())
    assert result.exit_code == 2, said
    assert "objective: objective_plugins:NegativeSum (yours, set by trainer.objective; the data carries" in said
    assert "set from the data: trainer.target_width=1, trainer.target_shift=30.0, trainer.target_scale=" in said
    assert "trainer.objective: 'objective_plugins:NegativeSum' returned negative metric sums" in said
    assert not (tmp_path / "run").exists()  # no broker, no rank: nothing was started


def test_a_target_of_a_few_whole_numbers_trains_as_regression_and_says_how_to_train_classes(tmp_path: Path) -> None:
    rows = ["a,b,species"] + [f"{i % 7},{i % 5},{i % 3}" for i in range(60)]
    (tmp_path / "iris_TRAIN.csv").write_text("\n".join(rows) + "\n")
    replay = resolve_replay(str(tmp_path / "iris_TRAIN.csv"),
                            _config(**{"producer.dataset.target_columns": "species"}))
    assert replay.objective == "regression"  # as asked: the column was named as a target
    assert replay.warnings == ("the target 'species' holds 3 distinct whole numbers only (0, 1, 2): trained as "
                               "regression (a number between them is a valid answer); if they are classes, read the "
                               "column as labels: --set producer.dataset.label_column=species (without "
                               "producer.dataset.target_columns)",)
    labels = resolve_replay(str(tmp_path / "iris_TRAIN.csv"), _config(**{"producer.dataset.label_column": "species"}))
    assert labels.objective == "classification" and labels.settings["trainer.num_classes"] == 3  # the way it says
    # Counts, prices, measurements: many distinct values, or whole numbers too few times each, say nothing.
    assert resolve_replay(str(_npz(tmp_path / "counts.npz", np.arange(60.0) % 30)), _config()).warnings == ()
    assert resolve_replay(str(_npz(tmp_path / "halves.npz", np.arange(60.0) % 3 / 2)), _config()).warnings == ()
