"""A forecast answers in the series' own units, though the default packing scales a series above
`trainer.max_input_abs` down for the model: metric sums, `predict` and an exported graph."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from streamtrain.config import TrainerConfig
from streamtrain.models import build_model
from streamtrain.models.batching import collate_for_prediction, collate_packed
from streamtrain.objectives import build_objective
from streamtrain.versions import load_model, spec_for, write_version
from streamtrain.wire import Sample

HORIZON = 3
CFG = TrainerConfig(model="seq", objective="forecast", num_features=1, horizon=HORIZON, hidden_size=8,
                    num_layers=1, max_input_abs=100.0, precision="float64")


def _series() -> list[np.ndarray]:
    """Series far above the bound (100 + 500 sin; a level of 10,000) beside one within it."""
    t = np.arange(40, dtype=np.float64)
    return [(100 + 500 * np.sin(t / 3))[:, None], (10_000 + 30 * np.cos(t[:25] / 2))[:, None],
            (5 + np.sin(t[:12]))[:, None]]


def _samples(series: list[np.ndarray]) -> list[Sample]:
    return [Sample.from_array("d", i, s) for i, s in enumerate(series)]


def _zero_model(cfg: TrainerConfig) -> torch.nn.Module:
    """A model whose output is 0 for any input: the forecast is the last value."""
    model = build_model(cfg)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    return model


def _version(tmp_path: Path, model: torch.nn.Module, cfg: TrainerConfig = CFG) -> Path:
    spec = spec_for(cfg, job="job", version=1, step=1, class_names=None, offsets={"0": 1}, metrics={})
    write_version(tmp_path, spec, model.state_dict())
    return tmp_path


def test_the_batch_carries_each_samples_bound_factor() -> None:
    series = _series()
    batch = collate_packed(_samples(series), CFG)
    factors = batch.bound_factors
    assert factors is not None and factors.shape == (3,) and factors.dtype == batch.values.dtype
    assert factors.tolist()[:2] == pytest.approx([100 / np.abs(s).max() for s in series[:2]])
    assert factors[2].item() == 1.0  # within the bound: not scaled
    assert bool(batch.to(torch.device("cpu")).bound_factors.eq(factors).all())


def test_a_zero_output_forecasts_the_last_value_in_the_series_own_units() -> None:
    series = _series()
    objective = build_objective(CFG)
    batch = collate_packed(_samples(series), CFG)
    zero = torch.zeros(len(series), HORIZON, dtype=torch.float64)
    last = [s[-HORIZON - 1, 0] for s in series]  # the input's last frame: the future is held back
    forecast = objective.forecast(zero, batch)
    assert forecast[:, :, 0].tolist() == [pytest.approx([v] * HORIZON) for v in last]
    assert objective.predict(zero, batch).values[:, 0, 0].tolist() == pytest.approx(last)


def test_the_metrics_are_in_the_series_own_units() -> None:
    series = _series()
    objective = build_objective(CFG)
    batch = collate_packed(_samples(series), CFG)
    errors = np.concatenate([s[-HORIZON:, 0] - s[-HORIZON - 1, 0] for s in series])
    mae, rmse = float(np.abs(errors).mean()), float(np.sqrt((errors ** 2).mean()))
    assert mae > 100  # far from what the scaled series would give
    zero = torch.zeros(len(series), HORIZON, dtype=torch.float64)
    metrics = objective.summarise({k: float(v) for k, v in objective.metric_sums(zero, batch).items()})
    assert metrics["baseline_mae"] == pytest.approx(mae) and metrics["mae"] == pytest.approx(mae)
    assert metrics["baseline_rmse"] == pytest.approx(rmse) and metrics["rmse"] == pytest.approx(rmse)


def test_the_loss_stays_in_the_models_scale_free_units() -> None:
    """Scaling a series above the bound by 10 changes neither its loss nor what the model sees."""
    series = _series()[:2]
    objective = build_objective(CFG)
    outputs = torch.linspace(-1, 1, 2 * HORIZON, dtype=torch.float64).reshape(2, HORIZON)
    batch, tenfold = (collate_packed(_samples([s * k for s in series]), CFG) for k in (1, 10))
    torch.testing.assert_close(tenfold.values, batch.values)
    torch.testing.assert_close(objective.losses(outputs, tenfold), objective.losses(outputs, batch))
    torch.testing.assert_close(objective.forecast(outputs, tenfold), 10 * objective.forecast(outputs, batch))


def test_a_plug_in_batch_without_bound_factors_is_read_as_unscaled() -> None:
    series = _series()[2:]
    batch = collate_packed(_samples(series), CFG)
    bare = type(batch)(batch.values, batch.segment_ids, batch.cu_seqlens, batch.lengths, batch.labels, batch.targets,
                       batch.horizon)
    assert bare.bound_factors is None and bare.to(torch.device("cpu")).bound_factors is None
    zero = torch.zeros(1, HORIZON, dtype=torch.float64)
    objective = build_objective(CFG)
    torch.testing.assert_close(objective.forecast(zero, bare), objective.forecast(zero, batch))


def test_predict_answers_in_the_series_own_units(tmp_path: Path) -> None:
    series = _series()
    loaded = load_model(_version(tmp_path, _zero_model(CFG)))
    values = loaded.predict([s.astype(np.float32) for s in series]).values
    assert values.shape == (3, HORIZON, 1)
    np.testing.assert_allclose(values[:, :, 0], np.repeat([[s[-1, 0]] for s in series], HORIZON, axis=1),
                               rtol=1e-6)
    # Any model: the bounded inputs of a series and of ten times it are the same, its forecasts ten times apart.
    torch.manual_seed(0)
    loaded = load_model(_version(tmp_path / "random", build_model(CFG)))
    once, tenfold = (loaded.predict([s * k for s in series[:2]]).values for k in (1.0, 10.0))
    np.testing.assert_allclose(tenfold, 10 * once, rtol=1e-6)
    assert collate_for_prediction(_samples(series), CFG).bound_factors is not None


@pytest.mark.parametrize(("fmt", "precision"), [("export", "float32"), ("export", "float64"),
                                                ("torchscript", "float64")])
def test_an_exported_graph_answers_in_the_series_own_units(tmp_path: Path, fmt: str, precision: str) -> None:
    from streamtrain.versions.export import export_model, graph_inputs

    cfg = CFG.model_copy(update={"precision": precision})
    dtype = torch.float32 if precision == "float32" else torch.float64
    series = _series()
    loaded = load_model(_version(tmp_path, _zero_model(cfg), cfg))
    path = str(export_model(loaded, tmp_path / "model", fmt))  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated, still read everywhere
        graph = torch.export.load(path).module() if fmt == "export" else torch.jit.load(path)
    with torch.no_grad():
        got = graph(*graph_inputs(series, dtype)).numpy()
    np.testing.assert_allclose(got[:, :, 0], np.repeat([[s[-1, 0]] for s in series], HORIZON, axis=1), rtol=1e-5)
    np.testing.assert_allclose(got, loaded.predict([s.astype(np.float32) for s in series]).values, rtol=1e-5)
