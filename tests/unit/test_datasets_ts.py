"""The `.ts` reader: real archive files, round trips of generated files, and every malformed input named by line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamtrain.datasets import (
    DatasetError,
    TsFormatError,
    fill_missing,
    load_dataset,
    packaged_file,
    parse_ts,
    read_ts,
)

HEADER = ["# a comment", "@problemName Toy", "@timeStamps false", "@missing true", "@univariate false",
          "@dimensions 2", "@equalLength false", "@classLabel true walk run sit", "@data"]


def write_ts(series: list[np.ndarray], labels: list[str], classes: list[str]) -> list[str]:
    dims = series[0].shape[1]
    lines = ["@problemName Gen", f"@univariate {'true' if dims == 1 else 'false'}", f"@dimensions {dims}",
             "@equalLength false", f"@classLabel true {' '.join(classes)}", "@data"]
    for s, label in zip(series, labels, strict=True):
        parts = [",".join(repr(float(v)) for v in s[:, d]) for d in range(dims)]
        lines.append(":".join([*parts, label]))
    return lines


def test_multivariate_series_with_string_labels_and_missing_values() -> None:
    data = parse_ts([*HEADER, "1,2,3:4,5,6:run", "", "# between", "0.5,?:1,1:sit", "1,2,?:3:walk"], "toy.ts")
    assert data.header.class_names == ("walk", "run", "sit") and data.header.dimensions == 2
    assert data.labels.tolist() == [1, 2, 0]
    assert [s.shape for s in data.series] == [(3, 2), (2, 2), (3, 2)]
    assert data.lines == [10, 13, 14]
    assert np.isnan(data.series[1][1, 0]) and np.isnan(data.series[2][1:, 1]).all()  # the shorter dimension pads
    filled, n = fill_missing(data.series[2])
    assert n == 1 and filled.tolist() == [[1.0, 3.0], [2.0, 3.0]]  # the all-missing last step was padding


def test_fill_missing_cuts_trailing_padding_and_interpolates_gaps() -> None:
    series = np.array([[1.0, np.nan], [np.nan, 2.0], [3.0, 4.0], [np.nan, np.nan]], dtype=np.float32)
    filled, n = fill_missing(series)
    assert filled.tolist() == [[1.0, 2.0], [2.0, 2.0], [3.0, 4.0]] and n == 2


def test_the_installed_plaid_files() -> None:
    train = read_ts(packaged_file("plaid", "train"))
    assert train.header.problem_name == "PLAID" and train.header.class_names == tuple(str(i) for i in range(11))
    lengths = [s.shape[0] for s in train.series]
    assert len(train.series) == 537 and min(lengths) == 100 and max(lengths) == 1344
    assert all(s.shape[1] == 1 and s.dtype == np.float32 for s in train.series)
    test = load_dataset(packaged_file("plaid", "test"))
    assert len(test) == 537 and set(test.labels.tolist()) == set(range(11))


def test_the_installed_unit_test_files_whose_comments_start_with_a_percent_sign() -> None:
    """sktime's UnitTest set (a cut of ChinaTown) opens with `%` comment lines, the archive's ARFF convention."""
    folder = packaged_file("plaid", "train").parent.parent / "UnitTest"
    assert (folder / "UnitTest_TRAIN.ts").read_text().startswith("%")
    train, test = load_dataset(folder / "UnitTest_TRAIN.ts"), load_dataset(folder / "UnitTest_TEST.ts")
    assert (len(train), len(test)) == (20, 22) and set(train.labels.tolist()) == {0, 1}
    assert {s.shape for s in train.samples} == {(24, 1)}
    assert read_ts(folder / "UnitTest_TEST.ts").header.problem_name == "Chinatown"  # its second @problemName
    with pytest.raises(TsFormatError, match="data before @data"):
        parse_ts(["% a comment", "1,2:0"])  # a comment is not a header: the data still needs its @data


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 3), st.lists(st.integers(1, 30), min_size=1, max_size=6), st.integers(0, 2**31 - 1))
def test_round_trip_of_generated_files(dims: int, lengths: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    classes = ["a", "b", "c"]
    series = [rng.standard_normal((n, dims)).astype(np.float32) for n in lengths]
    labels = [classes[int(i)] for i in rng.integers(0, 3, len(lengths))]
    data = parse_ts(write_ts(series, labels, classes))
    assert [classes[i] for i in data.labels] == labels
    for got, want in zip(data.series, series, strict=True):
        np.testing.assert_array_equal(got, want)


# Each malformed file: (lines after a valid univariate header or in place of it, the line named, words of the reason)
MALFORMED = [
    (["@problemName X", "@classLabel true 0 1", "@data", "1,2,x:0"], 4, "'x' is not a number"),
    (["@problemName X", "@classLabel true 0 1", "@data", "1,2,3:7"], 4, "class label '7' is not one of"),
    (["@problemName X", "@classLabel true 0 1", "@data", "1,2,3"], 4, "no class label"),
    (["@univariate true", "@classLabel true 0 1", "@data", "1,2:3,4:0"], 4, "2 dimensions, the header declares 1"),
    (["@classLabel true 0 1", "@data", "1,,3:0"], 3, "'' is not a number"),
    (["@classLabel true 0 1", "@data", ":0"], 3, "dimension 1 is empty"),
    (["@classLabel true 0 1", "@data", "?,?:1"], 3, "every value of the series is missing"),
    (["@classLabel true 0 1", "@data", "1,inf:1"], 3, "is not finite"),
    (["@classLabel true 0 1", "@data", "1,2:1", "1:2,3:0"], 4, "2 dimensions, earlier series have 1"),
    (["@equalLength true", "@seriesLength 3", "@classLabel true 0", "@data", "1,2:0"], 5, "@seriesLength 3"),
    (["@timeStamps true", "@data"], 1, "@timeStamps true is not supported"),
    (["@targetLabel true", "@data", "1,2,3"], 3, "no target value"),
    (["@targetLabel true", "@data", "1,2,3:abc"], 3, "target value 'abc' is not a number"),
    (["@targetLabel true", "@classLabel true 0 1", "@data"], 3, "one label, a class or a target value"),
    (["@univariate maybe", "@data"], 1, "takes true or false"),
    (["@dimensions 0", "@data"], 1, "whole number >= 1"),
    (["@univariate true", "@dimensions 3", "@data"], 3, "contradicts @dimensions 3"),
    (["@classLabel true", "@data"], 1, "names no classes"),
    (["@classLabel true a a", "@data"], 1, "names a class twice"),
    (["@univariate true", "@univariate false", "@data"], 2, "declared twice"),
    (["@clasLabel true 0", "@data"], 1, "unknown header tag @claslabel"),
    (["1,2,3:0"], 1, "data before @data"),
    (["@problemName X", "@classLabel true 0"], 2, "no @data line"),
    (["@classLabel true 0", "@data"], 2, "no series after @data"),
    (["@classLabel true 0", "@data", "1:0", "@problemName late"], 4, "after @data"),
]


@pytest.mark.parametrize(("lines", "line", "reason"), MALFORMED)
def test_malformed_files_name_the_line_and_the_reason(tmp_path: Path, lines: list[str], line: int,
                                                       reason: str) -> None:
    path = tmp_path / "bad.ts"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TsFormatError) as excinfo:
        read_ts(path)
    assert excinfo.value.line == line
    assert str(excinfo.value).startswith(f"{path}:{line}: ") and reason in str(excinfo.value)
    with pytest.raises(DatasetError, match=rf"bad\.ts: line {line}: .*{reason[:12]}"):
        load_dataset(path)  # the loader's error names the file and the line too


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 5), st.integers(0, 9), st.sampled_from(["x", "1..2", "--", "1e", "nan", ",", "::"]))
def test_a_corrupted_value_is_reported_at_its_line(which: int, position: int, junk: str) -> None:
    rows = [",".join(str(v + 0.5) for v in range(10)) + ":a" for _ in range(6)]
    values = rows[which].split(":")[0].split(",")
    values[position] = junk
    rows[which] = ",".join(values) + ":a"
    lines = ["@problemName Z", "@univariate true", "@classLabel true a b", "@data", *rows]
    with pytest.raises(TsFormatError) as excinfo:
        parse_ts(lines, "z.ts")
    assert excinfo.value.line == 5 + which


def test_unreadable_and_undecodable_files(tmp_path: Path) -> None:
    with pytest.raises(TsFormatError, match="cannot read it"):
        read_ts(tmp_path / "missing.ts")
    (tmp_path / "latin.ts").write_bytes(b"@problemName caf\xe9\n@data\n")
    with pytest.raises(TsFormatError, match="not UTF-8"):
        read_ts(tmp_path / "latin.ts")


def test_a_bad_ts_file_in_a_directory_is_skipped_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "good.ts").write_text("\n".join(["@univariate true", "@classLabel true 0 1", "@data",
                                                 "1,2,3:0", "4,5:1"]) + "\n")
    (tmp_path / "bad.ts").write_text("\n".join(["@univariate true", "@classLabel true 0 1", "@data",
                                                "1,2,3:0", "4,oops:1"]) + "\n")
    ds = load_dataset(tmp_path)
    assert len(ds) == 2 and ds.sizes.tolist() == [3, 2] and ds.labels.tolist() == [0, 1]
    assert [(Path(s.path).name, s.reason.split(":")[0]) for s in ds.skipped] == [("bad.ts", "line 5")]


def test_unknown_packaged_dataset() -> None:
    with pytest.raises(DatasetError, match="no packaged dataset 'nope'"):
        packaged_file("nope", "train")
