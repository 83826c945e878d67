"""The readers of each file layout a dataset may hold (see `streamtrain.datasets.files` for the layouts).

Each reader returns one file's samples, their labels and their float targets, or raises `BadFile` with
what is wrong; `load_dataset` skips such a file, reports it and carries on. Class names become numbers
through one `ClassNames` per load, so a training and a held-out split number their classes alike.
"""

from __future__ import annotations

import csv
import logging
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..wire import DTYPES
from .ts import TsFormatError, fill_missing, read_ts

__all__ = ["CLASS_NAMES_SETTING", "BadFile", "ClassNames", "Part", "read_file"]

logger = logging.getLogger(__name__)

_X_KEYS = ("x", "data", "X", "samples")
_Y_KEYS = ("y", "labels", "label", "Y")
_SIZE_KEYS = ("sizes", "lengths")
_TARGET_KEYS = ("target", "targets")


class BadFile(ValueError):
    """One file that cannot be used; the loader reports it and carries on."""


#: The setting that fixes the class names (named in the errors of a load that was given them).
CLASS_NAMES_SETTING = "producer.dataset.class_names"


class ClassNames:
    """Class names to label numbers for one load.

    Args:
        names: the configured names, in label order (a name outside them is an error); None: each new name is
            given the next number, in the order the load meets them.
    """

    def __init__(self, names: Sequence[str] | None = None) -> None:
        self.fixed = names is not None
        self.names: list[str] = list(names or ())
        self._index = {name: i for i, name in enumerate(self.names)}
        self.numbers_used = False
        """Some label was a number, used as it is: names numbered from 0 would collide with it."""

    def number(self, name: str) -> int:
        """The label number of class `name`.

        Raises:
            BadFile: the names are fixed and `name` is not one of them.
        """
        name = name.strip()
        found = self._index.get(name)
        if found is not None:
            return found
        if self.fixed:
            shown = " ".join(self.names[:12]) + (" ..." if len(self.names) > 12 else "")
            raise BadFile(f"class {name!r} is not one of {CLASS_NAMES_SETTING} ({shown})")
        self._index[name] = len(self.names)
        self.names.append(name)
        return self._index[name]

    def label(self, cell: str) -> int:
        """A label written as text (a CSV cell): a configured name, else an integer as it is, else a new name."""
        text = cell.strip()
        if not self.fixed:
            try:
                value = int(text)
            except ValueError:
                pass
            else:
                self.numbers_used = True
                return value
        return self.number(text)

    def mark(self) -> tuple[int, bool]:
        """Where the names stand before a file is read (`forget_since` undoes what a skipped file added)."""
        return len(self.names), self.numbers_used

    def forget_since(self, mark: tuple[int, bool]) -> None:
        """Drop the names, and the use of numbers, that came after `mark`: the file that brought them was skipped."""
        count, self.numbers_used = mark
        for name in self.names[count:]:
            del self._index[name]
        del self.names[count:]

    @property
    def used(self) -> tuple[str, ...] | None:
        """The names by label number, None when no label came from a name."""
        return tuple(self.names) if self.names else None


def _as_payload(arr: np.ndarray, where: str) -> np.ndarray:
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise BadFile(f"{where}: dtype {arr.dtype} is not numeric")
    if arr.ndim == 0:
        raise BadFile(f"{where}: a sample needs at least one axis (its size axis)")
    if arr.shape[0] < 1:
        raise BadFile(f"{where}: a sample of size 0")
    if arr.ndim == 1:
        arr = arr.reshape(-1, 1)  # a series of one feature: (size, 1), as every sample is (size, features)
    if arr.dtype.name not in DTYPES or arr.dtype == np.float64:
        # float64 doubles the bytes on the wire for no training benefit. A value beyond float32's range becomes
        # infinite, and its sample, like one holding NaN, is left out on its own by `load_dataset`, named.
        with np.errstate(over="ignore", invalid="ignore"):
            arr = arr.astype(np.float32)
    return np.ascontiguousarray(arr)


def _pick(keys: list[str], names: tuple[str, ...]) -> str | None:
    return next((k for k in names if k in keys), None)


#: What one file holds: its samples, their labels (-1: none) and their float targets (None: none).
Part = tuple[list[np.ndarray], list[int], list[np.ndarray | None]]


