"""The balance benchmark's dataset workload (bench realdata), from real Evaluation / StepFeedback records:
accuracy over training time, the target, repeats combined, the oracle and the verdicts, the stored JSON and its
BENCHMARKS.md section."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from streamtrain.benchmarks.balance import REALDATA
from streamtrain.benchmarks.balance.figures import (
    RealdataResult,
    accuracy_curve,
    analyse_window,
    combine,
    judge_realdata,
)
from streamtrain.benchmarks.balance.render import realdata_targets, render_realdata
from streamtrain.benchmarks.balance.setup import AccuracyPoint, RealdataSetup, Run, oracle_factor
from streamtrain.benchmarks.common import TIMES, Target, problems
from streamtrain.wire import Evaluation, StepFeedback

T0 = 1_700_000_000_000  # ms: when step 0 began


def _feedback(ends_s: list[float], devices: int = 2, step_s: float = 0.5) -> list[StepFeedback]:
    """Every device's report of each step, the step ending `ends_s[step]` seconds after step 0 began."""
    out = []
    for step, end in enumerate(ends_s):
        for d in range(devices):
            out.append(StepFeedback(
                job="j", step=step, device_id=str(d), rank=d, plan_step=step, samples=8, total_size=800,
                compute_seconds=step_s * (d + 1) / devices, data_wait_seconds=0.0, comm_seconds=0.0,
                step_seconds=step_s if step else end, memory_bytes=0, lowest_unprocessed_offset=0, buffer_depth=0,
                sent_at=T0 + int(end * 1000)))
    return out


def _evaluation(step: int, accuracy: float, seconds: float = 1.0, sent_at: int = 0) -> Evaluation:
    return Evaluation(job="j", step=step, dataset="plaid", samples=537, accuracy=accuracy, loss=1.0, seconds=seconds,
                      sent_at=sent_at or T0 + step)


def test_accuracy_is_timed_by_training_with_evaluation_pauses_left_out() -> None:
    # Steps 0-4 end at 1, 2, 4, 5, 7 s: an evaluation (1 s pause) after 2 and after 4 steps done lies in the period
    # of steps 2 and 4, pushing every later end by 1 s; evaluation 5 is the model after step 4.
    feedback = _feedback([1.0, 2.0, 4.0, 5.0, 7.0])
    evaluations = [_evaluation(2, 0.2), _evaluation(4, 0.4), _evaluation(5, 0.7), _evaluation(5, 0.9, sent_at=T0 + 99)]
    curve = accuracy_curve(evaluations, feedback, smooth=2)
    assert [p.step for p in curve] == [2, 4, 5]  # the second evaluation after 5 steps (after the last) counts once
    assert [p.seconds for p in curve] == pytest.approx([2.0, 4.0, 5.0])  # 5 - 1 pause; 7 - 2 pauses
    assert [p.accuracy for p in curve] == [0.2, 0.4, 0.7]
    assert [p.smoothed for p in curve] == pytest.approx([0.2, 0.3, 0.55])


def test_wall_period_leaves_out_the_periods_that_held_an_evaluation() -> None:
    feedback = _feedback([1.0, 1.5, 3.5, 4.0, 4.5, 6.5])  # steps 2 and 5 hold the evaluations after 2 and 5 steps

    def wall(skip: list[int], first: int = 1) -> float:
        return analyse_window(feedback, 2, first, 6 - first, skip=skip)[0]["wall_step_seconds_median"]

    assert wall([2, 5]) == pytest.approx(0.5)
    assert wall([1, 4]) == pytest.approx(2.0)  # the wrong periods out
    assert wall([]) == pytest.approx(0.5)  # 3 of 5 still 0.5 ...
    assert wall([], first=2) == pytest.approx(1.25)  # ... but not here
    with pytest.raises(ValueError, match="step 0"):
        accuracy_curve([], _feedback([1.0, 2.0])[2:], smooth=1)


SETUP = RealdataSetup(policies=("static", "lbb", "ett-stream"), warmup_steps=2, steps=8, eval_every=2,
                      smooth_evals=1, repeats=3)  # target step 6


