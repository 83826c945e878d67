"""Float targets from disk: the archive's regression problems (`@targetLabel true`), a float `y` in `.npz`, CSV
target columns; and the replay carrying them into every sample it publishes."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from streamtrain.datasets import DatasetError, load_dataset, parse_ts
from streamtrain.producers.sharding import shard
from streamtrain.producers.sources import DatasetSource

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


def test_a_sample_whose_target_is_not_finite_is_left_out_alone_with_its_index(tmp_path: Path) -> None:
    y = np.array([1.0, np.nan, 3.0, np.inf, 5.0])
    np.savez(tmp_path / "nan.npz", x=np.arange(10.0).reshape(10, 1), sizes=np.full(5, 2), y=y)
    ds = load_dataset(tmp_path / "nan.npz")
    assert ds.targets is not None and ds.targets[:, 0].tolist() == [1.0, 3.0, 5.0]
    assert [s.index for s in ds.skipped_samples] == [1, 3] and ds.skipped == []
    assert ds.skipped_samples[0].path == str(tmp_path / "nan.npz") and "NaN" in ds.skipped_samples[0].reason
    assert np.array_equal(ds.samples[1], [[4.0], [5.0]])  # the samples after a bad one keep their own values
    (tmp_path / "d.csv").write_text("sample,a,fat\n0,1,10\n0,2,10\n1,3,nan\n1,4,nan\n2,5,30\n")
    csv = load_dataset(tmp_path / "d.csv", target_columns=("fat",))
    assert csv.sizes.tolist() == [2, 1] and [s.index for s in csv.skipped_samples] == [1]
    (tmp_path / "r.ts").write_text("@univariate true\n@targetLabel true\n@data\n1,2:0.5\n3,4:?\n5,6:nan\n7,8:2.5\n")
    ts = load_dataset(tmp_path / "r.ts")
    assert ts.targets is not None and ts.targets[:, 0].tolist() == [0.5, 2.5]
    assert [s.index for s in ts.skipped_samples] == [1, 2]


def test_a_file_of_only_unusable_targets_is_named_once(tmp_path: Path) -> None:
    np.savez(tmp_path / "NanY_TRAIN.npz", x=np.ones((4, 1)), sizes=np.array([2, 2]), y=np.array([np.nan, np.nan]))
    with pytest.raises(DatasetError) as excinfo:
        load_dataset(tmp_path / "NanY_TRAIN.npz")
    assert str(excinfo.value).count("NanY_TRAIN.npz") == 2  # the dataset, then the sample at fault: not repeated
    assert "NanY_TRAIN.npz sample 0: target holds NaN" in str(excinfo.value)


def test_a_sample_of_one_axis_is_a_series_of_one_feature(tmp_path: Path) -> None:
    np.savez(tmp_path / "uni.npz", x=np.arange(12.0).reshape(3, 4), y=np.array([0.5, 1.5, 2.5]))
    ds = load_dataset(tmp_path / "uni.npz")
    assert [s.shape for s in ds.samples] == [(4, 1)] * 3 and ds.samples[1][:, 0].tolist() == [4.0, 5.0, 6.0, 7.0]


def test_a_csv_as_pandas_writes_it_leaves_out_its_index_and_text_columns(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """sktime's Uschange.csv, as pandas wrote it: an unnamed index column (0, 1, 2, ...) and a quarter as text beside
    the numbers; neither is a feature. A column of numbers with one text cell is an error naming the column."""
    uschange = Path(importlib.util.find_spec("sktime").submodule_search_locations[0]) / "datasets" / "data" / \
        "Uschange" / "Uschange.csv"  # type: ignore[index]
    assert uschange.read_text().startswith(",Quarter,Consumption")
    with caplog.at_level("WARNING"):
        data = load_dataset(uschange, target_columns=("Consumption",))
    assert len(data) == 187 and {s.shape for s in data.samples} == {(1, 4)}  # Income .. Unemployment
    assert data.samples[0][0, 0] == pytest.approx(0.97226104)  # the first feature is Income, not the row number
    said = caplog.text
    assert "column '(unnamed)' left out of the features: it counts the rows (0, 1, 2, ... or 1, 2, 3, ...)" in said
    assert "column 'Quarter' left out of the features: it holds text, not numbers ('1970 Q1', ...)" in said
    (tmp_path / "mixed.csv").write_text("a,b,y\n1,2,0.5\n3,n.a.,0.7\n")
    with pytest.raises(DatasetError, match=r"line 3: a feature is not a number: column 'b' holds 'n.a.'"):
        load_dataset(tmp_path / "mixed.csv", target_columns=("y",))
    (tmp_path / "counted.csv").write_text("obs,a,y\n1,5,0.5\n2,3,0.7\n3,4,0.1\n")  # a named count stays a feature
    assert load_dataset(tmp_path / "counted.csv", target_columns=("y",)).samples[0].shape == (1, 2)
    (tmp_path / "late.csv").write_text("when,a,y\nn/a,1,0.5\nmonday,3,0.7\n")  # text after a missing cell: text
    assert load_dataset(tmp_path / "late.csv", target_columns=("y",)).samples[0].shape == (1, 1)


def test_a_csv_without_the_column_to_learn_says_how_to_name_it(tmp_path: Path) -> None:
    """Without a label, sample or target column a CSV is one series over time (`test_datasets_series`); with a
    sample column, or a text column that repeats as a class does, the column to learn is missing, and said so."""
    (tmp_path / "airline.csv").write_text("sample,Date,Passengers\na,1949-01,112\na,1949-02,118\n")
    with pytest.raises(DatasetError, match=r"no 'label' column \(columns: sample, Date, Passengers\): "
                                           r"producer.dataset.label_column names the column to learn: the class with "
                                           r"--set producer.dataset.label_column=COLUMN, float targets with"):
        load_dataset(tmp_path / "airline.csv")
    with pytest.raises(DatasetError, match=r"no 'fat' column .*: producer.dataset.target_columns names"):
        load_dataset(tmp_path / "airline.csv", target_columns=("fat",))
    (tmp_path / "kinds.csv").write_text("kind,f1\nowl,0.1\ncat,0.3\nowl,0.5\n")
    with pytest.raises(DatasetError, match=r"no 'label' column \(columns: kind, f1\): .*; column 'kind' repeats"):
        load_dataset(tmp_path / "kinds.csv")


@pytest.mark.parametrize(("name", "delimiter"), [("d.csv", ","), ("d.tsv", "\t"), ("semicolons.csv", ";"),
                                                 ("bars.txt", "|")])
def test_a_csv_is_read_with_whichever_delimiter_its_lines_share(tmp_path: Path, name: str, delimiter: str) -> None:
    """A spreadsheet exports `;` where the comma is the decimal mark, and a `.tsv` has tabs: read as they are, not as
    one column named by the whole header line. A quoted cell may hold the delimiter."""
    rows = [["site", "a", "b", "y"], [f"north{delimiter} upper", 1.5, 2, 0.5], ["south", 3, 4.25, 0.7],
            ["east", 5, 6, 0.9]]
    with (tmp_path / name).open("w", newline="") as fh:
        csv.writer(fh, delimiter=delimiter).writerows(rows)
    assert '"north' in (tmp_path / name).read_text()  # the cell holding the delimiter is quoted
    data = load_dataset(tmp_path / name, target_columns=("y",))
    assert len(data) == 3 and {s.shape for s in data.samples} == {(1, 2)}  # a and b; the text column is left out
    assert data.samples[0].tolist() == [[1.5, 2.0]] and data.targets is not None
    assert data.targets.ravel().tolist() == [0.5, 0.7, 0.9]


def test_a_semicolon_csv_with_decimal_commas_reads_its_numbers(tmp_path: Path) -> None:
    """What a spreadsheet exports where the comma is the decimal mark: `;` between cells, `1,5` for 1.5. A text cell
    holding a comma stays text; a file that also writes a decimal point somewhere is left to say which cell is off."""
    (tmp_path / "eu.csv").write_text("site;a;b;y\nnorth, upper;1,5;2;0,5\nsouth;-3,25;4;1e-3\n")
    data = load_dataset(tmp_path / "eu.csv", target_columns=("y",))
    assert [s.tolist() for s in data.samples] == [[[1.5, 2.0]], [[-3.25, 4.0]]]
    assert data.targets is not None and data.targets.ravel().tolist() == [0.5, 0.001]
    (tmp_path / "both.csv").write_text("a;b;y\n1,5;2.5;0\n3;4;1\n")
    with pytest.raises(DatasetError, match=r"line 2: a feature is not a number: column 'a' holds '1,5'"):
        load_dataset(tmp_path / "both.csv", target_columns=("y",))
