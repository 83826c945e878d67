"""Class names to label numbers: one list for a training split and its held-out split, whatever each holds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamtrain.config import StreamtrainConfig
from streamtrain.config.loader import load_config
from streamtrain.datasets import DatasetError, load_dataset


def _class_dirs(root: Path, classes: list[str], per_class: int = 2) -> Path:
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            np.save(root / c / f"{i}.npy", np.full((3 + i, 2), float(i), dtype=np.float32))
    return root


def _by_class(dataset_path: Path, names: tuple[str, ...] | None = None) -> dict[str, set[int]]:
    """Each class directory's labels, as a load numbers them."""
    ds = load_dataset(dataset_path, class_names=names)
    out: dict[str, set[int]] = {}
    for source, label in zip(ds.sources, ds.labels.tolist(), strict=True):
        out.setdefault(Path(source).parent.name, set()).add(label)
    return out


def test_a_held_out_split_lacking_a_class_numbers_the_rest_as_the_training_split_does(tmp_path: Path) -> None:
    train = load_dataset(_class_dirs(tmp_path / "train", ["cat", "dog", "fox"]))
    assert train.class_names == ("cat", "dog", "fox")
    held = _class_dirs(tmp_path / "test", ["cat", "fox"])
    # Read apart, fox is 1 here and 2 in the training split: what one list of names is for.
    assert _by_class(held) == {"cat": {0}, "fox": {1}}
    assert _by_class(held, train.class_names) == {"cat": {0}, "fox": {2}}
    assert load_dataset(held, class_names=train.class_names).class_names == ("cat", "dog", "fox")


def test_ts_files_are_numbered_by_class_name_not_by_each_files_declared_order(tmp_path: Path) -> None:
    (tmp_path / "A_TRAIN.ts").write_text("@univariate true\n@classLabel true a b c\n@data\n1,2:a\n3,4:b\n5,6:c\n")
    (tmp_path / "A_TEST.ts").write_text("@univariate true\n@classLabel true c a\n@data\n1,2:a\n3,4:c\n")
    train = load_dataset(tmp_path / "A_TRAIN.ts")
    assert train.labels.tolist() == [0, 1, 2] and train.class_names == ("a", "b", "c")
    assert load_dataset(tmp_path / "A_TEST.ts").labels.tolist() == [1, 0]  # its own order: c=0, a=1
    test = load_dataset(tmp_path / "A_TEST.ts", class_names=train.class_names)
    assert test.labels.tolist() == [0, 2]
    # Two files of one directory that declare their classes in other orders share one numbering too.
    both = load_dataset(tmp_path)
    names = both.class_names
    assert names is not None
    assert sorted((names[y], s.shape[0]) for s, y in zip(both.samples, both.labels.tolist(), strict=True)) == [
        ("a", 2), ("a", 2), ("b", 2), ("c", 2), ("c", 2)]


def test_a_class_outside_the_configured_names_skips_its_file_naming_the_setting(tmp_path: Path) -> None:
    _class_dirs(tmp_path, ["cat", "owl"])
    ds = load_dataset(tmp_path, class_names=("owl", "cat", "dog"))
    assert ds.labels.tolist() == [1, 1, 0, 0] and ds.class_names == ("owl", "cat", "dog")
    with pytest.raises(DatasetError, match=r"class 'cat' is not one of producer.dataset.class_names \(owl dog\)"):
        load_dataset(_class_dirs(tmp_path / "cats", ["cat"], per_class=1), class_names=("owl", "dog"))
    partly = load_dataset(tmp_path, class_names=("owl",))
    assert len(partly) == 2 and {Path(s.path).parent.name for s in partly.skipped} == {"cat"}


