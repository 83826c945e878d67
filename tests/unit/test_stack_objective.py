"""The report's test-then-train and held-out figures, in the objective's terms, from what Kafka holds."""

from __future__ import annotations

import math

import pytest

from streamtrain.config.trainer import TrainerConfig
from streamtrain.report.objective import (
    closing_objective_lines,
    heldout_metric_figures,
    heldout_rows,
    objective_figures,
    objective_for_report,
    prequential_series,
)
from streamtrain.wire import Evaluation, StepFeedback


def _fb(step: int, device: str, sums: dict[str, float]) -> StepFeedback:
    return StepFeedback(job="j", step=step, device_id=device, rank=int(device), plan_step=step,
                        samples=int(sums.get("count", 0)), total_size=0, compute_seconds=0.1, data_wait_seconds=0.0,
                        comm_seconds=0.0, step_seconds=0.1, memory_bytes=1, lowest_unprocessed_offset=0,
                        buffer_depth=0, sent_at=1_000 + 100 * step, prequential=sums)


def _regression(count: float, sq: float, base_sq: float) -> dict[str, float]:
    return {"count": count, "values": count, "loss_sum": sq / 4, "abs_error_sum": math.sqrt(sq) * count,
            "squared_error_sum": sq * count, "baseline_abs_error_sum": 0.0,
            "baseline_squared_error_sum": base_sq * count}


FEEDBACK = [
    _fb(0, "0", _regression(4, 9.0, 16.0)), _fb(0, "1", _regression(2, 9.0, 16.0)),
    _fb(1, "0", {}),  # trained nothing: no sums
    _fb(1, "1", _regression(2, 1.0, 16.0)),
    _fb(2, "0", _regression(4, 1.0, 16.0)), _fb(2, "1", _regression(4, 1.0, 16.0)),
]


def test_prequential_figures_add_the_sums_of_every_rank_and_step() -> None:
    objective = objective_for_report(TrainerConfig(objective="regression"))
    held = [Evaluation(job="j", step=s, dataset="d", samples=5, accuracy=None, loss=0.2, seconds=0.1,
                       objective="regression", metrics={"rmse": rmse, "baseline_rmse": 12.9})
            for s, rmse in ((1, 8.0), (2, 2.5))]
    figures = objective_figures(FEEDBACK, held, ["0", "1"], objective, window=2)
    fleet = figures.prequential
    assert fleet.samples == 16 and figures.headline == "rmse" and figures.baseline == "baseline_rmse"
    # Running: (6 samples x 9 + 10 samples x 1) / 16; the window of the last two steps with sums: 10 samples x 1.
    assert fleet.running["rmse"] == pytest.approx(math.sqrt((6 * 9 + 10) / 16))
    assert fleet.recent["rmse"] == pytest.approx(1.0) and fleet.recent["baseline_rmse"] == pytest.approx(4.0)
    assert figures.prequential_per_device["0"].recent["rmse"] == pytest.approx(math.sqrt((4 * 9 + 4) / 8))
    assert figures.heldout_first["rmse"] == 8.0 and figures.heldout_final == {"rmse": 2.5, "baseline_rmse": 12.9}
    series = prequential_series(FEEDBACK, 1_000, objective, window=1)
    assert series["step"] == [0, 1, 2] and series["t"] == [0.0, 0.1, 0.2]
    assert series["rmse_recent"] == pytest.approx([3.0, 1.0, 1.0]) and series["headline"] == "rmse"
    assert heldout_metric_figures(held, 1_000)["points"][0] == {"step": 1, "t": held[0].sent_at / 1e3 - 1,
                                                                  "rmse": 8.0, "baseline_rmse": 12.9}
    lines = closing_objective_lines(figures, "d, 5 samples")
    assert lines[0] == ("test-then-train RMSE (each of 16 samples scored before it was trained): 1.000 over the last 2 "
                        "steps, 2.000 over the run; baseline (the mean of the targets trained so far) 4.000")
    assert lines[1] == ("held-out RMSE (d, 5 samples): 8.000 at the first evaluation, 2.500 at the last against "
                        "12.900 for the baseline")


def test_an_objective_that_does_not_import_is_reported_by_its_loss() -> None:
    objective = objective_for_report(TrainerConfig(objective="nowhere_to_be_found:Thing"))
    figures = objective_figures(FEEDBACK, [], ["0", "1"], objective, window=5)
    assert set(figures.prequential.running) == {"loss"} and figures.headline == "loss"
    assert closing_objective_lines(figures)[0].startswith("test-then-train loss")
    assert closing_objective_lines(None) == [] and heldout_metric_figures([]) == {}


def test_the_live_view_shows_the_fleets_test_then_train_metric_from_the_ranks_sums() -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from rich.console import Console

    from streamtrain.stack.monitor import Monitor, StackSnapshot, parse_metrics, render_snapshot
    from streamtrain.trainer.metrics import ObjectiveMetrics

    objective = objective_for_report(TrainerConfig())
    scraped = []
    for device, (count, correct) in {"0": (10.0, 9.0), "1": (30.0, 15.0)}.items():
        registry = CollectorRegistry()
        ranks = ObjectiveMetrics(registry, device, "j", objective, window=5)
        ranks.record_step({"count": count, "loss_sum": 1.0, "correct": correct, "baseline_correct": count / 4})
        ranks.record_heldout({"accuracy": 0.7, "baseline_accuracy": 0.3})
        scraped.append(parse_metrics(generate_latest(registry).decode()))
    monitor = Monitor(["0", "1"], "http://127.0.0.1:9", {}, {}, objective)
    snap = StackSnapshot(elapsed_s=1.0, phase="running")
    monitor._learning(snap, scraped)
    assert snap.metric == "accuracy" and snap.prequential == pytest.approx(24 / 40)  # of the summed sums
    assert snap.prequential_baseline == pytest.approx(0.25)
    assert (snap.heldout, snap.heldout_baseline) == (0.7, 0.3)
    console = Console(width=300, record=True)
    console.print(render_snapshot(snap))
    shown = console.export_text()
    assert "test-then-train accuracy 0.6 (last 30 s, baseline 0.25)" in shown
    assert "held-out accuracy 0.7 (step -, baseline 0.3)" in shown


