"""What every benchmark shares (it imports nothing else of `benchmarks`): typed `Result`s with the `RunContext` they
were measured in, the `Bench` spec and `publish` (the end of every run), `LaunchOptions` and the shared options,
repeats and trends, and the Markdown, console and plot helpers of BENCHMARKS.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Generic, TypeVar

import numpy as np
import psutil
import typer
from pydantic import PrivateAttr, ValidationError

from streamtrain.config import StreamtrainConfig, load_config, parse_assignment
from streamtrain.report.record import Record
from streamtrain.runtime.commands import GlobalOptions, module_command, set_args

__all__ = ["TIMES", "Bench", "External", "LaunchOptions", "Out", "Quick", "Record", "Result", "RunContext", "Seed",
           "Target", "WorkDir", "figure", "heldout_score", "interleaved", "median_reached", "num", "problems",
           "publish", "pyplot", "relative", "robust_slope", "slope", "table", "targets_table", "trailing_mean"]

logger = logging.getLogger(__name__)

#: The multiplication sign of ratios in the Markdown (spelt out for the linter).
TIMES = "\N{MULTIPLICATION SIGN}"

# The options the benchmarks' commands share (each command gives its own default).
Out = Annotated[Path, typer.Option("--out", metavar="DIR", help="Directory for the benchmark's JSON and plot.")]
WorkDir = Annotated[Path, typer.Option(help="The runs' logs, reports and checkpoints (WORK_DIR/<benchmark>), kept out "
                                       "of --out, which may be committed.")]
External = Annotated[bool, typer.Option(help="Use the Kafka at kafka.bootstrap_servers instead of a private embedded "
                                        "broker.")]
Quick = Annotated[bool, typer.Option(help="A short variant: proves it runs end to end, measures little.")]
Seed = Annotated[int, typer.Option(help="Seed of the data and the model.")]


class RunContext(Record):
    """Where and how a benchmark's figures were measured: what makes two runs comparable, or not."""

    commit: str | None
    """The checked-out commit (`+dirty` with uncommitted changes); None outside git."""
    cpu_model: str | None
    cores: int | None
    memory_gib: float | None
    load_start: tuple[float, float, float] | None
    """The 1-, 5- and 15-minute load averages when the benchmark started."""
    load_end: tuple[float, float, float] | None
    started_at: str
    seconds: float | None
    command: str
    _began: float = PrivateAttr(default=0.0)

    @classmethod
    def begin(cls) -> RunContext:
        """The context now (`stamp` adds the load at the end and the seconds)."""
        context = cls(commit=_commit(), cpu_model=_cpu_model(), cores=os.cpu_count(), load_start=_load(), load_end=None,
                      memory_gib=round(psutil.virtual_memory().total / 1024**3, 1), seconds=None,
                      command=shlex.join(["streamtrain", *sys.argv[1:]]),
                      started_at=datetime.now().astimezone().isoformat(timespec="seconds"))
        context._began = time.monotonic()
        return context

    def stamp(self, path: Path) -> None:
        """Add this context, ended now, to the JSON object a benchmark just wrote at `path`."""
        ended = self.model_copy(update={"load_end": _load(), "seconds": round(time.monotonic() - self._began, 1)})
        path.write_text(json.dumps({**json.loads(path.read_text()), "context": ended.model_dump()}, indent=1) + "\n")

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


def _load() -> tuple[float, float, float]:
    one, five, fifteen = psutil.getloadavg()
    return round(one, 2), round(five, 2), round(fifteen, 2)


class Result(Record):
    """A benchmark's whole JSON: its figures, and the context they were measured in."""

    context: RunContext | None = None
    """Stamped by `bench` itself once the benchmark has written its JSON; None in files from before."""


R = TypeVar("R", bound=Result)


#: Where each benchmark's account of how it measures lives (a page of the docs site, and its BENCHMARKS.md section).
METHODS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"


def problems(exc: ValueError) -> str:
    """What is wrong with a setup, for a person: a validation error's messages (each after the setting it is about)
    without pydantic's framing."""
    if not isinstance(exc, ValidationError):
        return str(exc)
    messages = []
    for error in exc.errors():
        message = str(error["msg"]).removeprefix("Value error, ")
        messages.append(f"{'.'.join(map(str, error['loc']))}: {message}" if error["loc"] else message)
    return "; ".join(messages)


