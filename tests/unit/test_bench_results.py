"""The committed benchmark results load into their typed records, lose nothing, and BENCHMARKS.md is exactly what
`bench report` generates from them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from streamtrain.benchmarks.common import Record
from streamtrain.benchmarks.registry import REGISTRY
from streamtrain.benchmarks.report import SuiteRuns, render_markdown, render_sections

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "bench"
RESULTS: list[tuple[str, type[Record]]] = [(b.json_name, b.result) for b in REGISTRY]
if (DOCS / "all.json").is_file():  # what a `bench all` into docs/bench leaves
    RESULTS.append(("all.json", SuiteRuns))


def _holds(dumped: Any, stored: Any, where: str = "") -> None:
    """Every key and value of `stored` is in `dumped` (numbers by value; keys `dumped` adds must be None)."""
    if isinstance(stored, dict):
        assert isinstance(dumped, dict), where
        for key, value in stored.items():
            assert key in dumped, f"{where}.{key} lost"
            _holds(dumped[key], value, f"{where}.{key}")
        for key in set(dumped) - set(stored):
            assert dumped[key] in (None, {}, []), f"{where}.{key} appeared with {dumped[key]!r}"
    elif isinstance(stored, list):
        assert isinstance(dumped, list | tuple) and len(dumped) == len(stored), where
        for i, (d, s) in enumerate(zip(dumped, stored, strict=True)):
            _holds(d, s, f"{where}[{i}]")
    else:
        assert dumped == stored and type(dumped) is type(stored), f"{where}: {dumped!r} != {stored!r}"


@pytest.mark.parametrize(("name", "kind"), RESULTS, ids=[name for name, _ in RESULTS])
def test_a_committed_result_loads_loses_nothing_and_writes_back_the_same(name: str, kind: type[Record],
                                                                          tmp_path: Path) -> None:
    stored = json.loads((DOCS / name).read_text())
    result = kind.load(DOCS / name)
    _holds(json.loads(json.dumps(result.model_dump())), stored)
    assert kind.load(result.write(tmp_path / name)) == result


def test_bench_report_regenerates_benchmarks_md_unchanged_from_the_committed_results(tmp_path: Path) -> None:
    data = tmp_path / "docs" / "bench"
    data.mkdir(parents=True)
    for path in DOCS.glob("*.json"):
        shutil.copy(path, data / path.name)
    suite = {"all"} if (DOCS / "all.json").is_file() else set()
    assert set(render_sections([data], tmp_path)) == {*suite, *(b.name for b in REGISTRY)}
    assert render_markdown([data], tmp_path) == (ROOT / "BENCHMARKS.md").read_text()


def test_a_result_with_a_key_it_does_not_declare_is_refused_by_name(tmp_path: Path) -> None:
    doc = json.loads((DOCS / "scheduler.json").read_text())
    doc["cells"][0]["latency_ms_mean"] = 1.0
    (tmp_path / "scheduler.json").write_text(json.dumps(doc))
    kind = next(b.result for b in REGISTRY if b.name == "scheduler")
    with pytest.raises(ValidationError, match="latency_ms_mean"):
        kind.load(tmp_path / "scheduler.json")
