"""bench balance's measured window: the wall-period split and plan wait on the critical path, the backlog check,
and ett-stream per (fleet, DIF) cell against the oracle, static and chronica."""

from __future__ import annotations

import pytest

from streamtrain.benchmarks.balance.figures import BalanceResult, analyse_window, combine, comparisons
from streamtrain.benchmarks.balance.render import backlog_text, balance_targets, split_text
from streamtrain.benchmarks.balance.setup import BalanceSetup, Run, balanced_share, oracle_factor
from streamtrain.wire import StepFeedback

ONE_SLOW = (1.0, 1.0, 1.0, 4.0)
TWO_SLOW = (1.0, 1.0, 4.0, 4.0)
EQUAL = (1.0, 1.0, 1.0, 1.0)


def _fb(device: int, step: int, *, compute: float, plan_wait: float, depth: int, sent_ms: int) -> StepFeedback:
    return StepFeedback(job="j", step=step, device_id=str(device), rank=device, plan_step=step, samples=10,
                        total_size=450, compute_seconds=compute, data_wait_seconds=0.001, comm_seconds=0.004,
                        step_seconds=compute + 0.005, memory_bytes=1, lowest_unprocessed_offset=10 * step,
                        buffer_depth=depth, loss=1.0 / (step + 1), plan_wait_seconds=plan_wait, hold_seconds=0.0,
                        sent_at=sent_ms)


def _run(drain_device: int | None = None, drain_from: int = 99) -> list[StepFeedback]:
    """6 steps, 100 ms apart, 2 devices; device 1 is the slow one (its waits are the critical path's)."""
    out = []
    for step in range(6):
        for device in (0, 1):
            depth = 0 if device == drain_device and step >= drain_from else 500 - 10 * step
            out.append(_fb(device, step, compute=0.05 if device == 0 else 0.08,
                           plan_wait=0.020 if device == 0 else 0.0005, depth=depth, sent_ms=1_000 + 100 * step))
    return out


def _window(feedback: list[StepFeedback]) -> Run:
    figures, _ = analyse_window(feedback, devices=2, warmup=2, steps=3)
    return Run.model_validate({"policy": "static", "slowdowns": (1.0, 4.0), "dif": 0.0, **figures})


def test_the_window_splits_the_wall_period_on_the_critical_path_and_its_backlog_held() -> None:
    cell = _window(_run())
    split = cell.step_period_split_median or {}
    # The slow rank (largest compute) is the critical path: its plan wait, not the fast rank's 20 ms.
    assert cell.plan_wait_seconds_median == pytest.approx(0.0005)
    assert split["compute"] == pytest.approx(0.08) and split["communication"] == pytest.approx(0.004)
    assert split["data_wait"] == pytest.approx(0.001) and split["hold"] == 0.0
    assert sum(split.values()) == pytest.approx(0.1)  # `other` is what the parts leave of the 100 ms period
    assert cell.backlog_held is True and cell.backlog_drained_steps == []
    assert backlog_text(cell) == "held"


def test_a_device_that_ran_out_of_work_in_the_window_flags_the_cell() -> None:
    cell = _window(_run(drain_device=0, drain_from=3))
    assert cell.backlog_held is False and cell.backlog_drained_steps == [3, 4]
    assert backlog_text(cell) == "drained at step 3,4"
    # A drain after the window says nothing about it.
    assert _window(_run(drain_device=0, drain_from=5)).backlog_held is True


def test_repeats_keep_the_split_and_a_drain_in_any_run() -> None:
    runs = [Run(policy="static", slowdowns=(1.0, 4.0), dif=0.0, repeat=r, step_seconds_median=0.1,
                step_period_split_median={"compute": c, "plan_wait": w}, plan_wait_seconds_median=w,
                backlog_held=held, backlog_drained_steps=[] if held else [12],
                rank_compute_seconds_median={"0": c})
            for r, (c, w, held) in enumerate([(0.1, 0.001, True), (0.3, 0.003, False), (0.2, 0.002, True)])]
    ((cell),) = combine(runs)
    assert cell.fig.plan_wait_seconds_median == pytest.approx(0.002)
    assert cell.fig.step_period_split_median is not None and cell.fig.step_period_split_median["compute"] == 0.2
    assert cell.fig.backlog_held is False and cell.fig.backlog_drained_steps == [12]
    assert split_text(cell.fig).startswith("200/")


def test_the_backlog_covers_the_hungriest_device_of_the_hungriest_fleet() -> None:
    assert oracle_factor(ONE_SLOW) == pytest.approx(4 / 3.25) and balanced_share(TWO_SLOW) == pytest.approx(0.4)
    setup = BalanceSetup(slowdowns=(ONE_SLOW, TWO_SLOW), warmup_steps=4, steps=20)
    # two-slow's fast pair each train 40% of a balanced step; 1.35x that, for 24 steps and 12 steps' overshoot.
    assert setup.backlog_per_device == 9954
    with pytest.raises(ValueError, match="positive"):
        BalanceSetup(slowdowns=((1.0, 0.0),))