def _run(policy: str, repeat: int, seconds_per_step: float, rise: float = 0.1, period: float | None = None,
         control: bool = False, error: str | None = None) -> Run:
    """A run whose accuracy rises `rise` per evaluation (every 2 steps) from 0.1, training `seconds_per_step`."""
    points = [AccuracyPoint(step=s, seconds=s * seconds_per_step, accuracy=min(1.0, 0.1 + rise * s / 2),
                            smoothed=min(1.0, 0.1 + rise * s / 2)) for s in range(2, 11, 2)]
    return Run(policy=policy, slowdowns=(1.0,) * 4 if control else (1.0, 1.0, 1.0, 4.0), repeat=repeat,
               accuracy=[] if error else points, error=error, wall_step_seconds_median=period or seconds_per_step,
               step_seconds_median=seconds_per_step, rank_samples_median={"0": 20.0, "3": 4.0}, samples_unaccounted=0)


def _result(runs: list[Run], setup: RealdataSetup = SETUP) -> RealdataResult:
    judged, target, rule = judge_realdata(runs, setup)
    return RealdataResult(setup=setup, target=target, target_rule=rule, seconds=60.0, runs=judged)


def _targets(runs: list[Run], setup: RealdataSetup = SETUP) -> list[Target]:
    """No later than the best other policy, ≥ 2x sooner than static, the wall period against the oracle."""
    return realdata_targets(_result(runs, setup))


def test_target_is_statics_mid_window_accuracy_over_its_runs_and_each_run_is_timed_to_it() -> None:
    runs = [_run("static", r, 0.8, rise) for r, rise in enumerate([0.1, 0.16, 0.05])]
    runs += [_run("ett-stream", r, 0.25) for r in range(3)] + [_run("lbb", r, 0.3) for r in range(3)]
    judged, target, rule = judge_realdata(runs, SETUP)
    assert target == pytest.approx(0.4)  # step 6: 0.4, 0.58, 0.25 -> median 0.4
    assert "after step 6" in rule and "3 runs" in rule
    assert judge_realdata(runs, SETUP.model_copy(update={"target_accuracy": 0.55}))[1] == 0.55
    cells = {c.fig.policy: c for c in combine(judged)}
    ett, static = cells["ett-stream"].fig, cells["static"]
    assert ett.seconds_to_target == pytest.approx(6 * 0.25) and ett.steps_to_target == 6
    # static's own runs: 4.8 s, 4 steps x 0.8 s (the faster-rising run), never (the slower one) -> median 4.8
    assert [r.seconds_to_target for r in static.runs] == pytest.approx([4.8, 3.2, None])  # type: ignore[arg-type]
    assert static.fig.seconds_to_target == pytest.approx(4.8)
    best, speedup, oracle = _targets(runs)
    assert best.met is True and best.measured == "ett-stream 1.5 s, best other lbb 1.8 s"
    assert speedup.met is True and speedup.measured == f"static 4.8 s / ett-stream 1.5 s = {4.8 / 1.5:.2f}{TIMES}"
    assert oracle.met is None and oracle.measured.startswith("250 ms against — ms")  # no control run


def test_never_reaching_the_target_in_most_runs_is_no_time_and_fails_the_verdicts() -> None:
    runs = [_run("static", r, 0.8) for r in range(3)]
    runs += [_run("ett-stream", r, 0.25, rise=0.05 if r else 0.1) for r in range(3)]  # 2 of 3 never reach 0.4
    best, speedup, _ = _targets(runs)
    assert best.met is False and best.measured == "ett-stream not reached, best other static 4.8 s"
    assert speedup.met is None and speedup.measured == "static 4.8 s / ett-stream not reached"