def relative(path: Path, start: Path) -> str:
    """`path` relative to the directory `start`, with forward slashes (a Markdown link)."""
    return Path(os.path.relpath(path.resolve(), start.resolve())).as_posix()


@dataclass(frozen=True)
class Target:
    """One target of a benchmark: what it asks, what was measured, the paper's figure, and whether it was met."""

    goal: str
    measured: str
    met: bool | None
    paper: str | None = None


@dataclass(frozen=True)
class Bench(Generic[R]):
    """One benchmark of the set: `streamtrain bench <name>`, writing `<name>.json` (and `<name>.png`) in its --out."""

    name: str
    command: Callable[..., None]
    """The typer command."""
    result: type[R]
    render: Callable[[R], str]
    """Its result → its figures in BENCHMARKS.md (tables and targets; the plot's link is appended)."""
    targets: Callable[[R], list[Target]] | None = None
    """What it is judged by: in its section (as `render` places them) and on the console after a run."""
    plot: Callable[[R], Any] | None = None
    """Its result → a matplotlib figure, saved as `<name>.png` next to the JSON."""
    args: tuple[str, ...] = ()
    """Extra arguments `bench all` passes (`quick_args` with `--quick`), and the most seconds it lets it run."""
    quick_args: tuple[str, ...] = ()
    timeout_s: float = 600.0
    command_line: str = ""
    """How the committed figures are measured (the arguments after `streamtrain bench NAME`), when not `args`."""

    @property
    def json_name(self) -> str:
        return f"{self.name}.json"

    @property
    def about(self) -> str:
        """What it measures and how: the Markdown of `docs/benchmarks/<name>.md` ("" outside a checkout)."""
        path = METHODS / f"{self.name}.md"
        return path.read_text() if path.is_file() else ""

    def draw(self, result: R, data_dir: Path) -> Path | None:
        """Its plot of `result` as `data_dir/<name>.png` (None without one, or with nothing measured to draw)."""
        if self.plot is None:
            return None
        try:
            fig = self.plot(result)
        except ValueError as exc:  # a plot must never lose the figures
            logger.warning("%s.png not drawn: %s", self.name, exc)
            return None
        fig.tight_layout()
        data_dir.mkdir(parents=True, exist_ok=True)
        fig.savefig(path := data_dir / f"{self.name}.png", dpi=110)
        pyplot().close(fig)
        return path

    def section(self, path: Path, markdown_dir: Path) -> str:
        """The Markdown body of the result stored at `path`: its measuring context, its figures, its plot."""
        result = self.result.load(path)
        png = self.draw(result, path.parent)
        return "\n\n".join([result.context.describe() if result.context else "Measuring context not recorded.",
                            self.render(result), *([f"![{self.name}]({relative(png, markdown_dir)})"] if png else [])])


def publish(bench: Bench[R], result: R, out: Path) -> R:
    """The end of a benchmark's run: its JSON and plot in `out`, then its targets and what it wrote on the console."""
    from streamtrain.runtime.commands import console

    out.mkdir(parents=True, exist_ok=True)
    written = [result.write(out / bench.json_name), bench.draw(result, out)]
    word = {True: "met", False: "NOT MET", None: "not judged"}
    for t in bench.targets(result) if bench.targets else []:
        console.print(f"{word[t.met]:>10}: {t.goal} — {t.measured}", highlight=False, soft_wrap=True)
    console.print("wrote " + " and ".join(str(p) for p in written if p), highlight=False)
    return result


@dataclass(frozen=True)
class LaunchOptions:
    """The root options a benchmark was started with (`streamtrain --config F --set K=V bench ...`): its
    configuration is loaded from them plus its own settings, and what it starts gets them followed by its own."""

    config_file: str | None = None
    sets: tuple[str, ...] = ()
    """Each `--set KEY=VALUE`, as given."""

    @classmethod
    def of(cls, ctx: typer.Context) -> LaunchOptions:
        """The options of the command line behind a typer context."""
        opts = ctx.find_root().obj
        return cls(opts.config_file, tuple(opts.sets)) if isinstance(opts, GlobalOptions) else cls()

    def overrides(self) -> dict[str, Any]:
        """The `--set` flags as dotted setting → value."""
        return dict(parse_assignment(s) for s in self.sets)

    def config(self, settings: Mapping[str, object] | None = None) -> StreamtrainConfig:
        """The configuration these options give, with `settings` (dotted → value) on top."""
        return load_config(self.config_file, overrides={**self.overrides(), **(settings or {})})

    def argv(self, settings: Mapping[str, object] | None = None) -> list[str]:
        """These options as root flags, then one `--set` per setting (lists and dicts as JSON)."""
        given = [flag for assignment in self.sets for flag in ("--set", assignment)]
        return [*(["--config", self.config_file] if self.config_file else []), *given, *set_args(settings or {})]

    def command(self, module: str, *command: str, settings: Mapping[str, object] | None = None) -> tuple[str, ...]:
        """`python -m <module> <these options> <settings> <command>`: a service or the whole command line."""
        return module_command(module, *command, global_args=self.argv(), sets=settings)


