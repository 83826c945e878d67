"""bench balance's figures from its cells: repeats combined by median, targets, the BENCHMARKS.md section."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.balance.analysis import combine_repeats, evaluate_targets, summarise
from benchmarks.balance.render import render_balance
from benchmarks.balance.results import BalanceResult, BalanceRunSetup, CellResult
from benchmarks.balance.setup import BalanceSetup
from benchmarks.common import RenderContext

SETUP = BalanceSetup(policies=("static", "ett-stream"), slowdowns=((1.0, 4.0),), difs=(64.0,), steps=4,
                     warmup_steps=2, smooth_steps=1, repeats=3)


def _run(policy: str, repeat: int, step_s: float, size_per_s: float, se: float, reach: float | None) -> CellResult:
    curve = [(1.0, 2.0), (2.0, 1.0), (3.0, 0.5), (4.0, 0.2)] if reach is None else [(reach, 0.01)]
    return CellResult(policy=policy, slowdowns=(1.0, 4.0), dif=64.0, repeat=repeat, size_kind="lognormal",
                      step_seconds_median=step_s, wall_step_seconds_median=step_s + 0.05, straggler_effect_median=se,
                      samples_per_s=size_per_s / 45, size_per_s=size_per_s, global_batch_median=100,
                      step_size_median=4500.0, trained_size_mean=45.0,
                      rank_compute_seconds_median={"0": 0.1, "1": 0.1}, rank_samples_median={"0": 80, "1": 20},
                      samples_lost=0, steps_measured=4, loss_curve=curve, seconds_to_target_loss=reach)


def test_repeats_combine_into_medians_with_the_runs_kept() -> None:
    runs = [_run("static", r, s, 10_000, 1.5, 9.0) for r, s in enumerate([0.6, 0.9, 0.5])]
    runs += [_run("ett-stream", r, s, w, se, t) for r, (s, w, se, t) in
             enumerate([(0.2, 30_000, 0.1, 4.0), (0.3, 20_000, 0.3, None), (0.25, 25_000, 0.2, 5.0)])]
    cells = {c.policy: c for c in combine_repeats(runs)}
    ett = cells["ett-stream"]
    assert ett.repeats == 3 and [r.step_seconds_median for r in ett.runs or []] == [0.2, 0.3, 0.25]
    assert ett.step_seconds_median == pytest.approx(0.25)
    assert ett.size_per_s == pytest.approx(25_000) and ett.straggler_effect_median == pytest.approx(0.2)
    assert ett.seconds_to_target_loss == 5.0  # the run that never reached it counts as the slowest
    assert cells["static"].step_seconds_median == pytest.approx(0.6)
    targets = evaluate_targets(list(cells.values()), SETUP)
    assert targets.speedup_vs_static == pytest.approx(0.6 / 0.25)
    assert targets.per_cell[0].best_policy == "ett-stream"


def test_a_cell_whose_every_run_failed_is_an_error_not_a_figure() -> None:
    failed = [CellResult(policy="static", slowdowns=(1.0, 4.0), dif=64.0, repeat=r, error=f"boom {r}")
              for r in range(2)]
    (cell,) = combine_repeats(failed)
    assert cell.error == "boom 0; boom 1" and cell.step_seconds_median is None and cell.repeats == 2


def test_combined_cells_keep_their_repeat_measured_time_to_target(tmp_path: Path) -> None:
    runs = [_run(p, r, 0.5 if p == "static" else 0.2, 10_000 if p == "static" else 25_000, 0.2, None)
            for r in range(3) for p in ("static", "ett-stream")]
    figures = summarise(runs, SETUP)
    assert figures.target_loss == {"64": 0.2}  # static's loss mid-window, in each run
    assert figures.runs is not None and len(figures.runs) == 6
    assert all(r.target_loss == 0.2 for r in figures.runs)  # each run against its own repeat's target
    result = BalanceResult(setup=BalanceRunSetup.model_validate(SETUP.model_dump()), cells=figures.cells,
                           seconds=60.0, target_loss=figures.target_loss, target_loss_rule=figures.target_loss_rule,
                           targets=figures.targets, runs=figures.runs)
    assert all(c.seconds_to_target_loss is not None for c in result.cells)  # from each repeat's own target
    text = render_balance(result, RenderContext(tmp_path, tmp_path))
    assert "the whole matrix run 3 times" in text and "step ms of each run" in text
    assert (tmp_path / "balance.png").stat().st_size > 1000
    # What the JSON holds is what was measured: written and read back, the same result.
    assert BalanceResult.load(result.write(tmp_path / "balance.json")) == result


def test_the_setup_stores_what_follows_from_it_and_rejects_what_cannot_run() -> None:
    # The backlog: the fast device's balanced share (80%) with margin is more than the whole batch, so the whole
    # 512-sample batch for every step of the window and 12 steps' overshoot.
    assert (SETUP.devices, SETUP.until_step, SETUP.backlog_per_device) == (2, 6, 9216)
    with pytest.raises(ValueError, match="same length"):
        BalanceSetup(slowdowns=((1.0, 4.0), (1.0, 1.0, 1.0)))
    with pytest.raises(ValueError, match="unknown policies"):
        BalanceSetup(policies=("nosuch",))
