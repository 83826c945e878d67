"""Float targets from disk: the archive's regression problems (`@targetLabel true`), a float `y` in `.npz`, CSV
target columns; and the replay carrying them into every sample it publishes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from producers.sharding import shard
from producers.sources import DatasetSource
from streamtrain.datasets import DatasetError, load_dataset, parse_ts

SKTIME = Path((importlib.util.find_spec("sktime").submodule_search_locations or [""])[0]) / "datasets" / "data"


@pytest.mark.parametrize(("name", "count", "length", "low", "high"), [
    ("Covid3Month", 140, 84, 0.0, 0.18), ("Tecator", 172, 100, 0.9, 49.1)])
def test_the_archives_regression_problems_load_with_their_targets(name: str, count: int, length: int, low: float,
                                                                  high: float) -> None:
    ds = load_dataset(SKTIME / name / f"{name}_TRAIN.ts")
    assert len(ds) == count and set(ds.sizes.tolist()) == {length} and (ds.labels == -1).all()
    assert ds.targets is not None and ds.targets.shape == (count, 1)
    assert low <= ds.targets.min() and ds.targets.max() <= high + 1e-9 and ds.targets.std() > 0


def test_a_ts_target_follows_the_values_of_every_dimension() -> None:
    data = parse_ts(["@univariate false", "@dimensions 2", "@targetLabel true", "@data", "1,2,3:4,5,6:0.25",
                     "7,8:9,10:-3e2"])
    assert data.targets is not None and data.targets.tolist() == [0.25, -300.0]
    assert data.series[1].shape == (2, 2) and (data.labels == -1).all()


def test_npz_float_y_and_rows_of_y_are_targets(tmp_path: Path) -> None:
    np.savez(tmp_path / "reg.npz", x=np.ones((10, 2)), y=np.array([0.5, 1.5, 2.5]), sizes=np.array([2, 3, 5]))
    ds = load_dataset(tmp_path / "reg.npz")
    assert ds.sizes.tolist() == [2, 3, 5] and (ds.labels == -1).all()
    assert ds.targets is not None and ds.targets.tolist() == [[0.5], [1.5], [2.5]]
    np.savez(tmp_path / "tags.npz", x=np.zeros((4, 6, 2)), y=np.array([[1, 0, 1], [0, 0, 1], [1, 1, 1], [0, 0, 0]]))
    tags = load_dataset(tmp_path / "tags.npz")
    assert tags.targets is not None and tags.targets.shape == (4, 3) and tags.targets[2].tolist() == [1.0, 1.0, 1.0]
    np.savez(tmp_path / "both.npz", x=np.zeros((2, 5, 1)), y=np.array([3, 1]), targets=np.array([0.1, 0.2]))
    both = load_dataset(tmp_path / "both.npz")
    assert both.labels.tolist() == [3, 1] and both.targets is not None and both.targets[:, 0].tolist() == [0.1, 0.2]


def test_npz_without_labels_is_unlabelled_series_for_a_self_supervised_objective(tmp_path: Path) -> None:
    np.savez(tmp_path / "series.npz", x=np.arange(12.0).reshape(12, 1), sizes=np.array([5, 7]))
    ds = load_dataset(tmp_path / "series.npz")
    assert ds.sizes.tolist() == [5, 7] and ds.labels.tolist() == [-1, -1] and ds.targets is None


def test_csv_target_columns_hold_a_target_per_sample(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("sample,a,b,fat,water\n0,1,2,10.5,60\n0,3,4,10.5,60\n1,5,6,20,50\n")
    ds = load_dataset(tmp_path / "d.csv", target_columns=("fat", "water"))
    assert ds.sizes.tolist() == [2, 1] and (ds.labels == -1).all()
    assert ds.targets is not None and ds.targets.tolist() == [[10.5, 60.0], [20.0, 50.0]]
    assert np.allclose(ds.samples[0], [[1, 2], [3, 4]])  # the target columns are not features
    (tmp_path / "changes.csv").write_text("sample,a,fat\n0,1,10\n0,2,11\n")
    with pytest.raises(DatasetError, match="sample '0' changes target"):
        load_dataset(tmp_path / "changes.csv", target_columns=("fat",))
    with pytest.raises(DatasetError, match="no 'protein' column"):
        load_dataset(tmp_path / "d.csv", target_columns=("protein",))


def test_some_samples_with_a_target_and_some_without_is_an_error(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", x=np.ones((2, 4, 1)), y=np.array([0.5, 1.5]))
    np.savez(tmp_path / "b.npz", x=np.ones((2, 4, 1)), y=np.array([1, 0]))
    with pytest.raises(DatasetError, match="2 of 4 samples carry a float target"):
        load_dataset(tmp_path)


def test_the_replay_carries_each_samples_target() -> None:
    ds = load_dataset(SKTIME / "Tecator" / "Tecator_TRAIN.ts")
    plan = shard("random", ds.samples, ds.labels, 2, np.random.default_rng(0))
    source = DatasetSource(ds, plan, seed=0, loop=False, shuffle=False)
    drafts = source.take(0, 5)
    assert ds.targets is not None
    for i, draft in zip(plan.shards[0][:5], drafts, strict=True):
        assert draft.label is None and draft.target is not None
        assert draft.target.tolist() == ds.targets[i].tolist()
