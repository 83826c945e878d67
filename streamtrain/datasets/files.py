"""Reading a real dataset from disk: a directory of .ts/.npy/.npz/.csv files, or one such file.

Both the producers (replaying a dataset into device topics) and the trainers (evaluating on a
held-out set) read datasets through `load_dataset`. Layouts understood (every sample's first axis
is its size axis):

- ``*.ts``: the UEA/UCR archive's format (see `streamtrain.datasets.ts`); each series becomes a
  (length, dimensions) float32 sample, labelled by its class's position in ``@classLabel``. Missing
  values are interpolated (trailing ones, the archive's padding, are cut).
- ``root/<class>/*.npy``: one sample per file, labelled by its directory (integer names are used as
  labels, other names are class names); ``.npy`` files directly in ``root`` are unlabelled.
- ``*.npz`` with ``x`` and ``y``: a scalar ``y`` makes one sample; ``x`` of shape (N, L, ...) with
  ``y`` of shape (N,) makes N samples; adding ``sizes`` (N,) splits a ragged ``x`` of shape
  (sum(sizes), ...) into N samples of those sizes. ``data``/``labels``/``lengths`` are accepted too.
  Integer labels are used as they are, string labels are class names.
- ``*.csv`` with a header: a label column (integers, or class names), an optional sample column
  grouping consecutive rows into one sample (size = number of rows), and numeric feature columns.

Class names become label numbers through one list per load (`ClassNames`): the configured names in
their order (`producer.dataset.class_names`), a name outside them making its file unusable; or, when
none are configured, each name in the order first met (class directories sorted, then each `.ts`
file's `@classLabel` order). A training split and a held-out split read with the same names number
their classes alike whatever classes each holds; read apart, a held-out split that lacks a class
would number the ones after it differently (`Dataset.class_names` says how a load numbered them).

A file that cannot be read or does not fit these layouts is skipped and reported (a `.ts` file with
the line at fault); the rest loads. A single file that cannot be read is an error naming it.
"""

from __future__ import annotations

import csv
import logging
import zipfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..wire import DTYPES
from .ts import TsFormatError, fill_missing, read_ts

__all__ = ["ClassNames", "Dataset", "DatasetError", "SkippedFile", "load_dataset", "load_sizes"]

logger = logging.getLogger(__name__)

SUFFIXES = (".ts", ".npy", ".npz", ".csv")
_X_KEYS = ("x", "data", "X", "samples")
_Y_KEYS = ("y", "labels", "label", "Y")
_SIZE_KEYS = ("sizes", "lengths")
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class DatasetError(ValueError):
    """The dataset as a whole cannot be used (nothing readable, no such path)."""


class _BadFile(ValueError):
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
            _BadFile: the names are fixed and `name` is not one of them.
        """
        name = name.strip()
        found = self._index.get(name)
        if found is not None:
            return found
        if self.fixed:
            shown = " ".join(self.names[:12]) + (" ..." if len(self.names) > 12 else "")
            raise _BadFile(f"class {name!r} is not one of {CLASS_NAMES_SETTING} ({shown})")
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


@dataclass(frozen=True)
class SkippedFile:
    """A file left out of the dataset, and why."""

    path: str
    reason: str


@dataclass
class Dataset:
    """Samples held in memory, with their labels (-1: unlabelled) and the file each came from."""

    samples: list[np.ndarray]
    labels: np.ndarray
    sources: list[str]
    skipped: list[SkippedFile] = field(default_factory=list)
    class_names: tuple[str, ...] | None = None
    """The class names by label number when labels came from names (directories, `.ts` classes, text labels);
    None when every label was a number as written."""

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def sizes(self) -> np.ndarray:
        """Each sample's size (its first axis)."""
        return np.asarray([s.shape[0] for s in self.samples], dtype=np.int64)

    @property
    def labelled(self) -> bool:
        """Whether every sample has a label."""
        return bool(len(self.labels)) and bool(np.all(self.labels >= 0))


