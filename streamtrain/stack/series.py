"""`streamtrain up --dataset` on one series over time: cut into windows to train on, and its tail held out.

A dataset of one unlabelled series without targets (a CSV with no label, sample or target column; one `.npy`) is
one sample, and the `forecast` objective it is for needs many. `window_series` cuts it with
`streamtrain.datasets.split_series` (`producer.dataset.window`, `stride`, `held_out_share`; `trainer.horizon`) and
writes the windows where the run keeps its files, `<name>_TRAIN.npz` to replay and `<name>_TEST.npz` as the held-out
set (`trainer.eval_path`), so the producer and the ranks read them as any dataset, and the run directory holds what
was trained and judged. A held-out set named already (`trainer.eval_path`, `trainer.eval_packaged`, or the
`<name>_TEST.<ext>` beside a `<name>_TRAIN.<ext>`) keeps its place: the whole series is then cut to train on, and a
`_TEST` file beside it that is one series itself is cut whole into the held-out windows.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

from streamtrain.config import TrainerConfig
from streamtrain.config.producer import DatasetConfig
from streamtrain.datasets import (
    Dataset,
    DatasetError,
    SeriesTooShort,
    is_one_series,
    load_dataset,
    split_series,
    write_windows,
)
from streamtrain.datasets.windows import window_starts

__all__ = ["SeriesReplay", "where_written", "window_series"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SeriesReplay:
    """The windows `up` replays in place of the series, and what to tell the person."""

    dataset: Dataset
    """The training windows, as the producer will read them."""
    settings: dict[str, object]
    """`producer.dataset.path` (the training windows) and, when the tail is held out, `trainer.eval_path`."""
    note: str


def where_written(source: Path, workdir: Path | None) -> tuple[Path, str]:
    """Where `up` writes the sides it cuts a dataset into (`<stem>_TRAIN.npz`, `<stem>_TEST.npz`): `workdir`, else a
    new temporary directory, and the name of `source` (a file's stem or a directory's name) without `_TRAIN`."""
    folder = workdir if workdir is not None else Path(tempfile.mkdtemp(prefix="streamtrain-dataset-"))
    name = source.stem if source.is_file() else source.name
    return folder, name.removesuffix("_TRAIN").removesuffix("_train")


def window_series(where: str, dataset: Dataset, reading: DatasetConfig, trainer: TrainerConfig, workdir: Path | None,
                  held_out: str | None, beside: Path | None) -> SeriesReplay:
    """Cut the one series of `dataset` into windows and write them under `workdir` (a new temporary directory when
    None).

    Args:
        where: How messages name the dataset (`--dataset PATH`).
        dataset: The series, as loaded.
        reading: The `producer.dataset` settings (window, stride, held-out share, and how to read a `_TEST` file).
        trainer: The trainer settings (`trainer.horizon`).
        workdir: Where the windows are written.
        held_out: The held-out set already named (`trainer.eval_path` or `eval_packaged` as set, or `beside`); None:
            the series' tail is held out.
        beside: The `<name>_TEST.<ext>` beside a `<name>_TRAIN.<ext>`, when that is the held-out set.

    Raises:
        ValueError: the series is too short for the windows asked, or the `_TEST` file cannot be read; the message
            names the file, its length and the setting to change.
    """
    series = dataset.samples[0]
    source = Path(dataset.sources[0])
    folder, stem = where_written(source, workdir)
    try:
        cut = split_series(series, trainer.horizon, reading.window, reading.stride,
                           reading.held_out_share if held_out is None else 0.0, where=str(source))
    except SeriesTooShort as exc:
        raise ValueError(f"{where}: {exc}") from None
    note = cut.describe() + ("" if held_out is None else f", all of them: the held-out set is {held_out}")
    train_path = write_windows(cut.train, folder / f"{stem}_TRAIN.npz")
    settings: dict[str, object] = {"producer.dataset.path": str(train_path)}
    if held_out is None:
        settings["trainer.eval_path"] = str(write_windows(cut.held_out, folder / f"{stem}_TEST.npz"))
    elif beside is not None:
        test = _windowed_beside(beside, reading, cut.window, cut.stride, folder / f"{stem}_TEST.npz")
        if test is not None:
            settings["trainer.eval_path"] = str(test)
            note += f" (itself one series, cut whole into windows of {cut.window} frames)"
    logger.debug("%s: %s; windows written to %s", where, note, folder)
    return SeriesReplay(load_dataset(train_path), settings, f"{note}; written to {folder}")


def _windowed_beside(path: Path, reading: DatasetConfig, window: int, stride: int, out: Path) -> Path | None:
    """The `_TEST` file beside the training series cut whole into windows when it is one series too (None: it is
    not, and is read as it is).

    Raises:
        ValueError: it cannot be read, or is shorter than one window.
    """
    try:
        held = load_dataset(path, reading.label_column, reading.sample_column, reading.class_names,
                            reading.target_columns)
    except DatasetError as exc:
        raise ValueError(f"held-out set {path}: {exc}") from None
    if not is_one_series(held):
        return None
    frames = held.samples[0]
    starts = window_starts(0, len(frames), window, stride)
    if not starts:
        raise ValueError(f"held-out set {path}: a series of {len(frames)} frames is shorter than one window of "
                         f"{window} frames (producer.dataset.window)")
    return write_windows([frames[s:s + window] for s in starts], out)