def _cell(policy: str, slow: tuple[float, ...], dif: float, wall: float, *, reach: float | None = 5.0,
          plan_wait: float = 0.0005, held: bool = True, repeat: int = 0) -> Run:
    return Run(policy=policy, slowdowns=slow, dif=dif, step_seconds_median=wall - 0.02, repeat=repeat,
               wall_step_seconds_median=wall, size_per_s=10_000 / wall, step_size_median=4500.0,
               straggler_effect_median=0.05, seconds_to_target=reach, plan_wait_seconds_median=plan_wait,
               backlog_held=held)


def _result(setup: BalanceSetup, runs: list[Run]) -> BalanceResult:
    return BalanceResult(setup=setup, target_loss={"0": 0.5}, target_loss_rule="rule", seconds=1.0, runs=runs)


def test_ett_stream_is_judged_against_the_oracle_static_and_chronica_per_cell() -> None:
    setup = BalanceSetup(policies=("static", "chronica", "ett-stream"), slowdowns=(ONE_SLOW, TWO_SLOW, EQUAL),
                         difs=(0.0, 64.0))
    control = 0.2
    runs = [_cell("static", EQUAL, 0.0, control)]
    for slow in (ONE_SLOW, TWO_SLOW):
        oracle = control * oracle_factor(slow)
        for dif in setup.difs:
            runs.append(_cell("static", slow, dif, 0.8))
            runs.append(_cell("chronica", slow, dif, oracle * 1.2, reach=6.0))
            # At one-slow DIF 64 ett-stream is 12% over the oracle (allowed 10%) and later than chronica.
            late = slow == ONE_SLOW and dif == 64.0
            runs.append(_cell("ett-stream", slow, dif, oracle * (1.12 if late else 1.03), reach=7.0 if late else 5.0))
    by = {(p.slowdowns, p.dif): p for p in comparisons(runs, setup)}
    assert len(by) == 4
    ok, late = by[(TWO_SLOW, 0.0)], by[(ONE_SLOW, 64.0)]
    assert ok.oracle_wall_seconds == pytest.approx(control * 1.6) and ok.over_oracle == pytest.approx(1.03)
    assert ok.within_oracle is True and ok.target_no_later_than_chronica is True  # 5% allowed at DIF 0
    assert late.within_oracle is False  # 10% allowed at DIF 64
    assert late.target_no_later_than_chronica is False and late.chronica_seconds_to_target == 6.0
    # 7% over the oracle: too much at DIF 0, within what varying sizes are allowed.
    over = [runs[0], *(_cell("ett-stream", ONE_SLOW, d, control * oracle_factor(ONE_SLOW) * 1.07) for d in (0.0, 64.0))]
    assert [p.within_oracle for p in comparisons(over, setup)] == [False, True]
    verdicts = [t.met for t in balance_targets(_result(setup, runs))]
    assert verdicts == [True, True, False, False, True, None, True, True]  # plan wait, speed-up, oracle, target, ...
    oracle = balance_targets(_result(setup, runs))[2]
    assert "not in slow-downs 1,1,1,4 DIF 64: 1.120" in oracle.measured and "the control's 200.0 ms" in oracle.measured
    # A plan wait over 2 ms anywhere, or a drained window anywhere, fails its target.
    worse = balance_targets(_result(setup, [*runs, _cell("lbbsp", ONE_SLOW, 0.0, 0.3, plan_wait=0.004,
                                                         held=False)]))
    assert worse[0].met is False and worse[0].measured == "at most 4.0 ms" and worse[-1].met is False


def test_a_run_that_never_reached_the_target_is_later_than_one_that_did() -> None:
    setup = BalanceSetup(policies=("chronica", "ett-stream"), slowdowns=(ONE_SLOW,), difs=(16.0,))
    (never,) = comparisons([_cell("chronica", ONE_SLOW, 16.0, 0.3, reach=9.0),
                            _cell("ett-stream", ONE_SLOW, 16.0, 0.3, reach=None)], setup)
    assert never.target_no_later_than_chronica is False
    (both,) = comparisons([_cell("chronica", ONE_SLOW, 16.0, 0.3, reach=None),
                           _cell("ett-stream", ONE_SLOW, 16.0, 0.3, reach=None)], setup)
    assert both.target_no_later_than_chronica is None and both.within_oracle is None  # no control run


def test_repeats_set_the_median_run_against_the_median_control() -> None:
    setup = BalanceSetup(policies=("static", "ett-stream"), slowdowns=(ONE_SLOW, EQUAL), difs=(0.0,), repeats=2)
    # The machine slowed down in the second repeat: its control and its ett-stream alike.
    runs = [_cell("static", EQUAL, 0.0, 0.2), _cell("ett-stream", ONE_SLOW, 0.0, 0.2 * oracle_factor(ONE_SLOW) * 1.02),
            _cell("static", EQUAL, 0.0, 0.3, repeat=1),
            _cell("ett-stream", ONE_SLOW, 0.0, 0.3 * oracle_factor(ONE_SLOW) * 1.04, repeat=1)]
    (p,) = comparisons(runs, setup)
    # The cells' medians compare median with median: (0.204 + 0.312) / 2 over the controls' 0.25.
    assert p.over_oracle == pytest.approx(1.032)
