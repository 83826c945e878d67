"""`bench convergence` end to end with tiny sizes: real gloo ranks, the trainer's hook, the JSON and plot."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamtrain.benchmarks.convergence import (
    AGGREGATIONS,
    ConvergenceResult,
    ConvergenceSetup,
    analyse,
    run_convergence,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # ~15-30 s: three process groups start torch


def test_weighted_matches_sgd_and_plain_does_not(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    setup = ConvergenceSetup(world=2, shares=(0.8, 0.2), classes=4, labels_per_device=2, steps=8, batch_min=4,
                             batch_max=16, heldout=60, hidden_size=8, idle_probability=0.3, target_accuracy=0.3,
                             smooth_steps=1, signal=0.5)
    doc = run_convergence(setup, tmp_path)
    printed = capfd.readouterr().out  # rank 0 of each cell prints its progress (every 25th step and the last)

    assert ConvergenceResult.load(tmp_path / "convergence.json") == doc
    assert (tmp_path / "convergence.png").stat().st_size > 1000
    cells = analyse(setup, doc.curves)
    assert list(cells) == list(AGGREGATIONS)
    for name in AGGREGATIONS:
        assert f"{name:<8} step {setup.steps:>4}/{setup.steps}:" in printed
        curve = doc.curves[name]
        assert curve.step == list(range(1, setup.steps + 1))
        assert curve.samples == doc.curves["sgd"].samples  # the same samples in the same order
        assert curve.samples[-1] == int(setup.counts().sum())
    # The hook's weighting is SGD on the union up to float32 rounding; plain averaging is not.
    assert doc.weighted_vs_sgd_max_param_diff < 1e-5
    assert doc.plain_vs_sgd_max_param_diff > 1e-3
    weighted, sgd = cells["weighted"], cells["sgd"]
    assert weighted.final_accuracy == pytest.approx(sgd.final_accuracy, abs=0.02)