def interleaved(kinds: Sequence[str], repeats: int, measure: Callable[[str, int], float]) -> dict[str, list[float]]:
    """Each kind measured `repeats` times (`measure(kind, repeat)`), the kinds one after another in each repeat and
    in reverse order every other one, so that a shared machine's drift falls on them alike and neighbours take turns
    going first."""
    out: dict[str, list[float]] = {kind: [] for kind in kinds}
    for r in range(repeats):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            out[kind].append(measure(kind, r))
    return out


def robust_slope(ts: Sequence[float], ys: Sequence[float]) -> float | None:
    """Theil-Sen slope: the median of the slopes between every pair of points (None with fewer than 3).

    A trend that goes on moves it; a single step (a process mapping in one larger batch's memory, a
    coordinator restart) moves only the pairs that straddle the step, so it does not read as growth.
    """
    if len(ts) < 3 or len(ts) != len(ys):
        return None
    t, y = np.asarray(ts, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    i, j = np.triu_indices(len(t), k=1)
    keep = t[j] - t[i] > 0
    return float(np.median((y[j] - y[i])[keep] / (t[j] - t[i])[keep])) if keep.any() else None


def slope(ts: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of ys over ts (units of y per unit of t); None with fewer than 3 points or one t."""
    if len(ts) < 3 or len(ts) != len(ys) or len(set(ts)) < 2:
        return None
    return float(np.polyfit(ts, ys, 1)[0])


def trailing_mean(values: Sequence[float], window: int) -> list[float]:
    """Each value's mean with the `window - 1` before it (fewer at the start)."""
    sums = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
    end = np.arange(1, len(sums))
    return [float(x) for x in (sums[end] - sums[np.maximum(end - window, 0)]) / (end - np.maximum(end - window, 0))]


def median_reached(seconds: Iterable[float | None]) -> float | None:
    """The median time to a target over runs, a run that never reached it (None) counted as the slowest:
    None when most runs did not (or there are none)."""
    values = [math.inf if s is None else s for s in seconds]
    mid = float(np.median(values)) if values else math.inf
    return mid if math.isfinite(mid) else None


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


def figure(value: float | None, spec: str, scale: float = 1.0, missing: str = "—") -> str:
    """`value` x `scale` formatted with `spec`, or `missing`."""
    return missing if value is None else format(value * scale, spec)


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table; strings as they are, anything else through `num`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(num(v) if not isinstance(v, str) else v for v in row) + " |" for row in rows]
    return "\n".join(lines)


def targets_table(targets: Sequence[Target], title: str = "target") -> str:
    """The targets as a Markdown table (a paper column when any target has a paper figure), then a line for each
    one missed: the target against what was measured."""
    papers = any(t.paper for t in targets)
    verdict = {None: "—", True: "**met**", False: "**not met**"}
    rows = [[t.goal, t.measured, *([t.paper or "—"] if papers else []), verdict[t.met]] for t in targets]
    missed = [f"- **Missed:** {t.goal} — measured {t.measured}." for t in targets if t.met is False]
    return "\n\n".join([table([title, "measured", *(["paper"] if papers else []), "verdict"], rows),
                        *(["\n".join(missed)] if missed else [])])


def heldout_score(model: Any, batch: Any) -> tuple[float, float]:
    """(accuracy, cross-entropy) of a classifier `model` on a collated held-out `batch` (eval mode, no grad)."""
    import torch

    model.eval()
    with torch.no_grad():
        logits = model(batch)
        loss = float(torch.nn.functional.cross_entropy(logits, batch.labels))
        return float((logits.argmax(1) == batch.labels).double().mean()), loss


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (benchmarks run without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