def _as_payload(arr: np.ndarray, where: str) -> np.ndarray:
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise _BadFile(f"{where}: dtype {arr.dtype} is not numeric")
    if arr.ndim == 0:
        raise _BadFile(f"{where}: a sample needs at least one axis (its size axis)")
    if arr.shape[0] < 1:
        raise _BadFile(f"{where}: a sample of size 0")
    if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
        raise _BadFile(f"{where}: holds NaN or infinity")
    if arr.dtype.name not in DTYPES or arr.dtype == np.float64:
        if np.issubdtype(arr.dtype, np.floating) and arr.size:
            big = float(np.abs(arr).max())
            if big > _FLOAT32_MAX:
                raise _BadFile(f"{where}: holds {big:.3g}, beyond float32's range (+-{_FLOAT32_MAX:.3g}), the dtype "
                               "samples are published in: scale the data")
        arr = arr.astype(np.float32)  # float64 doubles the bytes on the wire for no training benefit
    return np.ascontiguousarray(arr)


def _pick(keys: list[str], names: tuple[str, ...]) -> str | None:
    return next((k for k in names if k in keys), None)


def _read_npz(path: Path, dir_label: int, classes: ClassNames) -> tuple[list[np.ndarray], list[int]]:
    try:
        with np.load(path, allow_pickle=False) as z:
            keys = list(z.keys())
            xk, yk, sk = _pick(keys, _X_KEYS), _pick(keys, _Y_KEYS), _pick(keys, _SIZE_KEYS)
            if xk is None:
                raise _BadFile(f"no array named one of {', '.join(_X_KEYS)} (has {', '.join(keys) or 'nothing'})")
            x = z[xk]
            y = z[yk] if yk is not None else None
            sizes = z[sk] if sk is not None else None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        if isinstance(exc, _BadFile):
            raise
        raise _BadFile(f"not a readable .npz ({exc})") from None
    if y is None:
        if dir_label < 0:
            raise _BadFile(f"no labels (no array named one of {', '.join(_Y_KEYS)})")
        return [_as_payload(x, str(path))], [dir_label]
    y = np.asarray(y)
    if y.dtype.kind in "US":  # class names
        named = [classes.number(str(v)) for v in y.reshape(-1)]
        y = np.asarray(named, dtype=np.int64).reshape(y.shape)
    elif not np.issubdtype(y.dtype, np.integer):
        raise _BadFile(f"labels have dtype {y.dtype}, neither integers nor class names")
    else:
        classes.numbers_used = True
    if y.ndim == 0:
        return [_as_payload(x, str(path))], [int(y)]
    if sizes is not None:
        sizes = np.asarray(sizes)
        if sizes.shape != y.shape or int(sizes.sum()) != x.shape[0] or np.any(sizes < 1):
            raise _BadFile(f"sizes {sizes.shape} (sum {int(sizes.sum())}) do not split x {x.shape} "
                           f"for labels {y.shape}")
        parts = np.split(x, np.cumsum(sizes)[:-1])
    else:
        if x.ndim < 2 or x.shape[0] != y.shape[0]:
            raise _BadFile(f"x {x.shape} does not hold one sample per label ({y.shape[0]} labels)")
        parts = list(x)
    return [_as_payload(p, f"{path}[{i}]") for i, p in enumerate(parts)], [int(v) for v in y]


def _read_npy(path: Path, dir_label: int) -> tuple[list[np.ndarray], list[int]]:
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise _BadFile(f"not a readable .npy ({exc})") from None
    return [_as_payload(arr, str(path))], [dir_label]