def _read_npz(path: Path, dir_label: int, classes: ClassNames) -> Part:
    try:
        with np.load(path, allow_pickle=False) as z:
            keys = list(z.keys())
            xk, yk, sk, tk = (_pick(keys, _X_KEYS), _pick(keys, _Y_KEYS), _pick(keys, _SIZE_KEYS),
                              _pick(keys, _TARGET_KEYS))
            if xk is None:
                raise BadFile(f"no array named one of {', '.join(_X_KEYS)} (has {', '.join(keys) or 'nothing'})")
            x = z[xk]
            y = z[yk] if yk is not None else None
            sizes = z[sk] if sk is not None else None
            targets = z[tk] if tk is not None else None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        if isinstance(exc, BadFile):
            raise
        raise BadFile(f"not a readable .npz ({exc})") from None
    if y is not None and targets is None and (np.asarray(y).dtype.kind == "f" or np.asarray(y).ndim == 2):
        y, targets = None, y  # a float y, or one row of values per sample: a target, not a class
    if y is None:
        # No labels: every sample is its directory's class, or unlabelled (a self-supervised objective needs none).
        shape = np.shape(targets) if targets is not None else ()
        count = len(sizes) if sizes is not None else shape[0] if shape else None
        y = np.asarray(dir_label) if count is None else np.full(count, dir_label, dtype=np.int64)
    y = _labels_of(np.asarray(y), classes)
    parts = _split(x, y, sizes)
    rows: list[np.ndarray | None] = [None] * len(parts)
    if targets is not None:
        rows = _target_rows(targets, len(parts))
    labels = [int(y)] if y.ndim == 0 else [int(v) for v in y]
    return [_as_payload(p, f"{path}[{i}]") for i, p in enumerate(parts)], labels, rows


def _labels_of(y: np.ndarray, classes: ClassNames) -> np.ndarray:
    if y.dtype.kind in "US":  # class names
        named = [classes.number(str(v)) for v in y.reshape(-1)]
        return np.asarray(named, dtype=np.int64).reshape(y.shape)
    if not np.issubdtype(y.dtype, np.integer):
        raise BadFile(f"labels have dtype {y.dtype}, neither integers nor class names")
    if (y >= 0).any():
        classes.numbers_used = True
    return y


def _split(x: np.ndarray, y: np.ndarray, sizes: np.ndarray | None) -> list[np.ndarray]:
    """`x` as one sample per label: whole (a scalar label), cut by `sizes`, or along its first axis."""
    if y.ndim == 0:
        return [x]
    if sizes is not None:
        sizes = np.asarray(sizes)
        if sizes.shape != y.shape or int(sizes.sum()) != x.shape[0] or np.any(sizes < 1):
            raise BadFile(f"sizes {sizes.shape} (sum {int(sizes.sum())}) do not split x {x.shape} "
                           f"for labels {y.shape}")
        return np.split(x, np.cumsum(sizes)[:-1])
    if x.ndim < 2 or x.shape[0] != y.shape[0]:
        raise BadFile(f"x {x.shape} does not hold one sample per label ({y.shape[0]} labels)")
    return list(x)


def _target_rows(targets: np.ndarray, count: int) -> list[np.ndarray | None]:
    """One float target row per sample (a scalar per sample becomes a row of one)."""
    values = np.asarray(targets)
    if values.dtype.kind not in "fiub":
        raise BadFile(f"targets have dtype {values.dtype}, not numbers")
    rows = values.reshape(count, -1) if values.size and values.shape[:1] in ((count,), ()) else None
    if rows is None or (values.ndim > 2) or (values.ndim == 0 and count != 1):
        raise BadFile(f"targets {values.shape} are not one value or one row of values per sample ({count})")
    return list(rows.astype(np.float64))  # a row that is not finite is left out by the loader, on its own


def _read_npy(path: Path, dir_label: int) -> Part:
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise BadFile(f"not a readable .npy ({exc})") from None
    return [_as_payload(arr, str(path))], [dir_label], [None]


#: Characters of a CSV its delimiter is told from, and the delimiters it may have: a comma, or what spreadsheets
#: export where the comma is the decimal mark (a semicolon), a tab (.tsv) or a bar.
_SNIFF_CHARS, _DELIMITERS = 65536, ",;\t|"


