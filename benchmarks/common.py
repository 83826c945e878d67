"""What every benchmark shares; imports nothing else of `benchmarks`, so any module of it may import this.

- `Record` (from the core, `streamtrain.results`): the base of every typed result (and the setups stored
  with them): frozen, unknown keys rejected, written to and read from the JSON files under `--out DIR`.
- `Result`: a benchmark's whole JSON, with the `RunContext` it was measured in (commit, machine, load,
  date, command line), which `bench` stamps into it itself (`stamp_context`).
- `Bench`: one benchmark of the set — its command, its result type, how its JSON becomes a
  section of BENCHMARKS.md, and what `bench all` passes it.
- `LaunchOptions`: the root `--config` / `--set` a benchmark was started with, typed, passed on to
  the configuration it loads and to every process it starts.
- Trends (`slope`, `robust_slope`), times to a target over repeats (`median_reached`), formatting for
  BENCHMARKS.md (`num`, `figure`, `table`, `verdict`, `TIMES`), targets (`Target`: one table, the same lines
  on the console) and plots (`pyplot`, `save_figure`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import typer
from pydantic import PrivateAttr, ValidationError

from streamtrain.cli_support import GlobalOptions, module_command
from streamtrain.config import StreamtrainConfig, load_config, parse_assignment
from streamtrain.results import Record

__all__ = [
    "TIMES",
    "Bench",
    "LaunchOptions",
    "Record",
    "RenderContext",
    "Result",
    "RunContext",
    "Target",
    "figure",
    "heldout_score",
    "median_reached",
    "num",
    "problems",
    "progress_bars",
    "pyplot",
    "robust_slope",
    "save_figure",
    "slope",
    "stamp_context",
    "table",
    "target_lines",
    "targets_table",
    "verdict",
]

#: The multiplication sign of ratios in the Markdown (spelt out for the linter).
TIMES = "\N{MULTIPLICATION SIGN}"


class RunContext(Record):
    """Where and how a benchmark's figures were measured: what makes two runs comparable, or not."""

    commit: str | None
    """The checked-out commit (with `+dirty` when the tree had uncommitted changes); None outside git."""
    cpu_model: str | None
    cores: int | None
    memory_gib: float | None
    load_start: tuple[float, float, float] | None
    """The 1-, 5- and 15-minute load averages when the benchmark started."""
    load_end: tuple[float, float, float] | None
    started_at: str
    """ISO 8601, local time with its offset."""
    seconds: float | None
    """How long the benchmark ran."""
    command: str
    """The command line, as `streamtrain ...`."""
    _began: float = PrivateAttr(default=0.0)

    @classmethod
    def begin(cls) -> RunContext:
        """The context now: the machine, the commit, the load, the command line (`end` adds the load at the end)."""
        context = cls(commit=_commit(), cpu_model=_cpu_model(), cores=os.cpu_count(), memory_gib=_memory_gib(),
                      load_start=_load(), load_end=None, seconds=None,
                      command=shlex.join(["streamtrain", *sys.argv[1:]]),
                      started_at=datetime.now().astimezone().isoformat(timespec="seconds"))
        context._began = time.monotonic()
        return context

    def end(self) -> RunContext:
        """This context with the load at the end and the run's seconds."""
        return self.model_copy(update={"load_end": _load(), "seconds": round(time.monotonic() - self._began, 1)})

    def describe(self) -> str:
        """One paragraph for BENCHMARKS.md."""
        loads = " → ".join(f"{load[0]:.1f}" for load in (self.load_start, self.load_end) if load is not None)
        machine = ", ".join(x for x in (f"{self.cores} cores" if self.cores else None, self.cpu_model,
                                        f"{self.memory_gib:.0f} GiB" if self.memory_gib else None) if x)
        return (f"Measured {self.started_at[:16].replace('T', ' ')} at commit `{self.commit or 'unknown'}` on "
                f"{machine or 'an unrecorded machine'}; load average {loads or 'not recorded'} (start → end)"
                + (f"; {self.seconds / 60:.1f} min" if self.seconds is not None else "")
                + f". Command: `{self.command}`")


def _commit() -> str | None:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, check=True,
                              cwd=Path(__file__).parent).stdout.strip()

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def _memory_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return round(int(Path("/proc/meminfo").read_text().split()[1]) / 1024**2, 1)
    return None


