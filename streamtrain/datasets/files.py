"""Reading a real dataset from disk: a directory of .ts/.npy/.npz/.csv files, or one such file.

Both the producers (replaying a dataset into device topics) and the trainers (evaluating on a
held-out set) read datasets through `load_dataset`. Layouts understood (every sample's first axis
is its size axis; a sample of one axis is a series of one feature, read as (size, 1)):

- ``*.ts``: the UEA/UCR archive's format (see `streamtrain.datasets.ts`); each series becomes a
  (length, dimensions) float32 sample, labelled by its class's position in ``@classLabel``. Missing
  values are interpolated (trailing ones, the archive's padding, are cut).
- ``root/<class>/*.npy``: one sample per file, labelled by its directory (integer names are used as
  labels, other names are class names); ``.npy`` files directly in ``root`` are unlabelled. A ``.csv``
  (or ``.tsv``) with nothing to learn in it (no label or target column) in a class directory is of
  that class too: one recording per file, in a folder per class.
- ``*.npz`` with ``x`` and ``y``: a scalar ``y`` makes one sample; ``x`` of shape (N, L, ...) with
  ``y`` of shape (N,) makes N samples; adding ``sizes`` (N,) splits a ragged ``x`` of shape
  (sum(sizes), ...) into N samples of those sizes. ``data``/``labels``/``lengths`` are accepted too.
  Integer labels are used as they are, string labels are class names. A float ``y`` (N,) or any
  ``y`` of shape (N, W) is a float *target* per sample instead (regression values, multi-label 0/1
  tags); so is a ``target``/``targets`` array beside integer labels. Without ``y`` the samples are
  unlabelled (a self-supervised objective needs nothing else).
- ``*.csv`` with a header: a label column (integers, or class names), an optional sample column
  grouping consecutive rows into one sample (size = number of rows), and numeric feature columns;
  with target columns named (`producer.dataset.target_columns`), those hold each sample's float
  target and the label column may be absent. A first line of numbers only is data, not a header: the
  columns are then named by position, from 0.
- ``*.ts`` with ``@targetLabel true`` (the archive's regression problems): each series' float target.

Class names become label numbers through one list per load (`ClassNames`): the configured names in
their order (`producer.dataset.class_names`), a name outside them making its file unusable; or, when
none are configured, each name in the order first met (class directories sorted, then each `.ts`
file's `@classLabel` order). A training split and a held-out split read with the same names number
their classes alike whatever classes each holds; read apart, a held-out split that lacks a class
would number the ones after it differently (`Dataset.class_names` says how a load numbered them).

A file that cannot be read or does not fit these layouts is skipped and reported (a `.ts` file with
the line at fault); the rest loads. A single file that cannot be read is an error naming it. A sample whose
float target holds NaN or infinity (or a value beyond float32's range) is left out on its own, reported with its
file and its index there (`Dataset.skipped_samples`); the file's other samples load. So is a sample whose features
hold NaN (a CSV's empty or `NA` cell), infinity or a value beyond float32's range: the wire takes finite values only.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .readers import CLASS_NAMES_SETTING, BadFile, ClassNames, Part, read_file

__all__ = ["ClassNames", "Dataset", "DatasetError", "SkippedFile", "SkippedSample", "load_dataset", "load_sizes"]

logger = logging.getLogger(__name__)

SUFFIXES = (".ts", ".npy", ".npz", ".csv", ".tsv")


class DatasetError(ValueError):
    """The dataset as a whole cannot be used (nothing readable, no such path)."""


@dataclass(frozen=True)
class SkippedFile:
    """A file left out of the dataset, and why."""

    path: str
    reason: str


@dataclass(frozen=True)
class SkippedSample:
    """A sample left out of the dataset (its file's other samples load), and why."""

    path: str
    index: int
    """Its position in its file (0 for the first sample)."""
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
    targets: np.ndarray | None = None
    """(N, W) float64 target of every sample (`@targetLabel` series, a float `y`, CSV target columns); None when
    the samples carry none."""
    skipped_samples: list[SkippedSample] = field(default_factory=list)
    """Samples left out one by one (a target that is NaN or infinite), each with its file and index there."""

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


def load_dataset(path: Path, label_column: str = "label", sample_column: str | None = "sample",
                 class_names: Sequence[str] | None = None, target_columns: Sequence[str] = ()) -> Dataset:
    """Load every readable sample under `path`; skip and report files that cannot be used.

    Samples whose trailing shape (everything after the size axis) differs from the most common one
    are skipped too, since a model cannot take both.

    Args:
        path: a file or a directory of them.
        label_column: the CSV column holding the label.
        sample_column: the CSV column grouping rows into samples.
        class_names: the class names in label order (`producer.dataset.class_names`); a file holding another
            class is skipped. None: names are numbered in the order the load meets them.
        target_columns: the CSV columns holding each sample's float target (`producer.dataset.target_columns`).

    Raises:
        DatasetError: when `path` does not exist, nothing under it can be used, its labels are both
            numbers and names without `class_names` to say how they relate, or some samples carry a float
            target and others none (or one of another width).
    """
    files = _files_of(path)
    classes = ClassNames(class_names)
    class_of = _class_dirs(path, files, classes) if path.is_dir() else {}
    samples: list[np.ndarray] = []
    labels: list[int] = []
    targets: list[np.ndarray | None] = []
    sources: list[str] = []
    skipped: list[SkippedFile] = []
    left_out: list[SkippedSample] = []
    for f in files:
        mark = classes.mark()
        try:
            dir_class = class_of.get(f.parent, -1)
            dir_label = classes.number(dir_class) if isinstance(dir_class, str) else dir_class
            got, ys, ts = read_file(f, dir_label, classes, label_column, sample_column, target_columns)
        except BadFile as exc:
            classes.forget_since(mark)
            skipped.append(SkippedFile(str(f), str(exc)))
            logger.warning("skipping dataset file %s: %s", f, exc)
            continue
        got, ys, ts = _without_bad_targets(f, got, ys, ts, left_out)
        samples.extend(got)
        labels.extend(ys)
        targets.extend(ts)
        sources.extend([str(f)] * len(got))
    keep = _same_trailing_shape(samples, sources, skipped)
    samples, labels = [samples[i] for i in keep], [labels[i] for i in keep]
    targets, sources = [targets[i] for i in keep], [sources[i] for i in keep]
    if not samples and path.is_file() and skipped:
        raise DatasetError(f"{skipped[0].path}: {skipped[0].reason}")
    if not samples:
        detail = "; ".join([*(f"{s.path}: {s.reason}" for s in skipped[:5]),
                            *(f"{s.path} sample {s.index}: {s.reason}" for s in left_out[:1])])
        raise DatasetError(f"dataset {path}: no usable samples ({len(skipped)} files, {len(left_out)} samples "
                           f"skipped: {detail})")
    named = classes.used
    if named is not None and classes.numbers_used and not classes.fixed:
        raise DatasetError(f"dataset {path}: some labels are numbers and some are class names "
                           f"({', '.join(named[:6])}{' ...' if len(named) > 6 else ''}), so a name's number could "
                           f"be a number's too: name every class, or set {CLASS_NAMES_SETTING} to number them")
    return Dataset(samples, np.asarray(labels, dtype=np.int64), sources, skipped, named, _stacked(targets, path),
                   left_out)


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _finite32(values: np.ndarray) -> bool:
    """Whether every value is finite in float32 (what the wire and the model take)."""
    return bool(np.isfinite(values).all() and (np.abs(values) <= _FLOAT32_MAX).all())


def _bad_value(sample: np.ndarray, target: np.ndarray | None) -> str | None:
    """Why a sample cannot be replayed as it is (a feature or its target not finite in float32), or None."""
    if target is not None and not _finite32(target):
        return "target holds NaN, infinity or a value beyond float32's range"
    if np.issubdtype(sample.dtype, np.floating) and not _finite32(sample):
        columns = np.flatnonzero(~np.isfinite(sample.reshape(len(sample), -1)).all(axis=0) |
                                 (np.abs(sample.reshape(len(sample), -1)) > _FLOAT32_MAX).any(axis=0))
        return f"feature {', '.join(map(str, columns[:5].tolist()))} holds NaN (a missing value), infinity or a " \
               "value beyond float32's range"
    return None


def _without_bad_targets(f: Path, samples: list[np.ndarray], labels: list[int], targets: list[np.ndarray | None],
                         left_out: list[SkippedSample]) -> Part:
    """One file's samples less those whose target or features are not finite in float32 (each added to
    `left_out`, and logged): the wire refuses them, and a model cannot learn from them."""
    why = [_bad_value(x, t) for x, t in zip(samples, targets, strict=True)]
    bad = [i for i, w in enumerate(why) if w is not None]
    if not bad:
        return samples, labels, targets
    for i in bad:
        left_out.append(SkippedSample(str(f), i, str(why[i])))
    shown = ", ".join(map(str, bad[:10])) + (", ..." if len(bad) > 10 else "")
    logger.warning("dataset file %s: %d of its %d samples left out: %s (samples %s)", f, len(bad), len(samples),
                   why[bad[0]], shown)
    keep = [i for i in range(len(samples)) if i not in set(bad)]
    return [samples[i] for i in keep], [labels[i] for i in keep], [targets[i] for i in keep]


def _files_of(path: Path) -> list[Path]:
    """The dataset files at `path` (itself, or those under it).

    Raises:
        DatasetError: there are none.
    """
    if not path.exists():
        raise DatasetError(f"dataset {path} does not exist")
    files = sorted(p for p in path.rglob("*") if p.suffix.lower() in SUFFIXES and p.is_file()) if path.is_dir() \
        else [path]
    if not files:
        raise DatasetError(f"dataset {path} holds no {', '.join(SUFFIXES)} files")
    return files


def _same_trailing_shape(samples: list[np.ndarray], sources: list[str], skipped: list[SkippedFile]) -> list[int]:
    """Indices of the samples of the most common trailing shape; the files of the others are reported skipped."""
    if not samples:
        return []
    trailing = Counter(s.shape[1:] for s in samples).most_common(1)[0][0]
    bad = {src for s, src in zip(samples, sources, strict=True) if s.shape[1:] != trailing}
    for src in sorted(bad):
        reason = f"sample shape differs from the dataset's (size, {', '.join(map(str, trailing))})"
        skipped.append(SkippedFile(src, reason))
        logger.warning("skipping dataset file %s: %s", src, reason)
    return [i for i, src in enumerate(sources) if src not in bad]


def _stacked(targets: list[np.ndarray | None], path: Path) -> np.ndarray | None:
    """The samples' float targets as one (N, W) array, None when no sample has one.

    Raises:
        DatasetError: some samples have one and some not, or their widths differ.
    """
    have = [t for t in targets if t is not None]
    if not have:
        return None
    widths = sorted({len(t) for t in have})
    if len(have) != len(targets) or len(widths) > 1:
        raise DatasetError(f"dataset {path}: {len(have)} of {len(targets)} samples carry a float target, of "
                           f"{' or '.join(map(str, widths))} values: every sample needs one, all of one width")
    return np.stack(have).astype(np.float64)


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