def test_the_oracle_is_the_control_times_n_over_the_summed_speeds() -> None:
    assert 0.2 * oracle_factor((1.0, 1.0, 1.0, 4.0)) == pytest.approx(0.2 * 4 / 3.25)
    assert 0.2 * oracle_factor((1.0, 1.0)) == pytest.approx(0.2)
    runs = [_run("static", 0, 0.8), _run("ett-stream", 0, 0.3, period=0.27),
            _run("ett-stream", 0, 0.2, period=0.2, control=True)]
    assert [(c.fig.policy, c.fig.control) for c in combine(runs)] == [("static", False), ("ett-stream", False),
                                                                      ("ett-stream", True)]
    oracle = _targets(runs)[2]
    assert oracle.met is True
    oracle_ms = 0.2e3 * 4 / 3.25
    assert oracle.measured == f"270 ms against {oracle_ms:.0f} ms (control 200 ms) = {270 / oracle_ms:.2f}{TIMES}"
    assert _targets([*runs[:1], _run("ett-stream", 0, 0.3, period=0.29 * 1.2), runs[2]])[2].met is False  # 1.41x
    # A control slower than the heterogeneous fleet was slowed by something else: its oracle is not judged.
    loaded = _result([*runs[:2], _run("ett-stream", 0, 0.4, period=0.4, control=True)])
    oracle = REALDATA.targets(loaded)[2]  # type: ignore[misc]
    assert oracle.met is None and "bounds nothing" in oracle.measured


def test_the_oracle_time_to_the_target_bounds_the_speedup_over_static() -> None:
    # Each run reaches 0.4 after 6 steps (rise 0.1 per 2 steps): static at 0.8 s a step, ett-stream at 0.3, the
    # equal-rank control at 0.2 s. A perfect split of 1,1,1,4 paces 0.2 x 4 / 3.25 s a step over static's 6 steps.
    runs = [_run("static", r, 0.8) for r in range(3)] + [_run("ett-stream", r, 0.3) for r in range(3)]
    runs += [_run("ett-stream", r, 0.2 + 0.01 * r, control=True) for r in range(3)]
    pace = 0.21 * 4 / 3.25  # the control's median pace to its target
    # No policy is faster than the oracle: ett-stream's speed-up (2.67x) stays under its bound (3.10x).
    assert _targets(runs)[1].measured == (
        f"static 4.8 s / ett-stream 1.8 s = {4.8 / 1.8:.2f}{TIMES}; a perfect split from step 0 would take "
        f"{pace * 6:.1f} s = {0.8 / pace:.2f}{TIMES}; ett-stream's pace to it {0.3 / pace:.2f}{TIMES} the oracle's")
    # Without a control there is no oracle to bound anything.
    assert "perfect split" not in _targets(runs[:6])[1].measured


def test_a_failed_run_is_counted_apart_and_a_cell_of_failures_is_an_error() -> None:
    runs = [_run("static", 0, 0.8), _run("static", 1, 0.8, error="boom"), _run("lbb", 0, 0.3, error="no ranks")]
    cells = {c.fig.policy: c for c in combine(runs)}
    assert len(cells["static"].runs) == 2 and len(cells["static"].ok) == 1
    assert cells["lbb"].fig.error == "no ranks" and cells["lbb"].fig.seconds_to_target is None


def test_rounds_rotate_the_order_so_every_cell_runs_first_once() -> None:
    setup = RealdataSetup(policies=("static", "ett-stream"), repeats=3)
    plan = setup.plan()
    assert [c.policy + ("/c" if c.control else "") for c in plan] == [
        "static", "ett-stream", "ett-stream/c", "ett-stream", "ett-stream/c", "static", "ett-stream/c", "static",
        "ett-stream"]
    assert [c.repeat for c in plan] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert Run(policy="ett-stream", slowdowns=(1.0,) * 4).control
    assert not Run(policy="static", slowdowns=(1.0, 4.0)).control
    # The backlog outlasts the window whoever plans it: above the largest share any policy gives one device.
    assert setup.backlog_per_device > 0.4 * setup.global_batch * setup.until_step


