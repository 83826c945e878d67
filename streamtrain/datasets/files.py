"""Reading a real dataset from disk: a directory of .ts/.npy/.npz/.csv files, or one such file.

Both the producers (replaying a dataset into device topics) and the trainers (evaluating on a
held-out set) read datasets through `load_dataset`. Layouts understood (every sample's first axis
is its size axis):

- ``*.ts``: the UEA/UCR archive's format (see `streamtrain.datasets.ts`); each series becomes a
  (length, dimensions) float32 sample, labelled by its class's position in ``@classLabel``. Missing
  values are interpolated (trailing ones, the archive's padding, are cut).
- ``root/<class>/*.npy``: one sample per file, labelled by its directory (integer names are used as
  labels, other names are numbered in sorted order); ``.npy`` files directly in ``root`` are unlabelled.
- ``*.npz`` with ``x`` and ``y``: a scalar ``y`` makes one sample; ``x`` of shape (N, L, ...) with
  ``y`` of shape (N,) makes N samples; adding ``sizes`` (N,) splits a ragged ``x`` of shape
  (sum(sizes), ...) into N samples of those sizes. ``data``/``labels``/``lengths`` are accepted too.
- ``*.csv`` with a header: a label column, an optional sample column grouping consecutive rows into
  one sample (size = number of rows), and numeric feature columns.

A file that cannot be read or does not fit these layouts is skipped and reported (a `.ts` file with
the line at fault); the rest loads. A single file that cannot be read is an error naming it.
"""

from __future__ import annotations

import csv
import logging
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..wire import DTYPES
from .ts import TsFormatError, fill_missing, read_ts

__all__ = ["Dataset", "DatasetError", "SkippedFile", "load_dataset", "load_sizes"]

logger = logging.getLogger(__name__)

SUFFIXES = (".ts", ".npy", ".npz", ".csv")
_X_KEYS = ("x", "data", "X", "samples")
_Y_KEYS = ("y", "labels", "label", "Y")
_SIZE_KEYS = ("sizes", "lengths")


class DatasetError(ValueError):
    """The dataset as a whole cannot be used (nothing readable, no such path)."""


class _BadFile(ValueError):
    """One file that cannot be used; the loader reports it and carries on."""


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
    if arr.dtype.name not in DTYPES or arr.dtype == np.float64:
        arr = arr.astype(np.float32)  # float64 doubles the bytes on the wire for no training benefit
    if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
        raise _BadFile(f"{where}: holds NaN or infinity")
    return np.ascontiguousarray(arr)


def _pick(keys: list[str], names: tuple[str, ...]) -> str | None:
    return next((k for k in names if k in keys), None)


def _read_npz(path: Path, dir_label: int) -> tuple[list[np.ndarray], list[int]]:
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
    if y.ndim == 0:
        return [_as_payload(x, str(path))], [int(y)]
    if not np.issubdtype(y.dtype, np.integer):
        raise _BadFile(f"labels have dtype {y.dtype}, not integers")
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


def _read_csv(path: Path, label_column: str, sample_column: str | None) -> tuple[list[np.ndarray], list[int]]:
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
        try:
            label = int(row[li])
            values = [float(row[i]) for i in fi]
        except ValueError:
            raise _BadFile(f"line {number}: a label or feature is not a number") from None
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


def _read_ts(path: Path) -> tuple[list[np.ndarray], list[int]]:
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
    if data.header.class_names is not None:
        logger.info("%s: classes %s", path, ", ".join(f"{n}={i}" for i, n in enumerate(data.header.class_names)))
    return samples, [int(v) for v in data.labels]


def _class_labels(root: Path, files: list[Path]) -> dict[Path, int]:
    dirs = sorted({f.parent for f in files if f.parent != root})
    names = [d.relative_to(root).parts[0] for d in dirs]
    unique = sorted(set(names))
    if all(n.isdigit() for n in unique):
        mapping = {n: int(n) for n in unique}
    else:
        mapping = {n: i for i, n in enumerate(unique)}
        if unique:
            logger.info("class directories numbered in sorted order: %s",
                        ", ".join(f"{n}={i}" for n, i in mapping.items()))
    return {d: mapping[n] for d, n in zip(dirs, names, strict=True)}


def load_dataset(path: Path, label_column: str = "label", sample_column: str | None = "sample") -> Dataset:
    """Load every readable sample under `path`; skip and report files that cannot be used.

    Samples whose trailing shape (everything after the size axis) differs from the most common one
    are skipped too, since a model cannot take both.

    Raises:
        DatasetError: when `path` does not exist or nothing under it can be used.
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
    labels_of = _class_labels(root, files) if path.is_dir() else {}
    samples: list[np.ndarray] = []
    labels: list[int] = []
    sources: list[str] = []
    skipped: list[SkippedFile] = []
    for f in files:
        dir_label = labels_of.get(f.parent, -1)
        try:
            suffix = f.suffix.lower()
            if suffix == ".ts":
                got, ys = _read_ts(f)
            elif suffix == ".npz":
                got, ys = _read_npz(f, dir_label)
            elif suffix == ".npy":
                got, ys = _read_npy(f, dir_label)
            else:
                got, ys = _read_csv(f, label_column, sample_column)
        except _BadFile as exc:
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
    return Dataset(samples, np.asarray(labels, dtype=np.int64), sources, skipped)


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