def test_up_ends_with_test_then_train_accuracy_beside_held_out_accuracy() -> None:
    from streamtrain.report.run_balance import closing_lines
    from streamtrain.report.schema import StackReport

    objective = objective_for_report(TrainerConfig(num_classes=3))
    feedback = [_fb(0, "0", {"count": 10.0, "loss_sum": 9.0, "correct": 4.0, "baseline_correct": 3.0}),
                _fb(1, "0", {"count": 10.0, "loss_sum": 5.0, "correct": 8.0, "baseline_correct": 3.0})]
    held = [Evaluation(job="j", step=2, dataset="PLAID_TEST.ts", samples=537, accuracy=0.75, loss=0.7, seconds=0.1,
                       metrics={"accuracy": 0.75, "baseline_accuracy": 0.16, "loss": 0.7})]
    report = StackReport(objective=objective_figures(feedback, held, ["0"], objective, window=1),
                         heldout_dataset="PLAID_TEST.ts", heldout_samples=537, heldout_evaluations=1,
                         heldout_accuracy_first=0.75, heldout_accuracy_final=0.75, heldout_chance=0.16)
    lines = closing_lines(report)
    assert lines[0] == ("test-then-train accuracy (each of 20 samples scored before it was trained): 0.800 over the "
                        "last 1 steps, 0.600 over the run; baseline (always the class most common so far) 0.300")
    assert lines[1].startswith("held-out accuracy (PLAID_TEST.ts, 537 samples): 0.750 at the first evaluation")
    assert not any(line.startswith("held-out accuracy (PLAID") for line in lines[2:])  # said once


def _vector_run(replayed: int | None = None) -> list[str]:
    """The closing lines of a run with a 2-value regression target, one of whose values the model gets wrong."""
    config = TrainerConfig(objective="regression", target_width=2, target_names=("big", "small"))
    sums = {"count": 10.0, "values": 20.0, "loss_sum": 1.0, "abs_error_sum": 1000.0, "squared_error_sum": 2e5,
            "baseline_abs_error_sum": 9000.0, "baseline_squared_error_sum": 1e7,
            "abs_error_sum_0": 999.0, "squared_error_sum_0": 199_999.0, "baseline_abs_error_sum_0": 8999.9,
            "baseline_squared_error_sum_0": 9_999_999.0, "abs_error_sum_1": 1.0, "squared_error_sum_1": 1.0,
            "baseline_abs_error_sum_1": 0.1, "baseline_squared_error_sum_1": 0.01}
    objective = objective_for_report(config)
    held = [Evaluation(job="j", step=2, dataset="d_TEST.npz", samples=10, accuracy=None, loss=0.1, seconds=0.1,
                       metrics=objective.summarise(sums))]
    figures = objective_figures([_fb(0, "0", sums)], held, ["0"], objective, window=5)
    assert heldout_rows(figures) == [("heldout_rmse_final", pytest.approx(100.0)),
                                     ("heldout_baseline_rmse_final", pytest.approx(math.sqrt(1e7 / 20)))]
    return closing_objective_lines(figures, "d_TEST.npz, 10 samples", replayed=replayed)


def test_a_vector_targets_values_are_reported_one_by_one_beside_the_pooled_figure() -> None:
    lines = _vector_run()
    assert lines[1] == ("  RMSE over the last 5 steps per target value (the baseline's after 'against'): big 141.421 "
                        "against 1000.000, small 0.316 against 0.0316")
    assert lines[2].startswith("held-out RMSE (d_TEST.npz, 10 samples): 100.000 at the first evaluation")
    assert lines[3].startswith("  held-out RMSE at the last evaluation per target value") and "small 0.316" in lines[3]


def test_a_dataset_replayed_in_a_loop_counts_scorings_not_samples() -> None:
    assert _vector_run(replayed=4)[0].startswith("test-then-train RMSE (10 scorings of 4 samples replayed in a loop, "
                                                 "each before the step that trained it)")
    assert _vector_run(replayed=40)[0].startswith("test-then-train RMSE (each of 10 samples scored before it was")


def test_the_summary_table_shows_held_out_figures_in_the_objectives_terms() -> None:
    objective = objective_for_report(TrainerConfig())
    held = [Evaluation(job="j", step=2, dataset="h", samples=5, accuracy=0.6, loss=0.7, seconds=0.1,
                       metrics={"accuracy": 0.6, "baseline_accuracy": 0.2, "loss": 0.7})]
    figures = objective_figures([], held, ["0"], objective, window=5)
    assert heldout_rows(figures) == [("heldout_accuracy_final", 0.6), ("heldout_baseline_accuracy_final", 0.2)]
    assert heldout_rows(objective_figures([], [], ["0"], objective, window=5)) == []  # nothing evaluated
