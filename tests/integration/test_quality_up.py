"""What `up --dataset` hands out on data no test here chose, end to end, as a user runs it.

A CSV whose features are a day number near 736,000, a fraction, a constant column and one missing cell: `up` fits
the inputs' shift and scale, chooses the MLP, leaves the bad row out by name, and hands out a model that beats the
mean by far through `load_model`, `serve` and the exported graph alike; every record accounted for. Series whose
target is set by two of their positions, on two ranks: `seqflat` chooses a lighter head than its default on the
first rank's held-out samples, says so, and the model and its exported graph read the target."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import streamtrain
from streamtrain.config import KafkaConfig
from streamtrain.datasets import load_dataset
from streamtrain.models.standardise import fit_input_scaling
from streamtrain.runtime.commands import CLI_MODULE, module_command
from streamtrain.versions.export import export_model, graph_inputs

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _table(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    day = 736_000 + rng.integers(0, 1_500, n).astype(np.float64)
    frac = rng.uniform(0, 1, n)
    y = 0.004 * (day - 736_750) + 3 * frac + rng.normal(0, 0.3, n)
    return np.stack([day, frac, np.full(n, 7.0)], axis=1), y


def _csv(path: Path, x: np.ndarray, y: np.ndarray, blank_row: int | None = None) -> None:
    rows = ["day,frac,const,Y"]
    for i, (r, t) in enumerate(zip(x, y, strict=True)):
        cells = [f"{v:.6f}" for v in r]
        if i == blank_row:
            cells[1] = ""
        rows.append(",".join([*cells, f"{t:.6f}"]))
    path.write_text("\n".join(rows) + "\n")


@pytest.mark.timeout(450)
def test_a_day_number_csv_is_standardised_in_up_and_applied_by_predict_serve_and_export(kafka_cfg: KafkaConfig,
                                                                                        tmp_path: Path) -> None:
    _csv(tmp_path / "days_TRAIN.csv", *_table(600, 0), blank_row=5)
    x_test, y_test = _table(200, 1)
    _csv(tmp_path / "days_TEST.csv", x_test, y_test)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMTRAIN_")}
    env["COLUMNS"] = "400"
    cmd = module_command(CLI_MODULE, "up", "--dataset", str(tmp_path / "days_TRAIN.csv"), "--devices", "2", "--rates",
                         "200,200", "--steps", "300", "--serve", "--drain-timeout", "60", "--broker", "external",
                         "--no-prometheus", "--no-live", "--out", str(tmp_path / "run"),
                         global_args=["--set", "producer.dataset.target_columns=Y"],
                         # the session's broker, topics of this test's own: a broker's start is no part of the check
                         sets={"kafka.bootstrap_servers": kafka_cfg.bootstrap_servers,
                               "kafka.topic_prefix": kafka_cfg.topic_prefix})
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    out = proc.stdout
    assert "model: mlp, chosen from the data's shape: every sample is one frame (tabular)" in out
    assert "inputs standardised per feature" in out and "feature 2 is constant: it enters the model as 0" in out
    assert "1 sample left out: feature 1 holds NaN" in out and "days_TRAIN.csv: sample 5" in out
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["samples_unaccounted"] == 0 and report["failures"] == [] and report["samples_trained"] > 0
    assert report["model_out"]["requests_answered"] > 0 and not report["model_out"]["requests_errors"]
    assert report["model_out"]["versions_served"] >= 1  # the gate let through versions that beat the mean

    fitted = fit_input_scaling(load_dataset(tmp_path / "days_TRAIN.csv", target_columns=("Y",)).samples)
    model = streamtrain.load_model(tmp_path / "run" / "model")
    settings = json.loads((model.path / "model.json").read_text())["model"]["settings"]
    assert settings["input_shift"] == list(fitted.shift) and settings["input_scale"] == list(fitted.scale)
    rows = [x_test[i: i + 1].astype(np.float32) for i in range(len(x_test))]
    predicted = model.predict(rows).values[:, 0]
    rmse, mean_rmse = float(np.sqrt(np.mean((predicted - y_test) ** 2))), float(np.std(y_test))
    assert rmse < 0.5 * mean_rmse, (rmse, mean_rmse)  # the day number reached the model: far better than the mean
    assert model.spec.metrics["heldout_rmse"] < model.spec.metrics["heldout_baseline_rmse"]
    graph = torch.export.load(export_model(model, tmp_path / "days.pt2")).module()
    with torch.no_grad():
        exported = graph(*graph_inputs(rows)).numpy()[:, 0]
    np.testing.assert_allclose(exported, predicted, rtol=1e-4, atol=1e-3)


def _positions(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Series of 24 frames around 100 whose target is what frame 5 holds against frame 17 (noise of 0.1)."""
    x = 100.0 + rng.standard_normal((n, 24, 1))
    return x.astype(np.float32), x[:, 5, 0] - x[:, 17, 0] + 0.1 * rng.standard_normal(n)


@pytest.mark.timeout(450)
def test_seqflat_chooses_its_ridge_line_fitted_to_both_ranks_samples_and_hands_it_out(kafka_cfg: KafkaConfig,
                                                                                       tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    for split, n in (("TRAIN", 160), ("TEST", 200)):
        x, y = _positions(n, rng)
        np.savez(tmp_path / f"pos_{split}.npz", x=x, y=y[:, None])
    held = np.load(tmp_path / "pos_TEST.npz")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMTRAIN_")}
    env["COLUMNS"] = "400"
    cmd = module_command(CLI_MODULE, "up", "--dataset", str(tmp_path / "pos_TRAIN.npz"), "--devices", "2", "--rates",
                         "400,400", "--steps", "400", "--drain-timeout", "60", "--broker", "external",
                         "--no-prometheus", "--no-live", "--out", str(tmp_path / "run"),
                         sets={"kafka.bootstrap_servers": kafka_cfg.bootstrap_servers,
                               "kafka.topic_prefix": kafka_cfg.topic_prefix})
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    model = streamtrain.load_model(tmp_path / "run" / "model")
    metrics = model.spec.metrics
    # Two ranks: rank 0's device held samples out and scored the heads; the line (the target is one) won by far,
    # fitted to more samples than either device has (80 each): both ranks' sums.
    assert metrics["seqflat_ridge"] == 1.0 and metrics["seqflat_with_seq"] == 0.0, metrics
    assert metrics["seqflat_holdout_scored"] >= 32 and metrics["seqflat_ridge_fitted"] > 100, metrics
    assert "whole-series ridge line (penalty " in proc.stdout
    rows = list(held["x"])
    predicted = model.predict(rows).values[:, 0]
    rmse, mean_rmse = float(np.sqrt(np.mean((predicted - held["y"][:, 0]) ** 2))), float(np.std(held["y"]))
    assert rmse < 0.2 * mean_rmse, (rmse, mean_rmse)  # the noise is 0.07x
    graph = torch.export.load(export_model(model, tmp_path / "pos.pt2")).module()
    with torch.no_grad():
        exported = graph(*graph_inputs(rows)).numpy()[:, 0]
    np.testing.assert_allclose(exported, predicted, rtol=1e-4, atol=1e-3)
