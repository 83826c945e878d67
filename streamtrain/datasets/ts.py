"""The UEA/UCR time-series archive's `.ts` format: a header of `@` tags, then one series per line.

    # comments start with '#' (or '%', as in the archive's ARFF files and some of its .ts files)
    @problemName PLAID
    @univariate true              (false: several dimensions, see @dimensions)
    @dimensions 1                 (optional; checked against every line)
    @equalLength false            (true: every series has @seriesLength values)
    @seriesLength 100             (optional, with @equalLength true)
    @missing false                (informational: '?' marks a missing value either way)
    @timeStamps false             (true is not supported: the values carry no timestamps here)
    @classLabel true 0 1 2 3      (the class names; false: the series are unlabelled)
    @targetLabel true             (instead of @classLabel: every series ends with a number to regress)
    @data
    0.17,0.13,0.13:1              (values of each dimension, comma-separated, dimensions
    1.0,?,2.0:0.5,0.5,0.4:3        separated by ':', then the class label when @classLabel true,
                                   or the target value when @targetLabel true)

Every error names the file and the line and says what is wrong there. Labels are strings; a series'
label is its class name's position in `@classLabel`, so a train and a test file that declare the same
classes number them alike. Missing values are kept as NaN here; `fill_missing` decides what a sample
gets instead.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

__all__ = ["TsData", "TsFormatError", "TsHeader", "fill_missing", "parse_ts", "read_ts"]

logger = logging.getLogger(__name__)

_FLOAT32_MAX = float(np.finfo(np.float32).max)

#: What a comment line starts with: '#', or '%' (the archive's ARFF convention, kept in some of its .ts files,
#: e.g. UnitTest's `%# This is a cut down version of ...`); no series line starts with either.
COMMENTS = ("#", "%")

#: The header tags this reader knows, lower-cased as they are matched.
KNOWN_TAGS = ("problemname", "timestamps", "missing", "univariate", "dimensions", "equallength", "serieslength",
              "classlabel", "targetlabel", "data")


class TsFormatError(ValueError):
    """A `.ts` file that cannot be read; the message is `file:line: reason`."""

    def __init__(self, source: str, line: int | None, reason: str) -> None:
        self.source = source
        self.line = line
        self.reason = reason
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True)
class TsHeader:
    """What a file's `@` tags declare (None: not declared)."""

    problem_name: str | None = None
    univariate: bool | None = None
    dimensions: int | None = None
    equal_length: bool | None = None
    series_length: int | None = None
    missing: bool | None = None
    class_names: tuple[str, ...] | None = None
    """The declared classes in order; None when the series carry no class label."""
    target_label: bool = False
    """`@targetLabel true`: every series ends with a float target (the archive's regression problems)."""


@dataclass(frozen=True)
class TsData:
    """The series of one `.ts` file.

    Attributes:
        header: the declared tags.
        series: one float32 array of shape (length, dimensions) per series; NaN where a value is missing.
        labels: each series' class index into `header.class_names` (-1 when unlabelled).
        lines: the line each series was read from.
        targets: with `@targetLabel true`, each series' float target; else None.
    """

    header: TsHeader
    series: list[np.ndarray]
    labels: np.ndarray
    lines: list[int]
    targets: np.ndarray | None = None


def _boolean(value: str, tag: str, source: str, line: int) -> bool:
    word = value.strip().lower()
    if word not in ("true", "false"):
        raise TsFormatError(source, line, f"@{tag} takes true or false, not {value.strip()!r}")
    return word == "true"


def _positive(value: str, tag: str, source: str, line: int) -> int:
    text = value.strip()
    if not text.isdigit() or int(text) < 1:
        raise TsFormatError(source, line, f"@{tag} takes a whole number >= 1, not {text!r}")
    return int(text)


