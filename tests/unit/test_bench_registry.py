"""The benchmark registry, the BENCHMARKS.md refresher, and the convergence analysis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from benchmarks.convergence import ConvergenceSetup, analyse, smoothed
from benchmarks.registry import (
    REGISTRY,
    available,
    command_names,
    marker_names,
    refresh_markdown,
    render_sections,
)
from streamtrain_cli import app, bench_app

DOC = """# Title

Hand-written intro with a <!-- comment --> in it.

<!-- bench:alpha -->
old alpha table
<!-- /bench:alpha -->

Prose between the sections, kept as it is.

<!-- bench:beta -->
old beta
<!-- /bench:beta -->
trailing prose
"""


def test_refresh_replaces_only_the_named_sections_and_keeps_the_prose() -> None:
    new, missing = refresh_markdown(DOC, {"alpha": "| a |\n|---|\n| 1 |\n", "gamma": "nowhere"})
    assert missing == ["gamma"]
    assert "old alpha table" not in new and "| a |\n|---|\n| 1 |" in new
    assert "old beta" in new  # not named: untouched
    # Everything outside the alpha markers is byte for byte the same.
    before, _, after = DOC.partition("<!-- bench:alpha -->")
    assert new.startswith(before + "<!-- bench:alpha -->\n| a |")
    assert new.endswith(after.split("<!-- /bench:alpha -->", 1)[1])
    assert marker_names(new) == ["alpha", "beta"]


def test_refresh_is_idempotent_and_sections_do_not_leak_into_each_other() -> None:
    sections = {"alpha": "A1", "beta": "B1"}
    once, _ = refresh_markdown(DOC, sections)
    twice, _ = refresh_markdown(once, sections)
    assert once == twice
    assert once.count("A1") == 1 and once.count("B1") == 1
    assert "Prose between the sections, kept as it is." in once
    changed, _ = refresh_markdown(once, {"beta": "B2"})
    assert "A1" in changed and "B2" in changed and "B1" not in changed


def test_the_registry_runs_the_commands_that_exist() -> None:
    names = command_names(bench_app)
    assert {"kafka", "ingest", "scheduler", "convergence", "all", "report"} <= names
    got = [b.name for b in available(names)]
    assert got[:4] == ["kafka", "ingest", "scheduler", "convergence"]
    assert set(got) == {b.name for b in REGISTRY} & names
    assert len({b.name for b in REGISTRY}) == len(REGISTRY)
    assert all(b.json_name == f"{b.name}.json" for b in REGISTRY)


def test_a_benchmark_is_picked_up_as_soon_as_its_command_is_registered() -> None:
    later = typer.Typer()

    @later.command("balance")
    def balance() -> None:
        """A stand-in."""

    @later.command()
    def truncation() -> None:
        """Named from the function."""

    assert [b.name for b in available(command_names(later))] == ["balance", "truncation"]


def test_every_registered_benchmark_accepts_the_arguments_bench_all_gives_it() -> None:
    runner = CliRunner()
    for bench in available(command_names(bench_app)):
        for args in (bench.args, bench.quick_args):
            # --help after the arguments: click parses (and rejects unknown) options before acting on it.
            result = runner.invoke(app, ["bench", bench.name, "--out", "x", *args, "--help"])
            assert result.exit_code == 0, (bench.name, args, result.output)


def test_bench_all_rejects_an_unknown_benchmark() -> None:
    result = CliRunner().invoke(app, ["bench", "all", "--only", "nosuch"])
    assert result.exit_code == 1
    assert "nosuch" in result.output


def _curve(accuracy: list[float], per_step: int = 10) -> dict[str, list[float]]:
    n = len(accuracy)
    return {"step": list(range(1, n + 1)), "samples": [per_step * (i + 1) for i in range(n)],
            "accuracy": accuracy, "loss": [1.0 - a for a in accuracy]}


def test_analysis_judges_the_target_on_the_smoothed_curve() -> None:
    setup = ConvergenceSetup(target_accuracy=0.5, smooth_steps=2)
    curves = {
        "sgd": _curve([0.1, 0.4, 0.6, 0.6, 0.7, 0.7]),       # smoothed: .1 .25 .5 .6 .65 .7 -> step 3
        "weighted": _curve([0.1, 0.4, 0.6, 0.6, 0.7, 0.7]),
        "plain": _curve([0.9, 0.1, 0.9, 0.6, 0.2, 0.2]),     # smoothed: .9 .5 .5 .75 .4 .2 -> hit at 1, never stays
    }
    rows = {r["aggregation"]: r for r in analyse(setup, curves)}
    assert rows["sgd"]["samples_to_target"] == 30 and rows["sgd"]["steps_to_target"] == 3
    assert rows["sgd"]["samples_to_stay_at_target"] == 30
    assert rows["weighted"]["ratio_to_sgd"] == 1.0
    assert rows["plain"]["samples_to_target"] == 10 and rows["plain"]["ratio_to_sgd"] == pytest.approx(1 / 3, 1e-3)
    assert rows["plain"]["samples_to_stay_at_target"] is None and rows["plain"]["stay_ratio_to_sgd"] is None
    assert smoothed([1.0, 0.0, 1.0], 2).tolist() == [1.0, 0.5, 0.5]


def test_setup_rejects_inconsistent_splits() -> None:
    with pytest.raises(ValueError, match="shares"):
        ConvergenceSetup(world=2)
    with pytest.raises(ValueError, match="labels_per_device"):
        ConvergenceSetup(world=4, shares=(1, 1, 1, 1), classes=6)


def test_schedule_is_uneven_with_idle_ranks_and_reproducible() -> None:
    setup = ConvergenceSetup(steps=30, heldout=40)
    counts = setup.counts()
    assert (counts == 0).any() and (counts.mean(axis=0)[0] > 5 * counts.mean(axis=0)[-1])
    first, again = setup.schedule(), setup.schedule()
    assert [[len(d) for d in step] for step in first] == counts.tolist()
    assert first[3][0][0].data == again[3][0][0].data
    labels = {s.label for step in first for s in step[1]}
    assert labels <= {2, 3}  # non-IID: device 1 streams classes 2 and 3 only


def test_report_renders_a_convergence_json_with_relative_plot_links(tmp_path: Path) -> None:
    setup = ConvergenceSetup(steps=4, smooth_steps=1)
    curves = {name: _curve([0.2, 0.5, 0.9, 0.9]) for name in ("sgd", "weighted", "plain")}
    doc = {"target_accuracy": 0.85, "cells": analyse(setup, curves), "weighted_vs_sgd_max_param_diff": 1e-7,
           "plain_vs_sgd_max_param_diff": 0.3, "seconds": 1.0, "curves": curves,
           "schedule": {"idle_rank_steps": 1, "rank_steps": 16, "empty_steps": 0},
           "setup": {**{k: getattr(setup, k) for k in ("world", "steps", "batch_min", "batch_max", "idle_probability",
                                                      "labels_per_device", "classes", "size_mean", "size_dif",
                                                      "signal", "smooth_steps", "heldout")},
                     "shares": list(setup.shares)}}
    data = tmp_path / "reports" / "bench"
    data.mkdir(parents=True)
    (data / "convergence.json").write_text(json.dumps(doc))
    runs = [{"name": "kafka", "status": "ok", "seconds": 90.0}, {"name": "convergence", "status": "ok", "seconds": 60}]
    (data / "all.json").write_text(json.dumps({"quick": False, "runs": runs}))
    sections = render_sections([data], tmp_path)
    assert set(sections) == {"convergence", "all"}
    assert "2 of 2 benchmarks run, in 2.5 minutes" in sections["all"]
    assert "| `bench kafka` | ok | 90 s |" in sections["all"]
    body = sections["convergence"]
    assert "![convergence](reports/bench/convergence.png)" in body
    assert (data / "convergence.png").stat().st_size > 1000
    assert "**met**" in body and "| weighted | 30 | 3 | 1.000 |" in body

    md = tmp_path / "BENCHMARKS.md"
    md.write_text("intro\n<!-- bench:convergence -->\nold\n<!-- /bench:convergence -->\n<!-- bench:balance -->\n"
                  "Not yet measured.\n<!-- /bench:balance -->\nend\n")
    result = CliRunner().invoke(app, ["bench", "report", "--out", str(data), "--markdown", str(md)])
    assert result.exit_code == 0, result.output
    text = md.read_text()
    assert text.startswith("intro\n<!-- bench:convergence -->\nSetup:") and text.endswith("end\n")
    assert "old" not in text and "Not yet measured." in text