def _read_csv(path: Path, label_column: str, sample_column: str | None,  # noqa: C901, PLR0915  one CSV layout check per branch (label column, sample column, header), each with its own message
              classes: ClassNames) -> tuple[list[np.ndarray], list[int]]:
    try:
        with path.open(newline="") as fh:
            rows = list(csv.reader(fh))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise _BadFile(f"not a readable CSV ({exc})") from None
    if not rows:
        raise _BadFile("empty CSV")
    header = [h.strip() for h in rows[0]]
    if label_column not in header:
        raise _BadFile(f"no {label_column!r} column (columns: {', '.join(header)})")
    li = header.index(label_column)
    si = header.index(sample_column) if sample_column and sample_column in header else None
    fi = [i for i in range(len(header)) if i not in (li, si)]
    if not fi:
        raise _BadFile("no feature columns")
    samples: list[np.ndarray] = []
    labels: list[int] = []
    group: list[list[float]] = []
    key: tuple[str, int] | None = None
    for number, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise _BadFile(f"line {number} has {len(row)} cells, the header has {len(header)}")
        if not row[li].strip():
            raise _BadFile(f"line {number}: no label in column {label_column!r}")
        label = classes.label(row[li])
        try:
            values = [float(row[i]) for i in fi]
        except ValueError:
            raise _BadFile(f"line {number}: a feature is not a number") from None
        row_key = (row[si] if si is not None else str(number), label)
        if key is not None and row_key[0] == key[0] and label != key[1]:
            raise _BadFile(f"line {number}: sample {row_key[0]!r} changes label")
        if key is not None and row_key != key:
            samples.append(_as_payload(np.asarray(group), f"{path} sample {key[0]}"))
            labels.append(key[1])
            group = []
        key = row_key
        group.append(values)
    if key is None:
        raise _BadFile("no data rows")
    samples.append(_as_payload(np.asarray(group), f"{path} sample {key[0]}"))
    labels.append(key[1])
    return samples, labels


def _read_ts(path: Path, classes: ClassNames) -> tuple[list[np.ndarray], list[int]]:
    try:
        data = read_ts(path)
    except TsFormatError as exc:
        raise _BadFile(f"line {exc.line}: {exc.reason}" if exc.line is not None else exc.reason) from None
    samples: list[np.ndarray] = []
    filled = 0
    for series, line in zip(data.series, data.lines, strict=True):
        values, n = fill_missing(series)
        filled += n
        samples.append(_as_payload(values, f"{path}:{line}"))
    if filled:
        logger.info("%s: %d missing values interpolated", path, filled)
    declared = data.header.class_names
    if declared is None:
        return samples, [int(v) for v in data.labels]
    numbers = [classes.number(name) for name in declared]  # the file's own order, for a load without names
    logger.info("%s: classes %s", path, ", ".join(f"{n}={i}" for n, i in zip(declared, numbers, strict=True)))
    return samples, [numbers[v] if v >= 0 else -1 for v in data.labels]


def _class_dirs(root: Path, files: list[Path], classes: ClassNames) -> dict[Path, str | int]:
    """Each directory's class: its integer name as the label, or its name (numbered through `classes`, sorted
    names first when none are configured, so a load numbers them the same whatever order files come in)."""
    dirs = sorted({f.parent for f in files if f.parent != root})
    names = [d.relative_to(root).parts[0] for d in dirs]
    unique = sorted(set(names))
    if not classes.fixed and all(n.isdigit() for n in unique):
        if unique:
            classes.numbers_used = True
        return {d: int(n) for d, n in zip(dirs, names, strict=True)}
    if not classes.fixed and unique:
        numbered = {n: classes.number(n) for n in unique}
        logger.info("class directories numbered in sorted order: %s",
                    ", ".join(f"{n}={i}" for n, i in numbered.items()))
    return dict(zip(dirs, names, strict=True))