@dataclass
class _Draft:
    """The header while its tags are read."""

    seen: set[str] = field(default_factory=set)
    declared: TsHeader = field(default_factory=TsHeader)

    def read(self, tag: str, rest: str, source: str, number: int) -> None:  # noqa: C901  a line-by-line reader of the .ts header keywords and data, one branch per keyword
        """Take one header line `@tag rest`."""
        if tag not in KNOWN_TAGS:
            raise TsFormatError(source, number, f"unknown header tag @{tag} (known: "
                                + ", ".join(f"@{t}" for t in KNOWN_TAGS) + ")")
        if tag == "problemname":  # a name only: a second one (sktime's UnitTest_TEST.ts has two) is kept, said so
            if tag in self.seen:
                logger.warning("%s:%d: a second @problemName (%s): it replaces the first", source, number,
                               rest.strip())
            self.seen.add(tag)
            self.declared = replace(self.declared, problem_name=rest.strip() or None)
            return
        if tag in self.seen:
            raise TsFormatError(source, number, f"@{tag} is declared twice")
        self.seen.add(tag)
        if tag == "timestamps":
            if _boolean(rest, tag, source, number):
                raise TsFormatError(source, number, "@timeStamps true is not supported: write the values without "
                                    "timestamps (one comma-separated list per dimension)")
        elif tag == "missing":
            self.declared = replace(self.declared, missing=_boolean(rest, tag, source, number))
        elif tag == "univariate":
            self.declared = replace(self.declared, univariate=_boolean(rest, tag, source, number))
        elif tag == "equallength":
            self.declared = replace(self.declared, equal_length=_boolean(rest, tag, source, number))
        elif tag == "dimensions":
            self.declared = replace(self.declared, dimensions=_positive(rest, tag, source, number))
        elif tag == "serieslength":
            self.declared = replace(self.declared, series_length=_positive(rest, tag, source, number))
        elif tag == "classlabel":
            flag, _, names = rest.strip().partition(" ")
            if _boolean(flag, tag, source, number):
                classes = tuple(names.split())
                if not classes:
                    raise TsFormatError(source, number, "@classLabel true names no classes")
                if len(set(classes)) != len(classes):
                    raise TsFormatError(source, number, "@classLabel names a class twice")
                self.declared = replace(self.declared, class_names=classes)
        elif tag == "targetlabel":
            words = rest.split()
            if _boolean(words[0] if words else "", tag, source, number):
                self.declared = replace(self.declared, target_label=True)

    def header(self, source: str, line: int) -> TsHeader:
        """The finished header, checked for contradictions."""
        h = self.declared
        if h.univariate and h.dimensions not in (None, 1):
            raise TsFormatError(source, line, f"@univariate true contradicts @dimensions {h.dimensions}")
        if h.series_length is not None and h.equal_length is False:
            raise TsFormatError(source, line, "@seriesLength is declared but @equalLength is false")
        if h.target_label and h.class_names is not None:
            raise TsFormatError(source, line, "@targetLabel true and @classLabel true: a series ends with one label, "
                                "a class or a target value")
        return h


def _values(text: str, source: str, line: int, dim: int) -> np.ndarray:
    parts = text.split(",")
    if "?" not in text:
        try:  # the common case in one C call; the token-by-token loop below says what is wrong otherwise
            fast = np.array(parts, dtype=np.float64)
        except ValueError:
            pass
        else:
            if np.isfinite(fast).all():
                return fast
    out = np.empty(len(parts), dtype=np.float64)
    for i, part in enumerate(parts):
        token = part.strip()
        if token == "?":
            out[i] = np.nan
            continue
        try:
            out[i] = float(token)
        except ValueError:
            shown = token if len(token) <= 30 else token[:27] + "..."
            raise TsFormatError(source, line, f"dimension {dim + 1}, value {i + 1}: {shown!r} is not a number "
                                "(missing values are written '?')") from None
        if not np.isfinite(out[i]):
            raise TsFormatError(source, line, f"dimension {dim + 1}, value {i + 1}: {token!r} is not finite "
                                "(missing values are written '?')")
    return out


def _target(parts: list[str], source: str, line: int) -> float:
    """The float target ending a series' line (popped from `parts`)."""
    if len(parts) < 2:
        raise TsFormatError(source, line, "no target value after the values (expected values:target)")
    token = parts.pop().strip()
    if token == "?":
        return float("nan")  # missing: the loader leaves the series out on its own
    try:
        return float(token)  # NaN, infinite or beyond float32: the loader leaves the series out on its own
    except ValueError:
        raise TsFormatError(source, line, f"target value {token!r} is not a number") from None


