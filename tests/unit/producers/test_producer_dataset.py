"""Reading datasets from disk, and sharding them across devices."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamtrain.datasets import DatasetError, load_dataset
from streamtrain.producers.sharding import (
    distribution_aware_shards,
    kmeans,
    pca,
    random_shards,
    shard,
    stratified_shards,
)
from streamtrain.producers.sources import DatasetSource


def test_class_directories_label_npy_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (tmp_path / cls).mkdir()
        for i in range(3):
            np.save(tmp_path / cls / f"{i}.npy", rng.standard_normal((5 + i, 4)).astype(np.float32))
    ds = load_dataset(tmp_path)
    assert len(ds) == 6 and sorted(ds.labels.tolist()) == [0, 0, 0, 1, 1, 1]
    assert sorted(ds.sizes.tolist()) == [5, 5, 6, 6, 7, 7]


def test_npz_layouts(tmp_path: Path) -> None:
    np.savez(tmp_path / "one.npz", x=np.ones((4, 3)), y=7)
    np.savez(tmp_path / "batch.npz", data=np.zeros((5, 2, 3)), labels=np.arange(5))
    np.savez(tmp_path / "ragged.npz", x=np.ones((10, 3)), y=np.array([1, 2, 3]), sizes=np.array([2, 3, 5]))
    ds = load_dataset(tmp_path)
    assert len(ds) == 9 and not ds.skipped
    by_file = {Path(s).name for s in ds.sources}
    assert by_file == {"one.npz", "batch.npz", "ragged.npz"}
    ragged = [s.shape[0] for s, src in zip(ds.samples, ds.sources, strict=True) if src.endswith("ragged.npz")]
    assert ragged == [2, 3, 5]
    assert all(s.dtype == np.float32 for s in ds.samples)  # float64 is narrowed for the wire


def test_csv_rows_group_into_samples(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("sample,label,a,b\n0,1,0.1,0.2\n0,1,0.3,0.4\n1,0,1,2\n2,1,5,6\n2,1,7,8\n2,1,9,9\n")
    ds = load_dataset(tmp_path / "d.csv")
    assert ds.sizes.tolist() == [2, 1, 3] and ds.labels.tolist() == [1, 0, 1]
    assert np.allclose(ds.samples[0], [[0.1, 0.2], [0.3, 0.4]])


def test_one_bad_file_is_skipped_and_reported(tmp_path: Path) -> None:
    np.savez(tmp_path / "good.npz", x=np.ones((4, 2, 3)), y=np.arange(4))
    (tmp_path / "broken.npy").write_bytes(b"\x93NUMPY garbage")
    (tmp_path / "bad.csv").write_text("label,a\n1,0.5\nx,oops\n")
    np.savez(tmp_path / "nan.npz", x=np.full((2, 3), np.nan), y=1)
    np.savez(tmp_path / "wide.npz", x=np.ones((3, 2, 5)), y=np.arange(3))
    ds = load_dataset(tmp_path)
    assert len(ds) == 4
    reasons = {Path(s.path).name: s.reason for s in ds.skipped}
    assert set(reasons) == {"broken.npy", "bad.csv", "wide.npz"}
    assert "line 3" in reasons["bad.csv"] and "shape" in reasons["wide.npz"]
    # A sample holding NaN is left out on its own, named by its file and index (its file's others would load).
    nan, = ds.skipped_samples
    assert Path(nan.path).name == "nan.npz" and nan.index == 0 and "NaN" in nan.reason


def test_nothing_usable_is_an_error_naming_the_path(tmp_path: Path) -> None:
    (tmp_path / "bad.npy").write_text("not numpy")
    with pytest.raises(DatasetError, match="no usable samples"):
        load_dataset(tmp_path)
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="holds no"):
        load_dataset(tmp_path / "empty")


def test_random_shards_partition_the_dataset() -> None:
    plan = random_shards(103, 4, np.random.default_rng(0))
    together = np.sort(np.concatenate(plan.shards))
    assert together.tolist() == list(range(103))
    assert {len(s) for s in plan.shards} <= {25, 26}


def test_stratified_shards_keep_class_proportions() -> None:
    labels = np.repeat(np.arange(3), [60, 30, 10])  # 60% / 30% / 10%
    plan = stratified_shards(labels, 4, np.random.default_rng(0))
    assert np.sort(np.concatenate(plan.shards)).tolist() == list(range(100))
    for s in plan.shards:
        counts = np.bincount(labels[s], minlength=3)
        assert np.all(np.abs(counts - np.array([15, 7.5, 2.5])) <= 1)  # each class split within one
    assert {len(s) for s in plan.shards} == {25}


def test_pca_and_kmeans_find_separated_clusters() -> None:
    rng = np.random.default_rng(0)
    centres = np.array([[0, 0, 0, 0], [10, 0, 0, 0], [0, 10, 0, 0]], dtype=float)
    truth = np.repeat(np.arange(3), 50)
    x = centres[truth] + rng.standard_normal((150, 4)) * 0.3
    found = kmeans(pca(x, 2), 3, rng)
    for c in range(3):  # each true cluster maps to one found cluster
        assert len(set(found[truth == c].tolist())) == 1
    assert len(set(found.tolist())) == 3


def test_distribution_aware_broadcasts_sparse_neighbourhoods() -> None:
    rng = np.random.default_rng(2)
    dense = [rng.standard_normal((4, 3)) * 0.1 + c for c in (0.0, 20.0) for _ in range(40)]
    isolated = [np.full((4, 3), v) + rng.standard_normal((4, 3)) * 0.01 for v in (-60.0, -60.0, 80.0)]
    samples = [a.astype(np.float32) for a in dense + isolated]
    plan = distribution_aware_shards(samples, devices=4, rng=rng, neighbourhoods=4, pca_components=4)
    outliers = {80, 81, 82}
    assert set(plan.broadcast.tolist()) == outliers
    for s in plan.shards:
        assert outliers <= set(s.tolist())  # every device gets every sparse neighbourhood
    dense_assigned = np.sort(np.concatenate([np.setdiff1d(s, plan.broadcast) for s in plan.shards]))
    assert dense_assigned.tolist() == list(range(80))  # dense ones are split, each sample once
    assert {len(np.setdiff1d(s, plan.broadcast)) for s in plan.shards} == {20}


def test_distribution_aware_handles_variable_lengths() -> None:
    rng = np.random.default_rng(0)
    samples = [rng.standard_normal((int(n), 3)).astype(np.float32) for n in rng.integers(2, 30, size=60)]
    plan = shard("distribution-aware", samples, np.zeros(60, dtype=np.int64), 3, rng, neighbourhoods=3)
    assert set(np.concatenate(plan.shards).tolist()) == set(range(60))


def test_dataset_source_replays_a_shard_then_loops_or_ends(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", x=np.arange(12, dtype=np.float32).reshape(6, 2, 1), y=np.arange(6))
    ds = load_dataset(tmp_path)
    plan = random_shards(6, 2, np.random.default_rng(0))
    once = DatasetSource(ds, plan, seed=0, loop=False)
    got = once.take(0, 10)
    assert len(got) == 3 and once.exhausted(0)
    assert sorted(d.label for d in got if d.label is not None) == sorted(ds.labels[plan.shards[0]].tolist())
    looping = DatasetSource(ds, plan, seed=0, loop=True)
    assert len(looping.take(1, 10)) == 10 and not looping.exhausted(1)