def load_dataset(path: Path, label_column: str = "label", sample_column: str | None = "sample",  # noqa: C901, PLR0915  each file format and its checks in one dispatch, each raising a DatasetError naming the file
                 class_names: Sequence[str] | None = None) -> Dataset:
    """Load every readable sample under `path`; skip and report files that cannot be used.

    Samples whose trailing shape (everything after the size axis) differs from the most common one
    are skipped too, since a model cannot take both.

    Args:
        path: a file or a directory of them.
        label_column: the CSV column holding the label.
        sample_column: the CSV column grouping rows into samples.
        class_names: the class names in label order (`producer.dataset.class_names`); a file holding another
            class is skipped. None: names are numbered in the order the load meets them.

    Raises:
        DatasetError: when `path` does not exist, nothing under it can be used, or its labels are both
            numbers and names without `class_names` to say how they relate.
    """
    if not path.exists():
        raise DatasetError(f"dataset {path} does not exist")
    root = path if path.is_dir() else path.parent
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix.lower() in SUFFIXES and p.is_file())
    else:
        files = [path]
    if not files:
        raise DatasetError(f"dataset {path} holds no {', '.join(SUFFIXES)} files")
    classes = ClassNames(class_names)
    class_of = _class_dirs(root, files, classes) if path.is_dir() else {}
    samples: list[np.ndarray] = []
    labels: list[int] = []
    sources: list[str] = []
    skipped: list[SkippedFile] = []
    for f in files:
        mark = classes.mark()
        try:
            dir_class = class_of.get(f.parent, -1)
            dir_label = classes.number(dir_class) if isinstance(dir_class, str) else dir_class
            suffix = f.suffix.lower()
            if suffix == ".ts":
                got, ys = _read_ts(f, classes)
            elif suffix == ".npz":
                got, ys = _read_npz(f, dir_label, classes)
            elif suffix == ".npy":
                got, ys = _read_npy(f, dir_label)
            else:
                got, ys = _read_csv(f, label_column, sample_column, classes)
        except _BadFile as exc:
            classes.forget_since(mark)
            skipped.append(SkippedFile(str(f), str(exc)))
            logger.warning("skipping dataset file %s: %s", f, exc)
            continue
        samples.extend(got)
        labels.extend(ys)
        sources.extend([str(f)] * len(got))
    if samples:
        trailing = Counter(s.shape[1:] for s in samples).most_common(1)[0][0]
        bad = {src for s, src in zip(samples, sources, strict=True) if s.shape[1:] != trailing}
        for src in sorted(bad):
            reason = f"sample shape differs from the dataset's (size, {', '.join(map(str, trailing))})"
            skipped.append(SkippedFile(src, reason))
            logger.warning("skipping dataset file %s: %s", src, reason)
        keep = [i for i, src in enumerate(sources) if src not in bad]
        samples = [samples[i] for i in keep]
        labels = [labels[i] for i in keep]
        sources = [sources[i] for i in keep]
    if not samples and path.is_file() and skipped:
        raise DatasetError(f"{skipped[0].path}: {skipped[0].reason}")
    if not samples:
        detail = "; ".join(f"{s.path}: {s.reason}" for s in skipped[:5])
        raise DatasetError(f"dataset {path}: no usable samples ({len(skipped)} files skipped: {detail})")
    named = classes.used
    if named is not None and classes.numbers_used and not classes.fixed:
        raise DatasetError(f"dataset {path}: some labels are numbers and some are class names "
                           f"({', '.join(named[:6])}{' ...' if len(named) > 6 else ''}), so a name's number could "
                           f"be a number's too: name every class, or set {CLASS_NAMES_SETTING} to number them")
    return Dataset(samples, np.asarray(labels, dtype=np.int64), sources, skipped, named)


def load_sizes(path: Path) -> np.ndarray:
    """Sizes to replay: a text file (one integer per line), a 1-D .npy of integers, or a dataset's sample sizes.

    Raises:
        DatasetError: naming the file when it holds no usable sizes.
    """
    if not path.exists():
        raise DatasetError(f"sizes file {path} does not exist")
    if path.is_file() and path.suffix.lower() in (".txt", ".npy", ""):
        try:
            if path.suffix.lower() == ".npy":
                sizes = np.load(path, allow_pickle=False)
            else:
                sizes = np.loadtxt(path, dtype=np.float64, ndmin=1, comments="#")
        except (OSError, ValueError) as exc:
            raise DatasetError(f"sizes file {path}: cannot read it ({exc})") from None
        if sizes.ndim == 1:
            if len(sizes) == 0 or np.any(sizes < 1) or np.any(sizes != np.round(sizes)):
                raise DatasetError(f"sizes file {path}: sizes must be integers >= 1")
            return sizes.astype(np.int64)
    return load_dataset(path).sizes
