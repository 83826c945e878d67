"""Simulator smoke tests and the `streamtrain sim` command."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamtrain.cli import app
from streamtrain.config import CoordinatorConfig
from streamtrain.coordinator.sim import SimResult, build_scenario, simulate


def test_ett_stream_beats_static_on_straggler_effect() -> None:
    sc = build_scenario("lbb-disturbance", steps=60, disturb_seconds=0.0, devices=4, initial=3000)
    cfg = CoordinatorConfig(global_batch=128)
    ours = simulate(sc, cfg, "ett-stream").summary
    static = simulate(sc, cfg, "static").summary
    assert ours["median_straggler_effect"] < 0.1 < static["median_straggler_effect"]
    assert ours["samples_per_second"] > static["samples_per_second"]


def test_se_recovers_within_five_steps_of_each_disturbance() -> None:
    sc = build_scenario("lbb-disturbance", steps=150)
    summary = simulate(sc, CoordinatorConfig(global_batch=256), "ett-stream").summary
    recovery = summary["disturbance_recovery_steps"]
    assert recovery["events"] == 4 and recovery["max"] <= 5


def test_epoch_time_stays_flat_with_imbalance_under_ett_stream() -> None:
    cfg = CoordinatorConfig(global_batch=64)
    times = {}
    for dif in (0.0, 64.0):
        sc = build_scenario("table-iv", size_dif=dif, initial=400)
        times[dif] = (simulate(sc, cfg, "ett-stream").summary["epoch_seconds_nominal"],
                      simulate(sc, cfg, "static").summary["epoch_seconds_nominal"])
    assert times[64.0][0] <= 1.1 * times[0.0][0]
    assert times[64.0][1] > 1.2 * times[0.0][1]


@pytest.mark.parametrize("ahead", [0, 1])
def test_truncation_bounds_backlog_of_a_saturated_stream(ahead: int) -> None:
    sc = build_scenario("stream", duration=10.0, devices=2, speed=(1.0,), rate=(300.0,))
    kept = simulate(sc, CoordinatorConfig(plan_ahead=ahead), "ett-stream").summary
    cut = simulate(sc, CoordinatorConfig(truncation="bounded", max_lag_samples=100, plan_ahead=ahead),
                   "ett-stream").summary
    # Buffered at the end: the samples kept, and what arrived over the last step (~1.3 s at 300/s). A plan made a
    # step ahead truncates when its step runs, so one more step of arrivals is still buffered then.
    bound = 2 * 100 + 2 * 300 + ahead * 2 * 300 * cut["median_step_seconds"]
    assert cut["samples_truncated"] > 0 and cut["final_backlog"] <= bound
    assert kept["samples_truncated"] == 0 and kept["final_backlog"] > cut["final_backlog"]


def test_sim_command_writes_json_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["sim", "--scenario", "table-iv", "-p", "static", "-p", "ett-stream",
                                      "--dif", "0", "--dif", "32", "--devices", "4", "--steps", "40",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "sim.json").read_text())
    assert {(r["policy"], r["dif"]) for r in data["runs"]} == {
        (p, d) for p in ("static", "ett-stream") for d in (0.0, 32.0)}
    assert len(data["runs"][0]["series"]["step_seconds"]) == data["runs"][0]["summary"]["steps"]
    assert (out / "steps.png").stat().st_size > 0 and (out / "epoch_vs_dif.png").stat().st_size > 0


def test_sim_command_rejects_bad_arguments(tmp_path: Path) -> None:
    runner = CliRunner()
    bad_policy = runner.invoke(app, ["sim", "-p", "fastest", "--out", str(tmp_path)])
    assert bad_policy.exit_code == 2 and "fastest" in bad_policy.output
    bad_speed = runner.invoke(app, ["sim", "--speed", "fast", "--out", str(tmp_path)])
    assert bad_speed.exit_code == 2 and "--speed" in bad_speed.output
    bad_setting = runner.invoke(app, ["--set", "coordinator.b_min=9", "--set", "coordinator.b_max=3", "sim",
                                      "--out", str(tmp_path)])
    assert bad_setting.exit_code == 2 and "b_min" in bad_setting.output


def test_padding_trainer_computes_on_count_times_largest_sample() -> None:
    # One device, fixed step: static takes 4 samples of sizes 10, 10, 10, 50 -> padded size 4 x 50 = 200.
    base = build_scenario("table-iv", devices=1, speed=(1.0,), initial=4, size_kind="fixed", size_mean=10.0,
                          size_dif=0.0, noise=0.0, comm_seconds=0.0, b=0.0, a=1e-3)
    cfg = CoordinatorConfig(global_batch=4)
    packed = simulate(replace(base, padded=()), cfg, "static")
    padded = simulate(base, cfg, "static")
    assert packed.series["step_seconds"][0] == pytest.approx(4 * 10 * 1e-3)
    assert padded.series["step_seconds"][0] == pytest.approx(4 * 10 * 1e-3)  # equal sizes: padding costs nothing
    skewed = replace(base, size_kind="normal", size_dif=30.0, seed=3)
    free = simulate(replace(skewed, padded=()), cfg, "static").series["step_seconds"][0]
    dense = simulate(skewed, cfg, "static").series["step_seconds"][0]
    assert dense > free  # the same four samples, padded to the longest, cost more


def test_table_iv_shape_static_grows_steeply_ett_stream_stays_flat() -> None:
    cfg = CoordinatorConfig(global_batch=64)
    runs = {(p, dif): simulate(build_scenario("table-iv", size_dif=dif, initial=300), cfg, p).summary
            for p in ("static", "ett-stream") for dif in (0.0, 64.0)}
    # Sizes are N(45, DIF) clipped to >= 1 (the paper's workload): at DIF 64 the clip adds ~20% more data,
    # which every policy must train; the nominal epoch time takes that out of the comparison.
    assert runs["ett-stream", 64.0]["size_trained"] > 1.1 * runs["ett-stream", 0.0]["size_trained"]
    epoch = {k: s["epoch_seconds_nominal"] for k, s in runs.items()}
    assert epoch["static", 64.0] > 2.0 * epoch["static", 0.0]  # the paper: +147%
    assert epoch["ett-stream", 64.0] <= 1.1 * epoch["ett-stream", 0.0]  # the paper: +7%
    assert runs["static", 64.0]["epoch_seconds"] > 2.5 * runs["static", 0.0]["epoch_seconds"]


def test_light_streams_fill_the_step_target_by_holding_reports() -> None:
    """Streams a fleet trains in a fraction of a step: without holding, every step trains the one or two
    samples that arrived during the last one and is mostly fixed cost; holding the reports until the
    plan's target makes each step about the target long, at the same line rate."""
    sc = build_scenario("stream", devices=4, rate=(30.0, 45.0), duration=30.0)
    cfg = CoordinatorConfig()
    held = simulate(sc, cfg, "ett-stream")
    eager = simulate(replace(sc, hold_max_seconds=0.0), cfg, "ett-stream")
    h, e = held.summary, eager.summary
    for run in (h, e):  # line rate either way: what is left at the end is about one step's arrivals
        assert run["samples_trained"] >= 0.98 * run["samples_arrived"] and run["max_lag_seconds"] < 1.0
    assert h["steps"] * 2 < e["steps"]
    late = slice(len(held.series["step_seconds"]) // 2, None)  # once the models are fitted
    steps, targets = held.series["step_seconds"][late], held.series["step_target"][late]
    filled = [s >= 0.95 * t for s, t in zip(steps, targets, strict=True)]
    assert sum(filled) >= 0.9 * len(filled)  # the others left a sample behind (it did not fit): no hold
    assert e["median_step_seconds"] < 0.5 * h["median_step_seconds"]


def test_plans_ahead_add_no_empty_steps_at_line_rate() -> None:
    """Streams so light that every plan takes all there is: a plan made ahead would find nothing and run an
    empty group step between every two that train (measured before the rule: 159 empty steps of 633 against 76
    of 552 planning after each step). Left unmade, the steps are those of plans made after each step."""
    sc = build_scenario("stream", devices=4, rate=(4.0, 10.0), duration=60.0)

    def empty(ahead: int) -> tuple[int, int]:
        run = simulate(sc, CoordinatorConfig(plan_ahead=ahead), "ett-stream")
        return sum(1 for n in run.series["samples"] if n == 0), run.summary["steps"]

    (empty_after, steps_after), (empty_ahead, steps_ahead) = empty(0), empty(1)
    assert empty_ahead <= 1.1 * empty_after + 2
    assert steps_ahead <= 1.05 * steps_after


@pytest.mark.parametrize("ahead", [0, 1])
def test_a_truncated_stream_is_never_held(ahead: int) -> None:
    """truncate keeps about one step's worth, so a plan can take all that is left; the streams still outrun
    training, and holding would idle the fleet while truncation drops more. Measured once the models are
    fitted: the first steps measure the fleet, and a plan made ahead from their warm-start guesses may take
    all it saw of a stream that has barely started (one held step)."""
    sc = build_scenario("stream", duration=20.0, devices=2, speed=(1.0,), rate=(300.0,))
    cfg = CoordinatorConfig(truncation="truncate", plan_ahead=ahead)
    held = simulate(sc, cfg, "ett-stream")
    eager = simulate(replace(sc, hold_max_seconds=0.0), cfg, "ett-stream")
    assert held.summary["samples_truncated"] > 0

    def late_rate(run: SimResult) -> float:
        t, n = run.series["time"], run.series["samples"]
        return sum(n[10:]) / (t[-1] - t[9])

    # A hold is left only on a step truncation did not need to cut (measured: 98-100% of the rate without
    # holds; 88% when truncated steps held too).
    assert late_rate(held) >= 0.96 * late_rate(eager)


def test_a_backlog_is_never_held() -> None:
    sc = build_scenario("table-iv", size_dif=16.0, initial=400)
    cfg = CoordinatorConfig(global_batch=64)
    held = simulate(sc, cfg, "ett-stream").summary
    eager = simulate(replace(sc, hold_max_seconds=0.0), cfg, "ett-stream").summary
    assert held["epoch_seconds"] == eager["epoch_seconds"] and held["steps"] == eager["steps"]


@pytest.mark.parametrize("truncation", ["persist", "bounded"])
def test_plans_made_ahead_train_each_sample_once(truncation: str) -> None:
    """Two plans outstanding at every step: the one ahead is made from the buffers less the one running, so no
    sample is planned twice, and every sample is trained, truncated or still buffered."""
    sc = build_scenario("stream", duration=15.0, devices=4, rate=(40.0, 400.0))
    extra = {"max_lag_samples": 50} if truncation == "bounded" else {}
    for ahead in (0, 1):
        cfg = CoordinatorConfig.model_validate({"truncation": truncation, "plan_ahead": ahead, **extra})
        s = simulate(sc, cfg, "ett-stream").summary
        assert s["samples_trained"] + s["samples_truncated"] + s["final_backlog"] == s["samples_arrived"]
        assert (s["samples_truncated"] > 0) == (truncation == "bounded")