def test_setup_refuses_what_it_cannot_judge() -> None:
    with pytest.raises(ValueError, match="static"):
        RealdataSetup(policies=("ett-stream",))
    with pytest.raises(ValueError, match="unknown policies"):
        RealdataSetup(policies=("static", "fastest"))
    with pytest.raises(ValueError, match="slowdowns"):
        RealdataSetup(slowdowns=(0.5, 1.0))
    assert RealdataSetup(policies=("ett-stream",), target_accuracy=0.5).target_accuracy == 0.5


def test_result_round_trips_and_renders_its_section(tmp_path: Path) -> None:
    runs = [_run("static", r, 0.8) for r in range(3)] + [_run("ett-stream", r, 0.25) for r in range(3)]
    runs += [_run("ett-stream", r, 0.2, control=True) for r in range(3)]
    result = _result(runs, SETUP.model_copy(update={"settings": {"trainer.model": "seq"}}))
    loaded = RealdataResult.load(result.write(tmp_path / "realdata.json"))
    assert loaded == result
    text = render_realdata(loaded)
    assert REALDATA.draw(loaded, tmp_path) == tmp_path / "realdata.png"
    assert "`trainer.model=seq`" in text and "ett-stream (control, 1,1,1,1)" in text and "**met**" in text
    # 6 steps at 0.2 x 4 / 3.25 s against static's 6 at 0.8 s
    assert "a perfect split from step 0 would take 1.5 s = 3.25\N{MULTIPLICATION SIGN}" in text


def test_a_bad_setup_reads_as_what_to_change() -> None:
    with pytest.raises(ValidationError) as caught:
        RealdataSetup(policies=("static", "fastest"))
    assert problems(caught.value).startswith("unknown policies ['fastest']; known: static,")
    assert problems(ValueError("plain")) == "plain"
    with pytest.raises(ValidationError) as caught:
        RealdataSetup(steps=1, eval_every=0)
    assert problems(caught.value) == ("steps: Input should be greater than or equal to 2; "
                                      "eval_every: Input should be greater than or equal to 1")


def test_the_regression_workload_is_timed_to_a_falling_held_out_rmse() -> None:
    setup = RealdataSetup(dataset="tecator", policies=("static", "ett-stream"), warmup_steps=2, steps=8,
                          eval_every=2, smooth_evals=1, repeats=1)
    assert setup.held_out_metric == "rmse" and setup.lower_is_better and not SETUP.lower_is_better
    assert setup.settings_of(setup.cells()[0])["producer.dataset.sharding"] == "random"  # no classes to stratify
    assert "trainer.num_classes" not in setup.settings_of(setup.cells()[0])
    feedback = _feedback([1.0, 2.0, 3.0, 4.0, 5.0])
    evaluations = [Evaluation(job="j", step=s, dataset="tecator", samples=43, accuracy=None, loss=1.0, seconds=0.0,
                              sent_at=T0 + s, objective="regression", metrics={"rmse": rmse, "baseline_rmse": 12.9})
                   for s, rmse in ((2, 11.0), (4, 6.0))]
    curve = accuracy_curve(evaluations, feedback, smooth=1, metric="rmse")
    assert [(p.step, p.accuracy) for p in curve] == [(2, 11.0), (4, 6.0)]
    assert accuracy_curve(evaluations, feedback, smooth=1) == []  # no accuracy in a regression run's evaluations

    def falling(policy: str, seconds_per_step: float) -> Run:
        points = [AccuracyPoint(step=s, seconds=s * seconds_per_step, accuracy=12.0 - s, smoothed=12.0 - s)
                  for s in range(2, 11, 2)]
        return Run(policy=policy, slowdowns=(1.0, 1.0, 1.0, 4.0), accuracy=points,
                   wall_step_seconds_median=seconds_per_step, step_seconds_median=seconds_per_step)

    judged, target, _ = judge_realdata([falling("static", 0.8), falling("ett-stream", 0.3)], setup)
    assert target == pytest.approx(6.0)  # static's RMSE after step 6, reached from above
    assert judged[1].steps_to_target == 6 and judged[1].seconds_to_target == pytest.approx(1.8)
    with pytest.raises(ValidationError, match="bench realdata replays"):
        RealdataSetup(dataset="mnist")
