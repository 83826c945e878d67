"""What every benchmark shares; imports nothing else of `benchmarks`, so any module of it may import this.

- `Record` (from the core, `streamtrain.results`): the base of every typed result (and the setups stored
  with them): frozen, unknown keys rejected, written to and read from the JSON files under `--out DIR`.
- `Bench`: one benchmark of the set — its command, its result type, how its JSON becomes a
  section of BENCHMARKS.md, and what `bench all` passes it.
- `LaunchOptions`: the root `--config` / `--set` a benchmark was started with, typed, passed on to
  the configuration it loads and to every process it starts.
- Trends (`slope`, `robust_slope`), times to a target over repeats (`median_reached`), formatting for
  BENCHMARKS.md (`num`, `table`, `verdict`, `TIMES`) and plots (`pyplot`, `save_figure`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import typer
from pydantic import ValidationError

from streamtrain.cli_support import GlobalOptions, module_command
from streamtrain.config import StreamtrainConfig, load_config, parse_assignment
from streamtrain.results import Record

__all__ = [
    "TIMES",
    "Bench",
    "LaunchOptions",
    "Record",
    "RenderContext",
    "median_reached",
    "num",
    "problems",
    "pyplot",
    "robust_slope",
    "save_figure",
    "slope",
    "table",
    "verdict",
]

#: The multiplication sign of ratios in the Markdown (spelt out for the linter).
TIMES = "\N{MULTIPLICATION SIGN}"


R = TypeVar("R", bound=Record)


def problems(exc: ValueError) -> str:
    """What is wrong with a setup, for a person: a validation error's messages without pydantic's framing."""
    if isinstance(exc, ValidationError):
        return "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
    return str(exc)


@dataclass(frozen=True)
class RenderContext:
    """Where a renderer writes its plot, and where the Markdown that links it lives."""

    data_dir: Path
    """Directory holding the benchmark's JSON; plots are written next to it."""
    markdown_dir: Path
    """Directory of the Markdown file (image links are relative to it)."""

    def plot_path(self, name: str) -> Path:
        return self.data_dir / name

    def link(self, path: Path) -> str:
        return Path(os.path.relpath(path.resolve(), self.markdown_dir.resolve())).as_posix()


@dataclass(frozen=True)
class Bench(Generic[R]):
    """One benchmark of the set: `streamtrain bench <name>`, writing `<name>.json` in its `--out DIR`."""

    name: str
    """The command's name."""
    command: Callable[..., None]
    """The typer command."""
    result: type[R]
    """What its JSON holds."""
    render: Callable[[R, RenderContext], str]
    """Its result → its section of BENCHMARKS.md (tables, plot, targets)."""
    args: tuple[str, ...] = ()
    """Extra arguments `bench all` passes."""
    quick_args: tuple[str, ...] = ()
    """Extra arguments `bench all --quick` passes."""
    timeout_s: float = 600.0
    """Most seconds `bench all` lets it run."""

    @property
    def json_name(self) -> str:
        return f"{self.name}.json"

    def section(self, path: Path, ctx: RenderContext) -> str:
        """The Markdown section of the result stored at `path`."""
        return self.render(self.result.load(path), ctx)


@dataclass(frozen=True)
class LaunchOptions:
    """The root options a benchmark was started with (`streamtrain --config F --set K=V bench ...`).

    A benchmark loads its configuration from them plus its own settings, and starts its services
    (and `bench all` its benchmarks) with the same options followed by its own `--set` flags.
    """

    config_file: str | None = None
    """The TOML file of `--config`."""
    sets: tuple[str, ...] = ()
    """Each `--set KEY=VALUE`, as given."""

    @classmethod
    def of(cls, ctx: typer.Context) -> LaunchOptions:
        """The options of the command line behind a typer context."""
        opts = ctx.find_root().obj
        if not isinstance(opts, GlobalOptions):
            return cls()
        return cls(opts.config_file, tuple(opts.sets))

    def overrides(self) -> dict[str, Any]:
        """The `--set` flags as dotted setting → value."""
        return dict(parse_assignment(s) for s in self.sets)

    def config(self, settings: Mapping[str, object] | None = None) -> StreamtrainConfig:
        """The configuration these options give, with `settings` (dotted → value) on top."""
        return load_config(self.config_file, overrides={**self.overrides(), **(settings or {})})

    def argv(self, settings: Mapping[str, object] | None = None) -> list[str]:
        """These options as root flags, then one `--set` per setting (lists and dicts as JSON, as
        `module_command` writes them): what a process that passes root options on (the local stack) takes."""
        out = ["--config", self.config_file] if self.config_file else []
        for assignment in self.sets:
            out += ["--set", assignment]
        for key, value in (settings or {}).items():
            text = json.dumps(value) if isinstance(value, list | tuple | dict) else str(value)
            out += ["--set", f"{key}={text}"]
        return out

    def command(self, module: str, *command: str, settings: Mapping[str, object] | None = None) -> tuple[str, ...]:
        """`python -m <module> <these options> <settings> <command>`: a service (`producers`, `coordinator`,
        `trainer`) or the whole command line (`CLI_MODULE`) of this installation."""
        return module_command(module, *command, global_args=self.argv(), sets=settings)


# ---------------------------------------------------------------------------------------------
# Trends


def robust_slope(ts: Sequence[float], ys: Sequence[float]) -> float | None:
    """Theil-Sen slope: the median of the slopes between every pair of points (None with fewer than 3).

    A trend that goes on moves it; a single step (a process mapping in one larger batch's memory, a
    coordinator restart) moves only the pairs that straddle the step, so it does not read as growth.
    """
    if len(ts) < 3 or len(ts) != len(ys):
        return None
    t, y = np.asarray(ts, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    i, j = np.triu_indices(len(t), k=1)
    dt = t[j] - t[i]
    keep = dt > 0
    return float(np.median((y[j] - y[i])[keep] / dt[keep])) if keep.any() else None


def median_reached(seconds: Iterable[float | None]) -> float | None:
    """The median time to a target over runs, a run that never reached it (None) counted as the slowest:
    None when most runs did not (or there are none)."""
    values = [math.inf if s is None else s for s in seconds]
    mid = float(np.median(values)) if values else math.inf
    return mid if math.isfinite(mid) else None


def slope(ts: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of ys over ts (units of y per unit of t); None with fewer than 3 points."""
    if len(ts) < 3 or len(ts) != len(ys):
        return None
    n = len(ts)
    mt, my = sum(ts) / n, sum(ys) / n
    var = sum((t - mt) ** 2 for t in ts)
    if var == 0:
        return None
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / var


# ---------------------------------------------------------------------------------------------
# Markdown


def num(value: Any, digits: int = 2) -> str:
    """A figure for a table: thousands separated, `digits` decimals (3 significant when tiny or huge),
    "—" for None, yes/no for booleans, lists comma-separated."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 10 ** -digits):
            return f"{value:.3g}"
        return f"{value:,.{digits}f}"
    if isinstance(value, list | tuple):
        return ", ".join(num(v, digits) for v in value)
    return str(value)


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table; strings as they are, anything else through `num`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(num(v) if not isinstance(v, str) else v for v in row) + " |" for row in rows]
    return "\n".join(lines)


def verdict(ok: bool | None) -> str:
    """**met**, **not met**, or — when not measured."""
    return "—" if ok is None else ("**met**" if ok else "**not met**")


# ---------------------------------------------------------------------------------------------
# Plots


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (benchmarks run without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> Path:
    """Lay out, write (PNG, 110 dpi) and close a benchmark's figure; returns `path`."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path