def _delimiter(head: str) -> str:
    """The delimiter of a CSV whose first characters are `head`: the one `csv.Sniffer` finds in every line alike,
    else a comma (a file of one column has none to find)."""
    try:
        return csv.Sniffer().sniff(head, delimiters=_DELIMITERS).delimiter
    except csv.Error:
        return ","


_DECIMAL_COMMA = re.compile(r"[+-]?\d*,\d+(?:[eE][+-]?\d+)?")
_DECIMAL_POINT = re.compile(r"[+-]?\d*\.\d+(?:[eE][+-]?\d+)?")


def _decimal_commas(rows: list[list[str]]) -> bool:
    """Rewrite, in place, numbers written with a decimal comma (`1,5`: a spreadsheet's export where the comma is the
    decimal mark, beside a semicolon delimiter) as Python reads them, unless some cell has a decimal point; whether
    any was. Text cells that hold a comma are left as they are."""
    if any(_DECIMAL_POINT.fullmatch(cell.strip()) for row in rows for cell in row):
        return False
    rewritten = False
    for row in rows:
        for i, cell in enumerate(row):
            if _DECIMAL_COMMA.fullmatch(cell.strip()):
                row[i], rewritten = cell.replace(",", "."), True
    return rewritten


def _csv_rows(path: Path) -> list[list[str]]:
    """A CSV's rows as text cells, split by its own delimiter, numbers with a decimal comma rewritten."""
    try:
        with path.open(newline="") as fh:
            delimiter = _delimiter(fh.read(_SNIFF_CHARS))
            fh.seek(0)
            rows = list(csv.reader(fh, delimiter=delimiter))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise BadFile(f"not a readable CSV ({exc})") from None
    if delimiter != ",":
        logger.info("%s: cells separated by %r", path, delimiter)
        if _decimal_commas(rows):
            logger.info("%s: numbers written with a decimal comma (1,5), read as 1.5", path)
    if not rows:
        raise BadFile("empty CSV")
    return rows