def _load() -> tuple[float, float, float] | None:
    with contextlib.suppress(OSError):
        one, five, fifteen = os.getloadavg()
        return round(one, 2), round(five, 2), round(fifteen, 2)
    return None


class Result(Record):
    """A benchmark's whole JSON: its figures, and the context they were measured in."""

    context: RunContext | None = None
    """Stamped by `bench` itself when the benchmark has written its JSON; None in files from before."""


R = TypeVar("R", bound=Result)


def stamp_context(path: Path, context: RunContext) -> bool:
    """Add `context` (ended now) to the JSON file a benchmark just wrote; False when there is none to stamp."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict):
        return False
    data["context"] = context.end().model_dump()
    path.write_text(json.dumps(data, indent=1) + "\n")
    return True


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
    about: str = ""
    """What it measures and how, for a reader of BENCHMARKS.md (Markdown; the benchmark's module docstring)."""
    command_line: str = ""
    """How the committed figures are measured (the arguments after `streamtrain bench NAME`), when not `args`."""

    @property
    def json_name(self) -> str:
        return f"{self.name}.json"

    def section(self, path: Path, ctx: RenderContext) -> str:
        """The Markdown body of the result stored at `path`: its measuring context, then its figures."""
        result = self.result.load(path)
        context = result.context.describe() if result.context else "Measuring context not recorded."
        return context + "\n\n" + self.render(result, ctx)


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


def figure(value: float | None, spec: str, scale: float = 1.0, missing: str = "—") -> str:
    """`value` x `scale` formatted with `spec`, or `missing`."""
    return missing if value is None else format(value * scale, spec)


@dataclass(frozen=True)
class Target:
    """One target of a benchmark: what it asks, what was measured, the paper's figure, and whether it was met."""

    goal: str
    measured: str
    met: bool | None
    paper: str | None = None


def targets_table(targets: Sequence[Target], title: str = "target") -> str:
    """The targets as a Markdown table (a paper column when any target has a paper figure), then a line for each
    one missed: the target against what was measured."""
    papers = any(t.paper for t in targets)
    rows = [[t.goal, t.measured, *([t.paper or "—"] if papers else []), verdict(t.met)] for t in targets]
    missed = [f"- **Missed:** {t.goal} — measured {t.measured}." for t in targets if t.met is False]
    return "\n\n".join([table([title, "measured", *(["paper"] if papers else []), "verdict"], rows),
                         *(["\n".join(missed)] if missed else [])])


def target_lines(targets: Sequence[Target]) -> list[str]:
    """The targets as console lines: verdict, target, measured."""
    word = {True: "met", False: "NOT MET", None: "not judged"}
    return [f"{word[t.met]:>10}: {t.goal} — {t.measured}" for t in targets]


# ---------------------------------------------------------------------------------------------
# Progress and plots


@contextlib.contextmanager
def progress_bars(rows: Sequence[str], total: int, show: str = "", width: int = 9,
                  **fields: Any) -> Iterator[Callable[..., None]]:
    """Live progress bars on the console, one per row (each started when first updated).

    Args:
        rows: the bars' names.
        total: each bar's length (an update may change it).
        show: a rich format of the fields shown after each bar (`{task.fields[NAME]}`).
        width: the names' column width.
        fields: the fields' starting values.

    Yields:
        `update(row, completed, total=None, description=None, **fields)`.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from streamtrain.cli_support import console

    columns = (TextColumn(f"{{task.description:<{width}}}"), BarColumn(), MofNCompleteColumn(), TextColumn(show),
               TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        tasks = {row: bar.add_task(row, total=total, start=False, **fields) for row in rows}

        def update(row: str, completed: int, total: int | None = None, description: str | None = None,
                   **values: Any) -> None:
            bar.start_task(tasks[row])
            bar.update(tasks[row], completed=completed, total=total, description=description, **values)

        yield update


def heldout_score(model: Any, batch: Any) -> tuple[float, float]:
    """(accuracy, cross-entropy) of a classifier `model` on a collated held-out `batch` (eval mode, no grad)."""
    import torch

    model.eval()
    with torch.no_grad():
        logits = model(batch)
        loss = float(torch.nn.functional.cross_entropy(logits, batch.labels))
        return float((logits.argmax(1) == batch.labels).double().mean()), loss


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
