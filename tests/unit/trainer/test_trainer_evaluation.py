"""Held-out evaluation on one rank: which samples, how they are split over ranks, and set-up errors by setting."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain.config.producer import DatasetConfig
from streamtrain.config.trainer import TrainerConfig
from streamtrain.datasets import stratified_subset
from streamtrain.models.batching import collate_packed
from streamtrain.models.plugins import build_model
from streamtrain.trainer.distributed import DistContext
from streamtrain.trainer.errors import TrainerSetupError
from streamtrain.trainer.evaluation import HeldOutEvaluator, deal_by_size, held_out_source

ONE = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")


def write_npz(path: Path, n: int, features: int = 2, classes: int = 3, label_shift: int = 0) -> Path:
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 20, n)
    np.savez(path, x=rng.standard_normal((int(sizes.sum()), features)).astype(np.float32),
             y=(np.arange(n) % classes) + label_shift, sizes=sizes)
    return path


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=200), st.integers(1, 250))
def test_stratified_subset_keeps_class_shares(labels: list[int], n: int) -> None:
    y = np.asarray(labels)
    picked = stratified_subset(y, n)
    assert len(picked) == min(n, len(y)) and len(set(picked.tolist())) == len(picked)
    for c in np.unique(y):
        share = n * np.sum(y == c) / len(y)
        assert np.sum(y[picked] == c) >= min(np.floor(share), np.sum(y == c))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 1500), min_size=0, max_size=300), st.integers(1, 8))
def test_dealing_by_size_covers_everything_once_and_evens_the_totals(sizes: list[int], world: int) -> None:
    arr = np.asarray(sizes, dtype=np.int64)
    parts = [deal_by_size(arr, r, world) for r in range(world)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(sizes)))
    totals = [int(arr[p].sum()) for p in parts]
    assert max(totals) - min(totals) <= (max(sizes) if sizes else 0)


def test_one_rank_evaluates_the_whole_set(tmp_path: Path) -> None:
    config = TrainerConfig(num_features=2, num_classes=3, eval_path=write_npz(tmp_path / "h.npz", 30),
                           eval_batch_size=40)
    evaluator = HeldOutEvaluator(config, ONE, collate_packed)
    assert evaluator.total == evaluator.own_samples == 30 and len(evaluator.batches) > 1  # split by total size
    model = build_model(config)
    result = evaluator.evaluate(model, step=5)
    assert result.step == 5 and result.samples == 30 and 0.0 <= result.accuracy <= 1.0 and result.loss > 0
    assert model.training  # handed back in training mode
    capped = HeldOutEvaluator(config.model_copy(update={"eval_max_samples": 9}), ONE, collate_packed)
    assert capped.total == 9


def test_plaid_test_split_is_the_packaged_held_out_set() -> None:
    config = TrainerConfig(model="seq", num_features=1, num_classes=11, eval_packaged="plaid", eval_max_samples=50)
    name, path, setting = held_out_source(config) or ("", Path(), "")
    assert name == "plaid" and path.name == "PLAID_TEST.ts" and setting == "trainer.eval_packaged"
    assert held_out_source(TrainerConfig()) is None
    assert HeldOutEvaluator(config, ONE, collate_packed).total == 50


@pytest.mark.parametrize(("update", "words"), [
    ({"num_features": 5}, "trainer.eval_path: held-out samples have shape (size, 2); the model takes (size, 5)"),
    ({"num_classes": 2}, "trainer.eval_path: held-out label 2 is not below trainer.num_classes (2)"),
])
def test_a_held_out_set_that_does_not_fit_the_model_fails_at_start(tmp_path: Path, update: dict[str, int],
                                                                     words: str) -> None:
    config = TrainerConfig(num_features=2, num_classes=3, eval_path=write_npz(tmp_path / "h.npz", 10))
    with pytest.raises(TrainerSetupError, match=words.replace("(", r"\(").replace(")", r"\)")):
        HeldOutEvaluator(config.model_copy(update=update), ONE, collate_packed)


def test_missing_or_unlabelled_held_out_files_name_the_setting(tmp_path: Path) -> None:
    with pytest.raises(TrainerSetupError, match=r"^trainer.eval_path: dataset .*nope.ts does not exist"):
        HeldOutEvaluator(TrainerConfig(eval_path=tmp_path / "nope.ts"), ONE, collate_packed)
    (tmp_path / "u.ts").write_text("@univariate true\n@classLabel false\n@data\n1,2,3\n")
    with pytest.raises(TrainerSetupError, match="unlabelled"):
        HeldOutEvaluator(TrainerConfig(num_features=1, eval_path=tmp_path / "u.ts"), ONE, collate_packed)


def test_the_held_out_set_is_read_as_the_replayed_dataset_is(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The producers' reading settings (CSV columns, class names) apply to the held-out set too."""
    (tmp_path / "h.csv").write_text("kind,f1,f2\nowl,0.1,0.2\ncat,0.3,0.4\nowl,0.5,0.6\n")
    config = TrainerConfig(num_features=2, num_classes=2, eval_path=tmp_path / "h.csv")
    reading = DatasetConfig(label_column="kind", sample_column=None, class_names=("cat", "owl"))
    evaluator = HeldOutEvaluator(config, ONE, collate_packed, reading)
    assert sorted(int(y) for b in evaluator.batches for y in b.labels) == [0, 1, 1]
    with pytest.raises(TrainerSetupError, match=r"trainer.eval_path: .*no 'label' column"):
        HeldOutEvaluator(config, ONE, collate_packed)  # read with the defaults, as before the fix
    with pytest.raises(TrainerSetupError, match=r"class 'owl' is not one of producer\.dataset\.class_names"):
        HeldOutEvaluator(config, ONE, collate_packed, reading.model_copy(update={"class_names": ("cat",)}))
    with caplog.at_level("WARNING", logger="streamtrain.trainer.evaluation"):
        HeldOutEvaluator(config, ONE, collate_packed, reading.model_copy(update={"class_names": None}))
    assert "numbers its classes by its own names (owl=0, cat=1)" in caplog.text
    assert "set producer.dataset.class_names" in caplog.text
