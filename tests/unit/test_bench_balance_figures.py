"""bench balance's figures from its cells: repeats combined by median, targets, the BENCHMARKS.md section."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.balance import BalanceSetup, combine_repeats, evaluate_targets, render_balance, summarise
from benchmarks.registry import RenderContext

SETUP = BalanceSetup(policies=("static", "ett-stream"), slowdowns=((1.0, 4.0),), difs=(64.0,), steps=4,
                     warmup_steps=2, smooth_steps=1, repeats=3)


def _run(policy: str, repeat: int, step_s: float, size_per_s: float, se: float, reach: float | None) -> dict[str, Any]:
    curve = [[1.0, 2.0], [2.0, 1.0], [3.0, 0.5], [4.0, 0.2]] if reach is None else [[reach, 0.01]]
    return {"policy": policy, "slowdowns": [1.0, 4.0], "dif": 64.0, "repeat": repeat, "size_kind": "lognormal",
            "step_seconds_median": step_s, "wall_step_seconds_median": step_s + 0.05, "straggler_effect_median": se,
            "samples_per_s": size_per_s / 45, "size_per_s": size_per_s, "global_batch_median": 100,
            "step_size_median": 4500.0, "trained_size_mean": 45.0, "rank_compute_seconds_median": {"0": 0.1, "1": 0.1},
            "rank_samples_median": {"0": 80, "1": 20}, "samples_lost": 0, "steps_measured": 4, "loss_curve": curve,
            "seconds_to_target_loss": reach}


def test_repeats_combine_into_medians_with_the_runs_kept() -> None:
    runs = [_run("static", r, s, 10_000, 1.5, 9.0) for r, s in enumerate([0.6, 0.9, 0.5])]
    runs += [_run("ett-stream", r, s, w, se, t) for r, (s, w, se, t) in
             enumerate([(0.2, 30_000, 0.1, 4.0), (0.3, 20_000, 0.3, None), (0.25, 25_000, 0.2, 5.0)])]
    cells = {c["policy"]: c for c in combine_repeats(runs)}
    ett = cells["ett-stream"]
    assert ett["repeats"] == 3 and [r["step_seconds_median"] for r in ett["runs"]] == [0.2, 0.3, 0.25]
    assert ett["step_seconds_median"] == pytest.approx(0.25)
    assert ett["size_per_s"] == pytest.approx(25_000) and ett["straggler_effect_median"] == pytest.approx(0.2)
    assert ett["seconds_to_target_loss"] == 5.0  # the run that never reached it counts as the slowest
    assert cells["static"]["step_seconds_median"] == pytest.approx(0.6)
    targets = evaluate_targets(list(cells.values()), SETUP)
    assert targets["speedup_vs_static"] == pytest.approx(0.6 / 0.25)
    assert targets["per_cell"][0]["best_policy"] == "ett-stream"


def test_combined_cells_keep_their_repeat_measured_time_to_target(tmp_path: Path) -> None:
    runs = [_run(p, r, 0.5 if p == "static" else 0.2, 10_000 if p == "static" else 25_000, 0.2, None)
            for r in range(3) for p in ("static", "ett-stream")]
    figures = summarise(runs, SETUP)
    cells = figures.pop("cells")
    assert figures["target_loss"] == {"64": 0.2}  # static's loss mid-window, in each run
    doc = {"setup": {**SETUP.__dict__, "devices": 2, "backlog_per_device": 100, "settings": {}},
           "cells": cells, "seconds": 60.0, **figures}
    assert all(c["seconds_to_target_loss"] is not None for c in cells)  # from each repeat's own target
    text = render_balance(doc, RenderContext(tmp_path, tmp_path))
    assert "the whole matrix run 3 times" in text and "step ms of each run" in text
    assert (tmp_path / "balance.png").stat().st_size > 1000
