"""The README stays a door, not a lab notebook: short, no commit hashes, and every figure in its results
table is what the benchmarks' committed JSON (docs/bench/) says — read directly, or computed from the stored runs
the way the benchmark's own renderer does — so the two cannot drift apart."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMES = "\u00d7"  # the multiplication sign the README writes ratios with (2.54 times)
README = ROOT / "README.md"
BENCH = ROOT / "docs" / "bench"


def _bench(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((BENCH / f"{name}.json").read_text())
    return data


def _one(items: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    found = [i for i in items if all(i.get(k) == v for k, v in match.items())]
    assert len(found) == 1, f"expected one entry with {match}, found {len(found)}"
    return found[0]


def _balance() -> list[str]:
    # The stored JSON holds the runs; the cells (medians over the runs) are what the benchmark's renderer computes.
    from streamtrain.benchmarks.balance.figures import BalanceResult
    from streamtrain.benchmarks.balance.render import target_cells

    _, _, ett, static = target_cells(BalanceResult.load(BENCH / "balance.json"))
    assert ett is not None and static is not None and ett.wall_step_seconds_median and static.wall_step_seconds_median
    static_ms, ett_ms = static.wall_step_seconds_median * 1e3, ett.wall_step_seconds_median * 1e3
    return [f"{static_ms:.0f} → {ett_ms:.0f} ms", f"**{static_ms / ett_ms:.2f}{TIMES}**"]


def _realdata() -> list[str]:
    from streamtrain.benchmarks.balance.figures import RealdataResult, combine

    # Cell medians of the heterogeneous fleet (the control is a cell of its own), as the benchmark's targets use them.
    runs = RealdataResult.load(BENCH / "realdata.json").runs
    cells = {c.fig.policy: c.fig for c in combine(runs) if not c.fig.control}
    ett, static = cells["ett-stream"].seconds_to_target, cells["static"].seconds_to_target
    assert ett and static
    return [f"{ett:.1f} s against {static:.1f} s for static", f"**{static / ett:.2f}{TIMES}**"]


def _scheduler() -> list[str]:
    cell = _one(_bench("scheduler")["cells"], policy="ett-stream", devices=1024, pending_per_device=256)
    return ["1,024 devices with 256 pending", f"**{cell['latency_ms_median']:.1f} ms**"]


def _quality() -> list[str]:
    import statistics

    from streamtrain.benchmarks.quality import QualityResult

    cells = [c for c in QualityResult.load(BENCH / "quality.json").cells if c.error is None]
    beaten = sum(bool(c.beats_baseline) for c in cells)

    def median(kind: str) -> float:
        return statistics.median(c.ratio for c in cells if c.kind == kind and c.ratio is not None)

    return [f"{len(cells)} datasets", f"**{beaten} of {len(cells)}**",
            f"median {median('classification'):.2f}{TIMES} the reference's accuracy",
            f"{median('regression'):.2f}{TIMES} its RMSE"]


def _truncation() -> list[str]:
    from streamtrain.benchmarks.truncation import TruncationResult, against_persist

    ratios = against_persist(TruncationResult.load(BENCH / "truncation.json"))
    return [f"**{ratios[p][0]:.0f}{TIMES}** fewer with `{p}`" for p in ("truncate", "bounded")]


def _ingest() -> list[str]:
    from streamtrain.benchmarks.ingest import IngestResult

    result = IngestResult.load(BENCH / "ingest.json")
    ratio = result.ratio("device_producer", "bare_loop")
    return [f"**{result.medians()['device_producer']:,.0f}** records/s", f"{ratio:.2f}{TIMES}"]


@dataclass(frozen=True)
class Headline:
    """One row of the README's results table: the benchmark it quotes, and the figures its JSON gives."""

    bench: str
    figures: Callable[[], list[str]]


HEADLINES = (Headline("balance", _balance), Headline("realdata", _realdata), Headline("scheduler", _scheduler),
             Headline("quality", _quality), Headline("truncation", _truncation), Headline("ingest", _ingest))


def _results_rows() -> dict[str, str]:
    section = README.read_text().split("\n## Results\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = re.search(r"\| `bench (\w+)` \|$", line)
        if match:
            rows[match.group(1)] = line
    return rows


def test_readme_is_short_and_holds_no_commit_hashes() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", text) == []
    assert "load average" not in text


def test_readme_results_quote_at_most_six_benchmarks_all_checked_here() -> None:
    rows = _results_rows()
    assert 1 <= len(rows) <= 6
    assert sorted(rows) == sorted(h.bench for h in HEADLINES)


@pytest.mark.parametrize("headline", HEADLINES, ids=lambda h: h.bench)
def test_readme_results_match_the_committed_benchmark_json(headline: Headline) -> None:
    row = _results_rows()[headline.bench]
    stale = [figure for figure in headline.figures() if figure not in row]
    assert stale == [], (f"README's `bench {headline.bench}` row does not say {stale}, which "
                         f"docs/bench/{headline.bench}.json gives: update the row from the JSON\n{row}")


def test_readme_links_resolve() -> None:
    text = README.read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert targets
    missing = [t for t in targets if not re.match(r"^[a-z]+:", t) and not (ROOT / t).exists()]
    assert missing == []
