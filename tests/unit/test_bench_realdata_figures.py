"""The balance benchmark's dataset workload (bench realdata), from real Evaluation / StepFeedback records:
accuracy over training time, the target, repeats combined, the oracle and the verdicts, the stored JSON and its
BENCHMARKS.md section."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from benchmarks.balance.accuracy import (
    accuracy_curve,
    combine_runs,
    evaluate_realdata,
    summarise_realdata,
    target_accuracy,
    wall_period_median,
)
from benchmarks.balance.render import render_realdata
from benchmarks.balance.results import AccuracyPoint, RealdataResult, RunResult
from benchmarks.balance.setup import RealdataCell, RealdataSetup, oracle_factor, schedule
from benchmarks.common import RenderContext, problems
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
    assert wall_period_median(feedback, [2, 5], first=1, until=6) == pytest.approx(0.5)
    assert wall_period_median(feedback, [1, 4], first=1, until=6) == pytest.approx(2.0)  # the wrong periods out
    assert wall_period_median(feedback, [], first=1, until=6) == pytest.approx(0.5)  # 3 of 5 still 0.5 ...
    assert wall_period_median(feedback, [], first=2, until=6) == pytest.approx(1.25)  # ... but not here
    with pytest.raises(ValueError, match="step 0"):
        accuracy_curve([], _feedback([1.0, 2.0])[2:], smooth=1)


SETUP = RealdataSetup(policies=("static", "lbb", "ett-stream"), warmup_steps=2, steps=8, eval_every=2,
                      smooth_evals=1, repeats=3)  # target step 6


def _run(policy: str, repeat: int, seconds_per_step: float, rise: float = 0.1, period: float | None = None,
         control: bool = False, error: str | None = None) -> RunResult:
    """A run whose accuracy rises `rise` per evaluation (every 2 steps) from 0.1, training `seconds_per_step`."""
    points = [AccuracyPoint(step=s, seconds=s * seconds_per_step, accuracy=min(1.0, 0.1 + rise * s / 2),
                            smoothed=min(1.0, 0.1 + rise * s / 2)) for s in range(2, 11, 2)]
    return RunResult(policy=policy, slowdowns=(1.0,) * 4 if control else (1.0, 1.0, 1.0, 4.0), control=control,
                     repeat=repeat, accuracy=[] if error else points, error=error,
                     wall_period_seconds_median=period or seconds_per_step, step_seconds_median=seconds_per_step,
                     rank_samples_median={"0": 20.0, "3": 4.0}, samples_unaccounted=0,
                     final_accuracy=None if error else points[-1].accuracy)


def test_target_is_statics_mid_window_accuracy_over_its_runs_and_each_run_is_timed_to_it() -> None:
    runs = [_run("static", r, 0.8, rise) for r, rise in enumerate([0.1, 0.16, 0.05])]
    runs += [_run("ett-stream", r, 0.25) for r in range(3)] + [_run("lbb", r, 0.3) for r in range(3)]
    target, rule = target_accuracy(runs, SETUP)
    assert target == pytest.approx(0.4)  # step 6: 0.4, 0.58, 0.25 -> median 0.4
    assert "after step 6" in rule and "3 runs" in rule
    assert target_accuracy(runs, SETUP.model_copy(update={"target_accuracy": 0.55}))[0] == 0.55

    result = summarise_realdata(runs, SETUP, {"trainer.model": "seq"}, 60.0)
    ett = result.find("ett-stream")
    static = result.find("static")
    assert ett is not None and static is not None
    assert ett.seconds_to_target == pytest.approx(6 * 0.25) and ett.steps_to_target == 6
    # static's own runs: 4.8 s, 4 steps x 0.8 s (the faster-rising run), never (the slower one) -> median 4.8
    assert static.seconds_to_target_runs == pytest.approx([4.8, 3.2, None])  # type: ignore[arg-type]
    assert static.seconds_to_target == pytest.approx(4.8)
    t = result.targets
    assert t.best_other_policy == "lbb" and t.no_later_than_best_met is True
    assert t.speedup_vs_static == pytest.approx(4.8 / 1.5) and t.speedup_met is True
    assert t.oracle_step_seconds is None and t.oracle_met is None  # no control run


def test_never_reaching_the_target_in_most_runs_is_no_time_and_fails_the_verdicts() -> None:
    runs = [_run("static", r, 0.8) for r in range(3)]
    runs += [_run("ett-stream", r, 0.25, rise=0.05 if r else 0.1) for r in range(3)]  # 2 of 3 never reach 0.4
    t = summarise_realdata(runs, SETUP, {}, 1.0).targets
    assert t.ett_stream_seconds_to_target is None
    assert t.no_later_than_best_met is False and t.speedup_vs_static is None and t.speedup_met is None


def test_the_oracle_is_the_control_times_n_over_the_summed_speeds() -> None:
    assert 0.2 * oracle_factor((1.0, 1.0, 1.0, 4.0)) == pytest.approx(0.2 * 4 / 3.25)
    assert 0.2 * oracle_factor((1.0, 1.0)) == pytest.approx(0.2)
    runs = [_run("static", 0, 0.8), _run("ett-stream", 0, 0.3, period=0.27),
            _run("ett-stream", 0, 0.2, period=0.2, control=True)]
    policies = combine_runs(runs)
    assert [(p.policy, p.control) for p in policies] == [("static", False), ("ett-stream", False), ("ett-stream", True)]
    t = evaluate_realdata(policies, 0.4, "fixed", (1.0, 1.0, 1.0, 4.0))
    assert t.oracle_step_seconds == pytest.approx(0.2 * 4 / 3.25)
    assert t.over_oracle == pytest.approx(0.27 / (0.2 * 4 / 3.25)) and t.oracle_met is True
    slow = combine_runs([*runs[:1], _run("ett-stream", 0, 0.3, period=0.29 * 1.2), runs[2]])
    assert evaluate_realdata(slow, 0.4, "fixed", (1.0, 1.0, 1.0, 4.0)).oracle_met is False
    # A control slower than the heterogeneous fleet was slowed by something else: its oracle is not judged.
    loaded = combine_runs([*runs[:2], _run("ett-stream", 0, 0.4, period=0.4, control=True)])
    t = evaluate_realdata(loaded, 0.4, "fixed", (1.0, 1.0, 1.0, 4.0))
    assert t.oracle_is_bound is False and t.oracle_met is None and t.over_oracle is not None


def test_the_oracle_time_to_the_target_bounds_the_speedup_over_static() -> None:
    # Each run reaches 0.4 after 6 steps (rise 0.1 per 2 steps): static at 0.8 s a step, ett-stream at 0.3, the
    # equal-rank control at 0.2 s. A perfect split of 1,1,1,4 paces 0.2 x 4 / 3.25 s a step over static's 6 steps.
    runs = [_run("static", r, 0.8) for r in range(3)] + [_run("ett-stream", r, 0.3) for r in range(3)]
    runs += [_run("ett-stream", r, 0.2 + 0.01 * r, control=True) for r in range(3)]
    t = summarise_realdata(runs, SETUP, {}, 1.0).targets
    pace = 0.21 * 4 / 3.25  # the control's median pace to its target
    assert t.oracle_seconds_to_target == pytest.approx(pace * 6)
    assert t.oracle_speedup_vs_static == pytest.approx(0.8 * 6 / (pace * 6))
    assert t.ett_stream_over_oracle_to_target == pytest.approx(0.3 / pace)
    # The bound is met by no policy faster than the oracle: ett-stream's speed-up stays under it.
    assert t.speedup_vs_static is not None and t.speedup_vs_static < t.oracle_speedup_vs_static
    # Without a control there is no oracle to bound anything.
    alone = summarise_realdata(runs[:6], SETUP, {}, 1.0).targets
    assert alone.oracle_seconds_to_target is None and alone.oracle_speedup_vs_static is None


def test_a_failed_run_is_counted_apart_and_a_cell_of_failures_is_an_error() -> None:
    runs = [_run("static", 0, 0.8), _run("static", 1, 0.8, error="boom"), _run("lbb", 0, 0.3, error="no ranks")]
    cells = {p.policy: p for p in combine_runs(runs)}
    assert cells["static"].runs == 2 and cells["static"].failed_runs == 1
    assert cells["static"].seconds_to_target_runs == [None]  # not yet judged against a target
    assert cells["lbb"].error == "no ranks" and cells["lbb"].seconds_to_target is None


def test_rounds_rotate_the_order_so_every_cell_runs_first_once() -> None:
    setup = RealdataSetup(policies=("static", "ett-stream"), repeats=3)
    plan = schedule(setup)
    assert [c.policy + ("/c" if c.control else "") for _, c in plan] == [
        "static", "ett-stream", "ett-stream/c", "ett-stream", "ett-stream/c", "static", "ett-stream/c", "static",
        "ett-stream"]
    assert [r for r, _ in plan] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert RealdataCell("ett-stream", (1.0,) * 4).control and not RealdataCell("static", (1.0, 4.0)).control
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
    result = summarise_realdata(runs, SETUP, {"trainer.model": "seq"}, 600.0)
    loaded = RealdataResult.load(result.write(tmp_path / "realdata.json"))
    assert loaded == result
    text = render_realdata(loaded, RenderContext(tmp_path, tmp_path))
    assert (tmp_path / "realdata.png").stat().st_size > 0
    assert "![realdata](realdata.png)" in text and "`trainer.model=seq`" in text
    assert "ett-stream (control, 1,1,1,1)" in text and "**met**" in text
    # 6 steps at 0.2 x 4 / 3.25 s against static's 6 at 0.8 s
    assert "a perfect split from step 0 would take 1.5 s = 3.25\N{MULTIPLICATION SIGN}" in text


def test_a_bad_setup_reads_as_what_to_change() -> None:
    with pytest.raises(ValidationError) as caught:
        RealdataSetup(policies=("static", "fastest"))
    assert problems(caught.value).startswith("unknown policies ['fastest']; known: static,")
    assert problems(ValueError("plain")) == "plain"