def _series(text: str, header: TsHeader, source: str, line: int) -> tuple[np.ndarray, int, float]:
    parts = text.split(":")
    label = -1
    target = _target(parts, source, line) if header.target_label else float("nan")
    if header.class_names is not None:
        if len(parts) < 2:
            raise TsFormatError(source, line, "no class label after the values (expected values:label)")
        name = parts.pop().strip()
        if name not in header.class_names:
            raise TsFormatError(source, line, f"class label {name!r} is not one of @classLabel "
                                f"{' '.join(header.class_names)}")
        label = header.class_names.index(name)
    want = 1 if header.univariate else header.dimensions
    if want is not None and len(parts) != want:
        labelled = header.class_names is not None or header.target_label
        raise TsFormatError(source, line, f"{len(parts)} dimensions, the header declares {want}"
                            + (" (is a label missing or one too many?)" if labelled or len(parts) == want + 1
                               else ""))
    dims = []
    for d, part in enumerate(parts):
        if not part.strip():
            raise TsFormatError(source, line, f"dimension {d + 1} is empty")
        dims.append(_values(part, source, line, d))
    length = max(len(v) for v in dims)
    # Dimensions of one series may differ in length in the archive's files: the shorter ones count as
    # missing at their end (then filled like any other missing value).
    array = np.full((length, len(dims)), np.nan, dtype=np.float64)
    for d, values in enumerate(dims):
        array[: len(values), d] = values
    if np.isnan(array).all():
        raise TsFormatError(source, line, "every value of the series is missing")
    if header.equal_length and header.series_length is not None and length != header.series_length:
        raise TsFormatError(source, line, f"series of length {length}, the header declares @seriesLength "
                            f"{header.series_length}")
    big = float(np.nanmax(np.abs(array)))
    if big > _FLOAT32_MAX:
        raise TsFormatError(source, line, f"a value of {big:.3g} is beyond float32's range (+-{_FLOAT32_MAX:.3g}), "
                            "the dtype samples are read in: scale the data")
    return array.astype(np.float32), label, target


def parse_ts(lines: Iterable[str], source: str = "<ts>") -> TsData:
    """Parse the lines of a `.ts` file.

    Args:
        lines: the file's lines (a leading byte-order mark is tolerated).
        source: the name errors give the file.

    Returns:
        The header and every series, in file order.

    Raises:
        TsFormatError: naming the line and what is wrong with it.
    """
    draft = _Draft()
    header: TsHeader | None = None
    series: list[np.ndarray] = []
    labels: list[int] = []
    targets: list[float] = []
    where: list[int] = []
    dims_seen: int | None = None
    number = 0
    for number, raw in enumerate(lines, start=1):
        text = raw.strip().lstrip("\ufeff").strip()
        if not text or text.startswith(COMMENTS):
            continue
        if header is None:
            if not text.startswith("@"):
                raise TsFormatError(source, number, "data before @data (the header ends with a line '@data')")
            tag, _, rest = text[1:].partition(" ")
            tag = tag.strip().lower()
            draft.read(tag, rest, source, number)
            if tag == "data":
                header = draft.header(source, number)
            continue
        if text.startswith("@"):
            raise TsFormatError(source, number, f"header tag {text.split()[0]} after @data")
        array, label, target = _series(text, header, source, number)
        if dims_seen is not None and array.shape[1] != dims_seen:
            raise TsFormatError(source, number, f"{array.shape[1]} dimensions, earlier series have {dims_seen}")
        dims_seen = array.shape[1]
        series.append(array)
        labels.append(label)
        targets.append(target)
        where.append(number)
    if header is None:
        raise TsFormatError(source, number or None, "no @data line: not a .ts file, or its header is cut short")
    if not series:
        raise TsFormatError(source, number, "no series after @data")
    return TsData(header, series, np.asarray(labels, dtype=np.int64), where,
                  np.asarray(targets, dtype=np.float64) if header.target_label else None)


def read_ts(path: Path) -> TsData:
    """Read one `.ts` file (UTF-8).

    Raises:
        TsFormatError: the file cannot be read, or a line is malformed (`file:line: reason`).
    """
    try:
        with path.open(encoding="utf-8-sig") as fh:
            return parse_ts(fh, str(path))
    except UnicodeDecodeError as exc:
        raise TsFormatError(str(path), None, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise TsFormatError(str(path), None, f"cannot read it ({exc.strerror or exc})") from None


def fill_missing(series: np.ndarray) -> tuple[np.ndarray, int]:
    """A series without NaN: trailing steps missing in every dimension are cut (padding), the other missing
    values are interpolated linearly along time within their dimension (held constant past either end).

    Args:
        series: (length, dims) values with NaN where missing; at least one value present.

    Returns:
        The filled series (float32, possibly shorter) and how many values were filled.
    """
    present = ~np.isnan(series)
    rows = np.flatnonzero(present.any(axis=1))
    out = series[: rows[-1] + 1].astype(np.float32, copy=True)
    filled = 0
    t = np.arange(out.shape[0])
    for d in range(out.shape[1]):
        column = out[:, d]
        gaps = np.isnan(column)
        if not gaps.any():
            continue
        if gaps.all():
            column[:] = 0.0  # a dimension with no value at all in this series: nothing to interpolate from
        else:
            column[gaps] = np.interp(t[gaps], t[~gaps], column[~gaps])
        filled += int(gaps.sum())
    return out, filled