def _read_csv(path: Path, label_column: str, sample_column: str | None, classes: ClassNames,
              target_columns: Sequence[str] = (), dir_label: int = -1) -> Part:
    """A CSV's samples; without a label or target column, each is of its class directory's class (`dir_label`)."""
    rows = _csv_rows(path)
    # A first line of numbers only is data: no header names its columns by numbers alone.
    headerless = bool(rows[0]) and all(cell.strip() and _is_number(cell) for cell in rows[0])
    if headerless:  # data from its first line: columns named by position, as pandas' header=None names them
        rows = [[str(i) for i in range(len(rows[0]))], *rows]
        logger.warning("%s: its first line holds numbers only, so it is read as data, not as a header: its columns "
                       "are named by position, 0 to %d (producer.dataset.target_columns / label_column name them so)",
                       path, len(rows[0]) - 1)
    header = [h.strip() for h in rows[0]]
    li, si, ti, fi, series = _csv_columns(path, header, rows, label_column, sample_column, target_columns)
    out: Part = ([], [], [])
    group: list[list[float]] = []
    key: tuple[str, int, tuple[float, ...]] | None = None
    for number, row in enumerate(rows[1:], start=1 if headerless else 2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise BadFile(f"line {number} has {len(row)} cells, the header has {len(header)}")
        if li is not None and not row[li].strip():
            raise BadFile(f"line {number}: no label in column {label_column!r}")
        label = classes.label(row[li]) if li is not None else -1 if ti else dir_label
        values, target = _numbers(row, fi, number, "a feature", header), tuple(_numbers(row, ti, number, "a target",
                                                                                         header))
        row_key = (row[si] if si is not None else "series" if series else str(number), label, target)
        same = key is not None and label == key[1] and np.array_equal(target, key[2], equal_nan=True)
        if key is not None and row_key[0] == key[0] and not same:
            raise BadFile(f"line {number}: sample {row_key[0]!r} changes " + ("label" if label != key[1] else
                                                                                "target"))
        if key is not None and (row_key[0] != key[0] or not same):
            _add_csv_sample(out, group, key, path)
            group = []
        key = row_key
        group.append(values)
    if key is None:
        raise BadFile("no data rows")
    _add_csv_sample(out, group, key, path)
    return out


def _csv_columns(path: Path, header: list[str], rows: Sequence[Sequence[str]], label_column: str,
                 sample_column: str | None, target_columns: Sequence[str]
                 ) -> tuple[int | None, int | None, list[int], list[int], bool]:
    """The label, sample, target and feature columns of a CSV, and whether its rows are one series over time: nothing
    to learn (no label column, no target named) and nothing grouping the rows (no sample column).

    Raises:
        BadFile: a column to learn is missing (and the rows are not one series), or no column is a feature.
    """
    series = label_column not in header and not target_columns and not (sample_column and sample_column in header)
    if not series:
        _check_columns(header, label_column, target_columns)
    li = header.index(label_column) if label_column in header else None
    si = header.index(sample_column) if sample_column and sample_column in header else None
    ti = [header.index(c) for c in target_columns]
    fi = _feature_columns(path, header, rows, [i for i in range(len(header)) if i not in (li, si, *ti)],
                          series=series)
    if series:
        _check_series(header, rows, [i for i in range(len(header)) if i not in fi], label_column)
    if not fi:
        raise BadFile("no feature columns")
    return li, si, ti, fi, series


#: Cells a CSV leaves a feature missing with: read as NaN, and the sample left out (`load_dataset`).
MISSING_CELLS = frozenset({"", "na", "n/a", "nan", "null", "none", "?"})


def _check_columns(header: Sequence[str], label_column: str, target_columns: Sequence[str]) -> None:
    """The columns to learn are there: the label column, or every target column named.

    Raises:
        BadFile: one is not, naming the setting and how to name the column to learn.
    """
    missing = [c for c in target_columns if c not in header]
    if missing or (label_column not in header and not target_columns):
        raise BadFile(_no_column(header, label_column, missing))


def _no_column(header: Sequence[str], label_column: str, missing: Sequence[str]) -> str:
    """That the label column (or the target columns `missing`) is not in `header`, and how to name the one to learn."""
    which = "producer.dataset.target_columns" if missing else "producer.dataset.label_column"
    return (f"no {', '.join(map(repr, missing or [label_column]))} column (columns: {', '.join(header)}): {which} "
            f"names the column{'s' if len(missing) > 1 else ''} to learn: the class with --set "
            "producer.dataset.label_column=COLUMN, float targets with --set producer.dataset.target_columns=COLUMN[,"
            "COLUMN...]")


def _numbers(row: Sequence[str], columns: Sequence[int], line: int, what: str, header: Sequence[str]) -> list[float]:
    out = []
    for i in columns:
        cell = row[i].strip()
        if what == "a feature" and cell.lower() in MISSING_CELLS:
            out.append(float("nan"))
            continue
        try:
            out.append(float(cell))
        except ValueError:
            raise BadFile(f"line {line}: {what} is not a number: column {header[i]!r} holds {cell[:40]!r}") from None
    return out


#: Headers a table library gives the row numbers it writes as a first column (pandas' `to_csv` index).
INDEX_HEADERS = frozenset({"", "unnamed: 0", "index"})


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _feature_columns(path: Path, header: Sequence[str], rows: Sequence[Sequence[str]],
                     candidates: Sequence[int], series: bool = False) -> list[int]:
    """The feature columns among `candidates`, leaving out (and saying so) those that cannot be features: a column of
    text only (a date, a quarter, a name: no cell of it a number) and a row number a table library wrote (an
    unnamed or `index` column counting 0, 1, 2, ... or 1, 2, 3, ...); in one `series` over time also a time index,
    any column of whole numbers rising by exactly 1 from row to row (a year, an observation's number), which is
    when a frame was taken, not what was measured, unless no other column is left. A column of numbers with a few
    text cells stays: its first text cell is an error naming the line, the column and the cell."""
    data = [row for row in rows[1:] if len(row) == len(header) and any(cell.strip() for cell in row)]
    kept = []
    for i in candidates:
        # A column whose first given cell is a number is read as numbers (checked cell by cell as they are read):
        # only one opening with text, or one an index would be written under, is looked at whole.
        first = next((c for row in data if (c := row[i].strip()).lower() not in MISSING_CELLS), None)
        if first is not None and not _is_number(first) and not any(_is_number(row[i].strip()) for row in data):
            logger.warning("%s: column %r left out of the features: it holds text, not numbers (%r, ...)", path,
                           header[i], first[:40])
            continue
        if header[i].lower() in INDEX_HEADERS and _counts_rows([row[i].strip() for row in data]):
            logger.warning("%s: column %r left out of the features: it counts the rows (0, 1, 2, ... or 1, 2, 3, "
                           "...), as a table library's index does", path, header[i] or "(unnamed)")
            continue
        kept.append(i)
    counting = [i for i in kept if series and _counts_rows([row[i].strip() for row in data], start=None)]
    if len(counting) == len(kept):
        return kept  # nothing beside them: what counts up is the series itself
    for i in counting:
        logger.warning("%s: column %r left out of the features: it counts the frames of the series (%s, %s, ...), "
                       "a time index", path, header[i] or "(unnamed)", data[0][i].strip(), data[1][i].strip())
    return [i for i in kept if i not in counting]


def _check_series(header: Sequence[str], rows: Sequence[Sequence[str]], left_out: Sequence[int],
                  label_column: str) -> None:
    """Refuse to read a table as one series when a text column left out of it repeats a value, as a class column
    does (iris's species), unlike a time stamp (each its own); the message says how to name the column to learn.

    Raises:
        BadFile: such a column, named.
    """
    data = [row for row in rows[1:] if len(row) == len(header) and any(cell.strip() for cell in row)]
    for i in left_out:
        cells = [row[i].strip() for row in data if row[i].strip().lower() not in MISSING_CELLS]
        if cells and not all(_is_number(c) for c in cells) and len(set(cells)) < len(cells):
            raise BadFile(f"{_no_column(header, label_column, ())}; column {header[i]!r} repeats its text "
                          f"({cells[0][:40]!r}, ...), as a class does, so the rows are not read as one series over "
                          "time")


def _counts_rows(cells: Sequence[str], start: tuple[float, ...] | None = (0.0, 1.0)) -> bool:
    """Whether `cells` count up by 1 from one of `start` (0, 1, 2, ... or 1, 2, 3, ...: a row number; None: from any
    whole number, as years do), every one given."""
    if len(cells) < 2 or not all(_is_number(c) for c in cells):
        return False
    values = np.asarray([float(c) for c in cells])
    first = values[0]
    begins = first == round(first) if start is None else first in start
    return bool(begins) and np.array_equal(values, first + np.arange(len(values)))


def _add_csv_sample(out: Part, group: list[list[float]], key: tuple[str, int, tuple[float, ...]], path: Path) -> None:
    name, label, target = key
    out[0].append(_as_payload(np.asarray(group), f"{path} sample {name}"))
    out[1].append(label)
    out[2].append(np.asarray(target, dtype=np.float64) if target else None)


def _read_ts(path: Path, classes: ClassNames) -> Part:
    try:
        data = read_ts(path)
    except TsFormatError as exc:
        raise BadFile(f"line {exc.line}: {exc.reason}" if exc.line is not None else exc.reason) from None
    samples: list[np.ndarray] = []
    filled = 0
    for series, line in zip(data.series, data.lines, strict=True):
        values, n = fill_missing(series)
        filled += n
        samples.append(_as_payload(values, f"{path}:{line}"))
    if filled:
        logger.info("%s: %d missing values interpolated", path, filled)
    targets: list[np.ndarray | None] = [None] * len(samples) if data.targets is None else [
        np.asarray([t]) for t in data.targets]
    declared = data.header.class_names
    if declared is None:
        return samples, [int(v) for v in data.labels], targets
    numbers = [classes.number(name) for name in declared]  # the file's own order, for a load without names
    logger.info("%s: classes %s", path, ", ".join(f"{n}={i}" for n, i in zip(declared, numbers, strict=True)))
    return samples, [numbers[v] if v >= 0 else -1 for v in data.labels], targets


def read_file(f: Path, dir_label: int, classes: ClassNames, label_column: str, sample_column: str | None,
               target_columns: Sequence[str]) -> Part:
    suffix = f.suffix.lower()
    if suffix == ".ts":
        return _read_ts(f, classes)
    if suffix == ".npz":
        return _read_npz(f, dir_label, classes)
    if suffix == ".npy":
        return _read_npy(f, dir_label)
    return _read_csv(f, label_column, sample_column, classes, target_columns, dir_label)
