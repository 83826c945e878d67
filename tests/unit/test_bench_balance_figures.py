"""bench balance's figures from its runs: rounds judged against their own target loss, repeats combined by median,
the targets, the BENCHMARKS.md section."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamtrain.benchmarks.balance import BALANCE
from streamtrain.benchmarks.balance.figures import BalanceResult, combine, comparisons, judge_balance
from streamtrain.benchmarks.balance.render import balance_targets, render_balance, target_cells
from streamtrain.benchmarks.balance.setup import BalanceSetup, Run

SETUP = BalanceSetup(policies=("static", "ett-stream"), slowdowns=((1.0, 4.0),), difs=(64.0,), steps=4,
                     warmup_steps=2, smooth_steps=1, repeats=3)


def _run(policy: str, repeat: int, step_s: float, size_per_s: float, se: float,
         reach: float | None = None) -> Run:
    return Run(policy=policy, slowdowns=(1.0, 4.0), dif=64.0, repeat=repeat, step_seconds_median=step_s,
               wall_step_seconds_median=step_s + 0.05, straggler_effect_median=se, samples_per_s=size_per_s / 45,
               size_per_s=size_per_s, step_size_median=4500.0, trained_size_mean=45.0,
               rank_compute_seconds_median={"0": 0.1, "1": 0.1}, rank_samples_median={"0": 80, "1": 20},
               samples_unaccounted=0, steps_measured=4, seconds_to_target=reach)


def test_repeats_combine_into_medians_with_the_runs_kept() -> None:
    runs = [_run("static", r, s, 10_000, 1.5, 9.0) for r, s in enumerate([0.6, 0.9, 0.5])]
    runs += [_run("ett-stream", r, s, w, se, t) for r, (s, w, se, t) in
             enumerate([(0.2, 30_000, 0.1, 4.0), (0.3, 20_000, 0.3, None), (0.25, 25_000, 0.2, 5.0)])]
    cells = {c.fig.policy: c for c in combine(runs)}
    ett = cells["ett-stream"]
    assert [r.step_seconds_median for r in ett.runs] == [0.2, 0.3, 0.25]
    assert ett.fig.step_seconds_median == pytest.approx(0.25)
    assert ett.fig.size_per_s == pytest.approx(25_000) and ett.fig.straggler_effect_median == pytest.approx(0.2)
    assert ett.fig.seconds_to_target == 5.0  # the run that never reached it counts as the slowest
    assert cells["static"].fig.step_seconds_median == pytest.approx(0.6)
    (cell,) = comparisons(runs, SETUP)
    assert cell.best_policy == "ett-stream" and cell.best_over_ett_stream == 1.0
    assert cells["static"].fig.wall_step_seconds_median == pytest.approx(0.65)
    assert ett.fig.wall_step_seconds_median == pytest.approx(0.3)


def test_a_cell_whose_every_run_failed_is_an_error_not_a_figure() -> None:
    failed = [Run(policy="static", slowdowns=(1.0, 4.0), dif=64.0, repeat=r, error=f"boom {r}") for r in range(2)]
    ((cell),) = combine(failed)
    assert cell.fig.error == "boom 0; boom 1" and cell.fig.step_seconds_median is None and len(cell.runs) == 2


def test_each_round_is_timed_to_its_own_target_loss(tmp_path: Path) -> None:
    # static's loss mid-window (step 4 of the curve) is the round's target: 0.1 in round 0, 0.3 in round 1.
    curve = [(1.0, 2.0), (2.0, 1.0), (3.0, 0.5), (4.0, 0.2), (5.0, 0.1)]
    slower = [(1.0, 2.0), (2.0, 1.5), (3.0, 0.9), (4.0, 0.4), (5.0, 0.3)]
    runs = [(_run("static", 0, 0.5, 10_000, 0.2), curve), (_run("ett-stream", 0, 0.2, 25_000, 0.1), curve[1:]),
            (_run("static", 1, 0.5, 10_000, 0.2), slower), (_run("ett-stream", 1, 0.2, 25_000, 0.1), curve)]
    judged, targets, rule = judge_balance(runs, SETUP.model_copy(update={"repeats": 2}))
    assert targets == {"64": pytest.approx(0.2)} and "median over runs" in rule
    assert [r.seconds_to_target for r in judged] == [5.0, 5.0, 5.0, 4.0]
    result = BalanceResult(setup=SETUP, target_loss=targets, target_loss_rule=rule, seconds=60.0, runs=judged)
    assert BalanceResult.load(result.write(tmp_path / "balance.json")) == result
    text = render_balance(result)
    assert "3 rounds (medians)" in text and "step ms of each run" in text and "| 500 / 500 |" in text
    assert BALANCE.draw(result, tmp_path) == tmp_path / "balance.png"
    fleet, dif, ett, static = target_cells(result)
    assert (fleet, dif) == ((1.0, 4.0), 64.0) and ett is not None and static is not None
    speedup = next(t for t in balance_targets(result) if "faster than" in t.goal)
    assert speedup.met is False and "550.0 ms → 250.0 ms = 2.20" in speedup.measured  # 2.5x asked


def test_the_setup_stores_what_follows_from_it_and_rejects_what_cannot_run() -> None:
    # The backlog: the fast device's balanced share (80%) with margin is more than the whole batch, so the whole
    # 512-sample batch for every step of the window and 12 steps' overshoot.
    assert (SETUP.devices, SETUP.until_step, SETUP.backlog_per_device) == (2, 6, 9216)
    with pytest.raises(ValueError, match="same length"):
        BalanceSetup(slowdowns=((1.0, 4.0), (1.0, 1.0, 1.0)))
    with pytest.raises(ValueError, match="unknown policies"):
        BalanceSetup(policies=("nosuch",))
    # A fleet of equal ranks is the control: static alone, at the smallest DIF.
    control = BalanceSetup(policies=("static", "ett-stream"), slowdowns=((1.0, 4.0), (1.0, 1.0)), difs=(0.0, 64.0))
    assert [c.label for c in control.cells() if c.control] == ["static slow-downs 1,1 DIF 0 (control)"]
