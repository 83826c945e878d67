"""Real datasets on disk: the `.ts` archive format, `.npy`/`.npz`/`.csv` layouts, packaged datasets, and one series cut
into windows.

Shared by the producers (replay into device topics) and the trainers (held-out evaluation).
"""

from .files import Dataset, DatasetError, SkippedFile, SkippedSample, load_dataset, load_sizes
from .holdout import HeldOutSplit, hold_out, stratified_subset, subset, write_dataset
from .packaged import PACKAGED, PackagedDataset, packaged_file
from .ts import TsData, TsFormatError, TsHeader, fill_missing, parse_ts, read_ts
from .windows import SeriesTooShort, SeriesWindows, is_one_series, split_series, write_windows

__all__ = [
    "PACKAGED",
    "Dataset",
    "DatasetError",
    "HeldOutSplit",
    "PackagedDataset",
    "SeriesTooShort",
    "SeriesWindows",
    "SkippedFile",
    "SkippedSample",
    "TsData",
    "TsFormatError",
    "TsHeader",
    "fill_missing",
    "hold_out",
    "is_one_series",
    "load_dataset",
    "load_sizes",
    "packaged_file",
    "parse_ts",
    "read_ts",
    "split_series",
    "stratified_subset",
    "subset",
    "write_dataset",
    "write_windows",
]
