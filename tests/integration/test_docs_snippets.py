"""The docs' commands, run: a command that stops working fails the suite instead of rotting on a page.

Every page under `docs/` and `README.md` is read for fenced blocks on the line right after `<!-- run -->`
(docs/development/docs.md describes the convention):

- a page's `python` blocks are joined in order and run as one script in a fresh scratch directory;
- each `bash` block runs on its own with `bash -euo pipefail`, `.venv/bin` on PATH, the repository root
  as its working directory;
- `localhost:9092` becomes the test broker's address (the `broker` fixture, only for blocks that name it),
  and `STREAMTRAIN_KAFKA__TOPIC_PREFIX` a prefix of the block's own.

Each block has a time limit (its whole process group is killed past it); a failure names the page, the
block, its first line and its output.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: What a run block writes as the broker's address; the test broker's replaces it.
DOCS_BROKER = "localhost:9092"
#: Seconds one bash block, or one page's python script, may take ("well under a minute" each, on 2 cores).
BLOCK_TIMEOUT_S = 120.0
_OUTPUT_TAIL = 6000
_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})(?P<lang>[\w-]*)\s*$")
_RUN_MARK = "<!-- run -->"


@dataclass(frozen=True)
class Block:
    """One `<!-- run -->` block of a page."""

    page: str
    """The page, relative to the repository root."""
    number: int
    """Its number among the page's run blocks, from 1."""
    line: int
    """The line of its opening fence."""
    lang: str
    code: str

    def where(self) -> str:
        return f"{self.page} run block {self.number} (line {self.line}, {self.lang})"


class MarkerError(ValueError):
    """A `<!-- run -->` that is not right above a fenced bash or python block."""


def pages() -> list[Path]:
    """Every page the docs tests read: README.md and the Markdown under docs/ (not the hooks' sources)."""
    docs = sorted(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.relative_to(ROOT / "docs").parts)
    return [ROOT / "README.md", *docs]


def _closing(lines: list[str], start: int, fence: str) -> int | None:
    """The line closing a block opened with `fence` (same character, at least as long), from `start`."""
    return next((j for j in range(start, len(lines)) if lines[j].strip().startswith(fence)
                 and set(lines[j].strip()) == {fence[0]}), None)


def run_blocks(text: str, page: str) -> list[Block]:
    """The run blocks of a page's Markdown, in order; a marker inside another code block is text, not a marker.

    Raises:
        MarkerError: a marker not followed on the next line by a ```bash or ```python fence, or a fence
            never closed.
    """
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        other = _FENCE.match(lines[i].strip())
        if other is not None:  # a block without a marker: skip it whole (it may show the convention itself)
            end = _closing(lines, i + 1, other["fence"])
            i = len(lines) if end is None else end + 1
            continue
        if lines[i].strip() != _RUN_MARK:
            i += 1
            continue
        opening = _FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if opening is None or opening["lang"] not in ("bash", "python"):
            raise MarkerError(f"{page}:{i + 1}: {_RUN_MARK} must be right above a ```bash or ```python block")
        end = _closing(lines, i + 2, opening["fence"])
        if end is None:
            raise MarkerError(f"{page}:{i + 2}: the fenced block is never closed")
        blocks.append(Block(page, len(blocks) + 1, i + 2, opening["lang"], "\n".join(lines[i + 2:end]) + "\n"))
        i = end + 1
    return blocks


def _all_blocks() -> list[Block]:
    found: list[Block] = []
    for path in pages():
        try:
            found += run_blocks(path.read_text(), path.relative_to(ROOT).as_posix())
        except MarkerError:
            continue  # reported by test_run_markers_are_well_formed
    return found


def _cases() -> list[Any]:
    blocks = _all_blocks()
    cases = [pytest.param([b], id=f"{b.page}:bash-{b.number}") for b in blocks if b.lang == "bash"]
    for page in dict.fromkeys(b.page for b in blocks):
        script = [b for b in blocks if b.page == page and b.lang == "python"]
        if script:
            cases.append(pytest.param(script, id=f"{page}:python"))
    return cases


