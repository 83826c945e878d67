"""`mlp`, the model for rows: for a regression with the dropout unset, the MLP beside a ridge line, the one that
scores lower on held-out rows kept; it beats the mean on a table whose features explain a few percent of the
target, where the MLP alone lost to it; a version of the MLP alone still loads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from replayed_training import trained_on

from streamtrain.config import TrainerConfig
from streamtrain.models import build_model, pack_samples
from streamtrain.models.tabular import TabularMLP, TabularWithLine
from streamtrain.wire import Sample


def _weak(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Rows of 10 features around 50 (so the inputs need standardising), three of which move the target by 0.15
    standard deviations each against noise of 1: a few percent of its variance."""
    x = 50.0 + 10.0 * rng.standard_normal((n, 1, 10))
    return x.astype(np.float32), 0.15 * (x[:, 0, :3].sum(axis=1) - 150.0) / 10.0 + rng.standard_normal(n)


@pytest.mark.timeout(120)
def test_the_default_for_rows_beats_the_mean_on_a_low_signal_regression(tmp_path: Path) -> None:
    # 200 rows to train on, 1,000 held out; this split's mean is 0.996 (the noise alone: 1.0), and the MLP alone
    # ended at 1.005, a ridge line fitted by GCV at 0.981.
    rmse, mean_rmse, model, metrics = trained_on(tmp_path, 2, (200, 1000), _weak)
    assert model == "mlp" and rmse < mean_rmse - 0.005, (rmse, mean_rmse, metrics)
    assert metrics["mlp_holdout_scored"] >= 256 and "mlp_holdout_loss_ridge" in metrics


def test_only_a_regression_or_forecast_with_the_dropout_unset_gets_the_line_and_an_mlp_version_still_loads() -> None:
    base = {"model": "mlp", "num_features": 3, "hidden_size": 8}
    assert isinstance(build_model(TrainerConfig(objective="regression", **base)), TabularWithLine)
    assert type(build_model(TrainerConfig(objective="regression", dropout=0.2, **base))) is TabularMLP
    assert type(build_model(TrainerConfig(objective="classification", num_classes=3, **base))) is TabularMLP
    old = build_model(TrainerConfig(objective="regression", dropout=0.2, **base))  # written before the line
    new = build_model(TrainerConfig(objective="regression", **base))
    new.load_state_dict(old.state_dict())
    assert not new.chosen_ridge and float(new.ridge.fitted) == 0
    rng = np.random.default_rng(0)
    batch = pack_samples([Sample.from_array("d", i, rng.standard_normal((1, 3)).astype(np.float32)) for i in
                          range(5)], 3, require_labels=False)
    old.eval(), new.eval()
    with torch.no_grad():
        torch.testing.assert_close(new(batch), old(batch))
