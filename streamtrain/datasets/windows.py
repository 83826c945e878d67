"""One series over time cut into samples: windows of consecutive frames, its tail held out.

A sample is a whole series, so a dataset of one series (a CSV with no label, sample or target column; one unlabelled
array) is one sample, and nothing can be forecast from one sample. `split_series` cuts it the way a forecaster is
judged: the series' last frames (`held_out_share` of them, at least one window's) are the future, never trained on;
windows of `window` frames every `stride` frames are cut from the frames before them to train on, and from the tail
to hold out. A window that would straddle the two is cut from neither, so no held-out window shares a frame with a
training window. Each window's last `horizon` frames are what the `forecast` objective learns to forecast from the
frames before them.

The default window (`default_window`) is the horizon plus a sixth of the series (at least `MIN_INPUT` frames, at
most `MAX_INPUT`): with a quarter held out, the training part then holds about seven windows per twelve frames of
the series and the tail about one per twelve, and each window's input covers two cycles of any season up to a
twelfth of the series (Airline's 144 months: 24 months, two years; Lynx's 114 years: 19 years, two of its ten-year
cycles).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .files import Dataset
from .holdout import write_dataset

__all__ = ["DEFAULT_HELD_OUT_SHARE", "MAX_INPUT", "MIN_INPUT", "SeriesTooShort", "SeriesWindows", "default_window",
           "is_one_series", "split_series", "window_starts", "write_windows"]

#: Frames of input a default window holds at least (a forecast scales its steps by the input's mean step: two
#: frames make one step) and at most (a window of thousands of frames would leave few windows to learn from).
MIN_INPUT, MAX_INPUT = 2, 256
#: The share of a single series' frames, at its end, held out by default (`producer.dataset.held_out_share`).
DEFAULT_HELD_OUT_SHARE = 0.25


class SeriesTooShort(ValueError):
    """A series too short for one window to train on and a held-out tail after it; the message says what to set."""


def is_one_series(dataset: Dataset) -> bool:
    """Whether `dataset` is one unlabelled series without a target: nothing to learn but its own future."""
    return len(dataset) == 1 and not dataset.labelled and dataset.targets is None


def default_window(length: int, horizon: int) -> int:
    """Frames per window for a series of `length` frames forecast `horizon` frames ahead: the horizon plus a sixth
    of the series as input, at least `MIN_INPUT` and at most `MAX_INPUT` frames (see the module doc)."""
    return horizon + min(MAX_INPUT, max(MIN_INPUT, length // 6))


def window_starts(start: int, stop: int, window: int, stride: int) -> list[int]:
    """The first frame of every window of `window` frames, `stride` apart, that lies wholly in frames [start, stop)."""
    return list(range(start, stop - window + 1, stride))


@dataclass(frozen=True)
class SeriesWindows:
    """A series cut into training windows and held-out windows from its tail."""

    length: int
    """Frames in the series."""
    window: int
    stride: int
    train_frames: int
    """Frames [0, train_frames) are cut into training windows; [train_frames, length) are the held-out tail (none
    when a held-out set is named elsewhere)."""
    train: list[np.ndarray]
    held_out: list[np.ndarray]
    train_starts: tuple[int, ...]
    held_out_starts: tuple[int, ...]
    window_why: str = "producer.dataset.window"
    """Where the window's length came from: the setting, or the default for the series."""

    def describe(self) -> str:
        """What was cut, for a person."""
        tail = self.length - self.train_frames
        cut = (f"{self.length} frames cut into windows of {self.window} frames ({self.window_why}), stride "
               f"{self.stride} (producer.dataset.stride): {len(self.train)} to train on")
        if not tail:
            return cut
        return (f"{cut} from frames 0-{self.train_frames - 1}, {len(self.held_out)} held out from the last {tail} "
                f"frames ({self.train_frames}-{self.length - 1}, producer.dataset.held_out_share), none sharing a "
                "frame with a training window")


def _window(length: int, horizon: int, window: int | None, where: str) -> tuple[int, str]:
    """The window's frames (`window`, or the default for the series), and how a message names where it came from.

    Raises:
        SeriesTooShort: it leaves no frame to forecast from.
    """
    size = default_window(length, horizon) if window is None else window
    if size <= horizon:
        raise SeriesTooShort(f"{where}: producer.dataset.window={size} leaves no frame to forecast "
                             f"trainer.horizon={horizon} from (--set producer.dataset.window=N with N > {horizon})")
    which = ("producer.dataset.window" if window is not None else
             "the default, trainer.horizon + a sixth of the series; producer.dataset.window")
    return size, which


def _cut(series: np.ndarray, starts: list[int], size: int) -> list[np.ndarray]:
    return [series[s:s + size] for s in starts]


def split_series(series: np.ndarray, horizon: int, window: int | None = None, stride: int = 1,
                 held_out_share: float = DEFAULT_HELD_OUT_SHARE, where: str = "the series") -> SeriesWindows:
    """Cut `series` (frames, features) into training windows and, from its last frames, held-out windows.

    Args:
        series: The series, frames first.
        horizon: Frames at each window's end to forecast (`trainer.horizon`); a window holds more.
        window: Frames per window (`producer.dataset.window`); None: `default_window`.
        stride: Frames from one window's start to the next (`producer.dataset.stride`).
        held_out_share: The share of the frames, at the end, held out (at least one window's); 0: none, every window
            is cut to train on (a held-out set is named elsewhere).
        where: How errors name the series (its file).

    Raises:
        SeriesTooShort: the window leaves nothing to forecast from, or the series cannot hold one window to train on
            and one held out after it; the message names the file, its length and the settings to change.
    """
    length = int(series.shape[0])
    size, which = _window(length, horizon, window, where)
    tail = max(math.ceil(held_out_share * length), size) if held_out_share > 0 else 0
    if length - tail < size:
        held = f" and a held-out tail of {tail} frames after it" if tail else ""
        share = f"; or producer.dataset.held_out_share below {held_out_share:g}" if tail else ""
        raise SeriesTooShort(
            f"{where}: a series of {length} frames is too short for one window of {size} frames ({which}) to train "
            f"on{held}: it needs at least {size + tail} frames (--set producer.dataset.window=N with a smaller N, at "
            f"least trainer.horizon + 1 = {horizon + 1}; or a smaller trainer.horizon{share})")
    train_frames = length - tail
    train = window_starts(0, train_frames, size, stride)
    held_out = window_starts(train_frames, length, size, stride)
    return SeriesWindows(length, size, stride, train_frames, _cut(series, train, size), _cut(series, held_out, size),
                         tuple(train), tuple(held_out), which)


def write_windows(windows: list[np.ndarray], path: Path) -> Path:
    """Write `windows` as one unlabelled `.npz` (`x` the frames end to end, `sizes` each window's), as
    `load_dataset` reads it back; returns `path`."""
    return write_dataset(Dataset(windows, np.full(len(windows), -1, dtype=np.int64), [str(path)] * len(windows)), path)