def test_text_labels_in_csv_and_npz_are_class_names(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("sample,label,f\n1,spam,0.1\n1,spam,0.2\n2,ham,0.3\n3,eggs,0.4\n")
    csv_ds = load_dataset(tmp_path / "d.csv")
    assert csv_ds.labels.tolist() == [0, 1, 2] and csv_ds.class_names == ("spam", "ham", "eggs")
    assert load_dataset(tmp_path / "d.csv", class_names=("eggs", "ham", "spam")).labels.tolist() == [2, 1, 0]
    np.savez(tmp_path / "n.npz", x=np.ones((3, 4, 2)), y=np.array(["ham", "spam", "ham"]))
    assert load_dataset(tmp_path / "n.npz", class_names=("eggs", "ham", "spam")).labels.tolist() == [1, 2, 1]
    # Integer labels stay the numbers they are, with names configured or not.
    np.savez(tmp_path / "i.npz", x=np.ones((2, 4, 2)), y=np.array([4, 0]))
    assert load_dataset(tmp_path / "i.npz", class_names=("a", "b")).labels.tolist() == [4, 0]
    assert load_dataset(tmp_path / "i.npz").class_names is None


def test_labels_that_are_numbers_and_names_at_once_need_the_names_configured(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("label,f\n0,0.1\ncat,0.2\n")
    with pytest.raises(DatasetError, match=r"some labels are numbers and some are class names .*class_names"):
        load_dataset(tmp_path / "d.csv")
    assert load_dataset(tmp_path / "d.csv", class_names=("cat", "0")).labels.tolist() == [1, 0]


def test_a_skipped_file_leaves_no_class_name_behind(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("label,f\nham,0.1\nspam,0.2\n")
    (tmp_path / "b.csv").write_text("label,f\nowl,0.1\ncat,oops\n")  # skipped: a feature is not a number
    ds = load_dataset(tmp_path)
    assert ds.class_names == ("ham", "spam") and [Path(s.path).name for s in ds.skipped] == ["b.csv"]


def test_values_beyond_float32_are_refused_by_name_not_published_as_infinity(tmp_path: Path) -> None:
    np.savez(tmp_path / "big.npz", x=np.array([[1.0], [1e300]]), y=np.array(0))
    np.savez(tmp_path / "ok.npz", x=np.array([[1.0], [2.0]]), y=np.array(0))
    ds = load_dataset(tmp_path)
    left = ds.skipped_samples  # left out on its own, named by its file and index (the file's others would load)
    assert len(ds) == 1 and "beyond float32's range" in left[0].reason and left[0].path.endswith("big.npz")
    (tmp_path / "big.ts").write_text("@univariate true\n@classLabel true a\n@data\n1,2:a\n1e39,2:a\n")
    with pytest.raises(DatasetError, match=r"big.ts:.*line 5: a value of 1e\+39 is beyond float32's range"):
        load_dataset(tmp_path / "big.ts")


def test_class_names_setting_refuses_empty_or_repeated_names() -> None:
    cfg: StreamtrainConfig = load_config(env={}, overrides={"producer.dataset.class_names": [" cat", "dog "]})
    assert cfg.producer.dataset.class_names == ("cat", "dog")
    as_text = load_config(env={"STREAMTRAIN_PRODUCER__DATASET__CLASS_NAMES": "owl, cat"}, overrides={})
    assert as_text.producer.dataset.class_names == ("owl", "cat")  # one string, as the environment gives it
    for bad, words in (([], "at least one"), (["a", " "], "none of them empty"), (["a", "b", "a"], "a named more")):
        with pytest.raises(Exception, match=words):
            load_config(env={}, overrides={"producer.dataset.class_names": bad})


def test_csv_recordings_in_class_directories_take_their_directorys_class(tmp_path: Path) -> None:
    """One recording per CSV, a folder per class (a common way to keep them): each file is a sample of its folder's
    class, not an unlabelled series to forecast. A CSV with its own label column keeps its own labels."""
    rng = np.random.default_rng(0)
    for cls, count in (("walk", 3), ("run", 2)):
        (tmp_path / cls).mkdir()
        for i in range(count):
            np.savetxt(tmp_path / cls / f"rec{i}.csv", rng.standard_normal((20 + i, 2)), delimiter=",",
                       header="ax,ay", comments="")
    (tmp_path / "run" / "labelled.csv").write_text("sample,label,ax,ay\n0,walk,0.1,0.2\n0,walk,0.3,0.4\n")
    ds = load_dataset(tmp_path)
    assert ds.class_names == ("run", "walk") and len(ds) == 6
    by_file = {Path(source).name + "@" + Path(source).parent.name: label
               for source, label in zip(ds.sources, ds.labels.tolist(), strict=True)}
    assert by_file == {"rec0.csv@run": 0, "rec1.csv@run": 0, "labelled.csv@run": 1, "rec0.csv@walk": 1,
                       "rec1.csv@walk": 1, "rec2.csv@walk": 1}
    assert sorted(ds.sizes.tolist()) == [2, 20, 20, 21, 21, 22]
