"""`BENCHMARKS.md` from the benchmarks' JSON: the generated sections between markers, the prose kept.

Only the text between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->` is regenerated, from
`NAME.json` (and `all.json` for the `all` section: what the last `bench all` ran).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .common import Bench, Record, RenderContext, table
from .registry import REGISTRY

__all__ = ["BenchRun", "SuiteRuns", "marker_names", "refresh", "refresh_markdown", "render_runs", "render_sections"]

_MARKER = re.compile(r"<!-- bench:([\w-]+) -->(.*?)<!-- /bench:\1 -->", re.DOTALL)


class BenchRun(Record):
    """How one benchmark of a `bench all` ended."""

    name: str
    status: str
    """ok, failed (exit N), timed out after N s, skipped, or not run (--only/--skip)."""
    seconds: float
    argv: list[str] | None = None
    """Its command line after `python -m <the CLI package>`."""


class SuiteRuns(Record):
    """What `all.json` holds: the last `bench all`."""

    quick: bool
    runs: list[BenchRun]


def marker_names(text: str) -> list[str]:
    """Names of the generated sections present in a Markdown text."""
    return [m.group(1) for m in _MARKER.finditer(text)]


def refresh_markdown(text: str, sections: Mapping[str, str]) -> tuple[str, list[str]]:
    """Replace the body of each `<!-- bench:NAME -->` … `<!-- /bench:NAME -->` section named in `sections`.

    Everything outside the markers, and sections not named, are kept byte for byte.

    Returns:
        The new text, and the names in `sections` that have no markers in `text`.
    """
    found: set[str] = set()

    def swap(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in sections:
            return match.group(0)
        found.add(name)
        return f"<!-- bench:{name} -->\n{sections[name].strip()}\n<!-- /bench:{name} -->"

    new = _MARKER.sub(swap, text)
    return new, [name for name in sections if name not in found]


def render_runs(suite: SuiteRuns) -> str:
    """The `all` section: what the last `bench all` ran, how it ended and how long it took."""
    total = sum(r.seconds for r in suite.runs)
    rows = [[f"`bench {r.name}`", r.status, f"{r.seconds:.0f} s"] for r in suite.runs]
    mode = "`--quick`" if suite.quick else "full"
    ran = sum(1 for r in suite.runs if not r.status.startswith("not run"))
    return "\n\n".join([f"Last `streamtrain bench all` ({mode}): {ran} of {len(suite.runs)} benchmarks run, "
                         f"in {total / 60:.1f} minutes.",
                         table(["benchmark", "status", "time"], rows)])


def render_sections(data_dirs: Sequence[Path], markdown_dir: Path,
                    benches: Sequence[Bench[Any]] = REGISTRY) -> dict[str, str]:
    """Markdown bodies of every benchmark whose JSON is in one of `data_dirs` (the first found wins).

    The `all` section summarises `all.json` (the last `bench all`) of the first directory holding one.
    """
    out = {}
    for data_dir in data_dirs:
        if (data_dir / "all.json").is_file():
            out["all"] = render_runs(SuiteRuns.load(data_dir / "all.json"))
            break
    for bench in benches:
        for data_dir in data_dirs:
            path = data_dir / bench.json_name
            if path.is_file():
                link = Path(os.path.relpath(path.resolve(), markdown_dir.resolve())).as_posix()
                source = f"_Generated from `{link}` by `streamtrain bench report`._"
                out[bench.name] = bench.section(path, RenderContext(data_dir, markdown_dir)) + "\n\n" + source
                break
    return out


def refresh(markdown: Path, data_dirs: list[Path], say: Any) -> None:
    """Rewrite the generated sections of `markdown` from the JSON in `data_dirs`, saying what it did.

    Args:
        markdown: the Markdown file.
        data_dirs: where the JSON files are (the first holding a benchmark's file wins).
        say: a rich console (or anything with its `print`).
    """
    if not markdown.is_file():
        say.print(f"[yellow]{markdown} does not exist: nothing to refresh")
        return
    sections = render_sections(data_dirs, markdown.parent)
    text = markdown.read_text()
    new, missing = refresh_markdown(text, sections)
    if new != text:
        markdown.write_text(new)
    say.print(f"refreshed {', '.join(sorted(set(sections) - set(missing))) or 'no'} section(s) of {markdown}"
              f" from {', '.join(str(d) for d in data_dirs)}", highlight=False)
    for name in missing:
        say.print(f"[yellow]{markdown} has no <!-- bench:{name} --> section; {name} was not written")
    stale = [n for n in marker_names(text) if n not in sections]
    if stale:
        say.print(f"kept as they were (no JSON found): {', '.join(stale)}", highlight=False)