def _environment(prefix: str) -> dict[str, str]:
    # The docs describe a user's shell: none of this test run's own STREAMTRAIN_ settings leak into it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMTRAIN_")}
    path = [str(ROOT / ".venv" / "bin"), str(Path(sys.executable).parent), env.get("PATH", "")]
    env.update(PATH=os.pathsep.join(path), PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
               STREAMTRAIN_KAFKA__TOPIC_PREFIX=prefix, COLUMNS="120", NO_COLOR="1")
    return env


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int | None, str]:
    """Run to completion or the time limit (then the whole process group is killed); exit status and output."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=BLOCK_TIMEOUT_S)
        return proc.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return None, output


def _failure(blocks: list[Block], status: int | None, output: str) -> str:
    how = f"timed out after {BLOCK_TIMEOUT_S:.0f} s" if status is None else f"exited with status {status}"
    code = "\n".join(f"--- {b.where()} ---\n{b.code}" for b in blocks)
    tail = output[-_OUTPUT_TAIL:]
    what = blocks[0].where() if len(blocks) == 1 else \
        f"{blocks[0].page}: the python run blocks {', '.join(str(b.number) for b in blocks)}, run as one script,"
    return f"{what} {how}\n{code}--- output{' (end)' if len(output) > len(tail) else ''} ---\n{tail}"


@pytest.mark.parametrize("path", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_run_markers_are_well_formed(path: Path) -> None:
    try:
        run_blocks(path.read_text(), path.relative_to(ROOT).as_posix())
    except MarkerError as exc:
        pytest.fail(str(exc))


def test_the_marker_rules() -> None:
    text = ("a\n<!-- run -->\n```bash\necho one\n```\n<!-- run -->\n````python\nprint('```')\n````\n```bash\nno\n```\n"
            "````markdown\n<!-- run -->\n```bash\nshown, not run\n```\n````\n")
    blocks = run_blocks(text, "p.md")
    assert [(b.number, b.line, b.lang, b.code) for b in blocks] == [
        (1, 3, "bash", "echo one\n"), (2, 7, "python", "print('```')\n")]
    with pytest.raises(MarkerError, match=r"p\.md:2"):
        run_blocks("x\n<!-- run -->\n\n```bash\nls\n```\n", "p.md")
    with pytest.raises(MarkerError, match="never closed"):
        run_blocks("<!-- run -->\n```python\nprint(1)\n", "p.md")


@pytest.mark.timeout(BLOCK_TIMEOUT_S + 60)
@pytest.mark.parametrize("blocks", _cases())
def test_docs_block_runs(blocks: list[Block], request: pytest.FixtureRequest) -> None:
    needs_broker = any(DOCS_BROKER in b.code for b in blocks)
    bootstrap = request.getfixturevalue("broker").bootstrap if needs_broker else None
    env = _environment(f"docs{uuid.uuid4().hex[:10]}")
    with tempfile.TemporaryDirectory(prefix="docs-snippet-") as scratch:
        if blocks[0].lang == "bash":
            code = blocks[0].code if bootstrap is None else blocks[0].code.replace(DOCS_BROKER, bootstrap)
            status, output = _run(["bash", "-euo", "pipefail", "-c", code], ROOT, env)
        else:
            parts = [f"# --- {b.where()} ---\n{b.code}" for b in blocks]
            script = "\n".join(parts) if bootstrap is None else "\n".join(parts).replace(DOCS_BROKER, bootstrap)
            (Path(scratch) / "docs_snippet.py").write_text(script)
            status, output = _run([sys.executable, "docs_snippet.py"], Path(scratch), env)
    if status != 0:
        pytest.fail(_failure(blocks, status, output), pytrace=False)
