"""A dataset without a held-out set: `hold_out` sets a share of its samples aside (by class when labelled),
`write_dataset` writes either side as it loads back, and `up --dataset` trains on one side and evaluates on the
other."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain.config.loader import load_config
from streamtrain.datasets import Dataset, hold_out, load_dataset, subset, write_dataset
from streamtrain.datasets.holdout import MIN_SAMPLES
from streamtrain.stack.replay import resolve_replay


def _dataset(labels: list[int], targets: np.ndarray | None = None, names: tuple[str, ...] | None = None) -> Dataset:
    rng = np.random.default_rng(len(labels))
    samples = [rng.standard_normal((1 + i % 4, 3)).astype(np.float32) for i in range(len(labels))]
    return Dataset(samples, np.asarray(labels, dtype=np.int64), [f"f{i % 2}" for i in range(len(labels))],
                   class_names=names, targets=targets)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=MIN_SAMPLES, max_size=120), st.floats(0.05, 0.6), st.integers(0, 3))
def test_a_share_is_held_out_once_by_class_and_every_class_of_two_keeps_one_to_train_on(
        labels: list[int], share: float, seed: int) -> None:
    data = _dataset(labels)
    split = hold_out(data, share, seed)
    assert split is not None and split.stratified
    both = np.concatenate([split.train, split.held_out])
    assert sorted(both.tolist()) == list(range(len(labels)))  # every sample once
    y = np.asarray(labels)
    classes = np.unique(y)
    want = max(1, round(share * len(labels)))
    assert len(split.held_out) == min(want, len(labels) - len(classes))  # the share, but one of each class
    drawn = len(labels) - len(classes)  # the samples the draw was made from
    for c in classes:
        assert (y[split.train] == c).any()  # no class goes untrained
        # Each class gives at least its share of the draw (the rest of it at random).
        assert (y[split.held_out] == c).sum() >= min(want, drawn) * ((y == c).sum() - 1) // drawn
    again = hold_out(data, share, seed)
    assert again is not None and np.array_equal(again.held_out, split.held_out)  # the seed decides


def test_targets_are_held_out_at_random_and_a_small_or_partly_labelled_dataset_is_not_split() -> None:
    data = _dataset([-1] * 40, targets=np.arange(40.0).reshape(40, 1))
    split = hold_out(data, 0.25, 0)
    assert split is not None and not split.stratified and len(split.held_out) == 10 and len(split.train) == 30
    assert hold_out(_dataset([-1] * (MIN_SAMPLES - 1), targets=np.zeros((MIN_SAMPLES - 1, 1))), 0.25) is None
    assert hold_out(_dataset([0, 1, -1] * 10), 0.25) is None  # labels on some samples only: not split


@pytest.mark.parametrize("kind", ["numbers", "names", "targets", "labels and targets", "unlabelled"])
def test_a_written_side_loads_back_as_it_was(tmp_path: Path, kind: str) -> None:
    n = 12
    labels = [i % 3 for i in range(n)] if kind in ("numbers", "names", "labels and targets") else [-1] * n
    targets = np.linspace(-1, 1, 2 * n).reshape(n, 2) if "targets" in kind else None
    names = ("zeta", "alpha", "mu") if kind == "names" else None
    data = _dataset(labels, targets, names)
    part = subset(data, np.arange(1, n, 2))
    back = load_dataset(write_dataset(part, tmp_path / "part.npz"), class_names=names)
    assert [s.tolist() for s in back.samples] == [s.tolist() for s in part.samples]  # ragged sizes kept
    assert back.labels.tolist() == part.labels.tolist()  # numbered as the original load numbered them
    assert back.class_names == names
    if targets is None:
        assert back.targets is None
    else:
        np.testing.assert_array_equal(back.targets, part.targets)


def test_up_holds_out_a_quarter_of_a_csv_by_class_and_trains_on_the_rest(tmp_path: Path) -> None:
    rows = ["a,b,label"] + [f"{i},{i % 7},{['cat', 'dog', 'eel'][i % 3]}" for i in range(60)]
    path = tmp_path / "pets.csv"
    path.write_text("\n".join(rows) + "\n")
    replay = resolve_replay(str(path), load_config(env={}), devices=2, workdir=tmp_path / "run")
    train, test = tmp_path / "run" / "pets_TRAIN.npz", tmp_path / "run" / "pets_TEST.npz"
    assert replay.held_out == str(test) and replay.settings["trainer.eval_path"] == str(test)
    assert replay.settings["producer.dataset.path"] == str(train) and replay.samples == 45
    assert replay.held_out_note.startswith("15 of its 60 samples held out at random, class by class "
                                           "(producer.dataset.held_out_share=0.25, producer.seed=0)")
    names = replay.settings["producer.dataset.class_names"]
    assert isinstance(names, list) and sorted(names) == ["cat", "dog", "eel"]
    # Read as the producer and the ranks read them (with the class names up set): 5 of each class held out, and no
    # row on both sides.
    trained, held = (load_dataset(p, class_names=names) for p in (train, test))
    assert np.bincount(held.labels).tolist() == [5, 5, 5] and np.bincount(trained.labels).tolist() == [15, 15, 15]
    original = load_dataset(path, class_names=names)
    as_rows = {(tuple(s.ravel().tolist()), int(y)) for s, y in zip(original.samples, original.labels, strict=True)}
    sides = [{(tuple(s.ravel().tolist()), int(y)) for s, y in zip(d.samples, d.labels, strict=True)}
             for d in (trained, held)]
    assert not sides[0] & sides[1] and sides[0] | sides[1] == as_rows


def test_a_held_out_set_beside_it_keeps_the_file_whole_and_a_tiny_one_says_why(tmp_path: Path) -> None:
    data = _dataset([-1] * 20, targets=np.arange(20.0).reshape(20, 1))
    train = write_dataset(data, tmp_path / "reg_TRAIN.npz")
    alone = resolve_replay(str(train), load_config(env={}), workdir=tmp_path / "a")  # no _TEST beside it yet
    assert alone.samples == 15 and alone.held_out == str(tmp_path / "a" / "reg_TEST.npz")
    write_dataset(subset(data, np.arange(4)), tmp_path / "reg_TEST.npz")
    whole = resolve_replay(str(train), load_config(env={}), workdir=tmp_path / "b")
    assert whole.samples == 20 and whole.held_out == str(tmp_path / "reg_TEST.npz") and not whole.held_out_note
    tiny = write_dataset(subset(data, np.arange(5)), tmp_path / "tiny.npz")
    said = resolve_replay(str(tiny), load_config(env={}), workdir=tmp_path / "c")
    assert said.samples == 5 and said.held_out is None
    assert said.held_out_note == ("none: 5 samples are too few to hold some out (at least 8); name a held-out set "
                                  "with trainer.eval_path")
