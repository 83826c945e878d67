"""Input standardisation: fitted from the data, carried in model.json, applied by predict and the exported graph,
estimated online for devices fed from outside; the model chosen by the data's shape; bad feature columns."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

import streamtrain
from streamtrain.config import StreamtrainConfig, TrainerConfig
from streamtrain.datasets import load_dataset
from streamtrain.models import build_collate, build_model
from streamtrain.models.defaults import default_model
from streamtrain.models.standardise import InputEstimate, fit_input_scaling
from streamtrain.stack.replay import resolve_replay
from streamtrain.versions import spec_for, write_version
from streamtrain.versions.export import export_model, graph_inputs
from streamtrain.wire import Sample


def _table(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A day number near 736,000, a fraction, a constant column; the target follows the first two."""
    rng = np.random.default_rng(seed)
    day = 736_000 + rng.integers(0, 2_000, n).astype(np.float64)
    frac = rng.uniform(0, 1, n)
    x = np.stack([day, frac, np.full(n, 7.0)], axis=1)
    y = 0.01 * (day - 737_000) + 5 * frac + rng.normal(0, 0.2, n)
    return x, y


def _write_csv(path: Path, x: np.ndarray, y: np.ndarray, blank: tuple[int, int] | None = None) -> None:
    lines = ["day,frac,const,Y"]
    for i, (row, target) in enumerate(zip(x, y, strict=True)):
        cells = [repr(float(v)) for v in row]
        if blank is not None and blank[0] == i:
            cells[blank[1]] = ""
        lines.append(",".join([*cells, repr(float(target))]))
    path.write_text("\n".join(lines) + "\n")


def test_the_fit_is_robust_to_a_huge_column_a_constant_one_and_missing_values() -> None:
    x, _ = _table(500)
    x[3, 1] = np.nan
    scaling = fit_input_scaling([x[i: i + 1] for i in range(len(x))])
    assert abs(scaling.shift[0] - 737_000) < 100 and 300 < scaling.scale[0] < 1_000
    assert 0.3 < scaling.shift[1] < 0.7 and 0.2 < scaling.scale[1] < 0.5
    assert scaling.shift[2] == 7.0 and scaling.scale[2] == 1.0  # constant: enters the model as 0
    assert "feature 2 is constant: it enters the model as 0" in scaling.notes
    assert any("far from 0" in n and "feature 0 near 7" in n for n in scaling.notes)


def test_settings_are_validated_with_the_setting_named() -> None:
    good = TrainerConfig(num_features=2, input_shift="1,2", input_scale="[3, 4]")
    assert good.input_shift == (1.0, 2.0) and good.input_scale == (3.0, 4.0)
    for bad, message in (({"input_shift": (1.0,), "input_scale": (1.0,)}, "input_shift has 1 values but "
                          "num_features is 2"),
                         ({"input_shift": (1.0, 2.0), "input_scale": (1.0, 0.0)}, "feature 1: 0.0 is not finite "
                          "and above 0"),
                         ({"input_shift": (1.0, 2.0)}, "set input_shift and input_scale together"),
                         ({"input_shift": "1,x", "input_scale": "1,1"}, "'x' in '1,x' is not a number")):
        with pytest.raises(ValidationError, match=message):
            TrainerConfig(num_features=2, **bad)


def test_the_default_model_follows_the_data_shape() -> None:
    assert default_model(np.ones(10, dtype=np.int64)).name == "mlp"
    choice = default_model(np.array([20, 40, 1]))
    assert choice.name == "seq" and "series of 1 to 40 frames" in choice.why


def test_up_fits_the_inputs_chooses_the_model_and_reports_a_missing_feature(tmp_path: Path) -> None:
    x, y = _table(200)
    _write_csv(tmp_path / "t_TRAIN.csv", x, y, blank=(5, 1))
    _write_csv(tmp_path / "t_TEST.csv", *_table(50, seed=1))
    cfg = StreamtrainConfig.model_validate({"producer": {"dataset": {"target_columns": ["Y"]}}})
    replay = resolve_replay(str(tmp_path / "t_TRAIN.csv"), cfg, devices=2)
    assert replay.settings["trainer.model"] == "mlp" and "one frame" in replay.model_why
    assert (replay.settings["trainer.optimizer"], replay.settings["trainer.lr"]) == ("adamw", 0.001)
    assert len(replay.settings["trainer.input_shift"]) == 3 and replay.settings["trainer.input_scale"][2] == 1.0
    assert replay.samples == 199 and any("t_TRAIN.csv: sample 5" in w and "feature 1 holds NaN" in w
                                         for w in replay.warnings)
    assert any("constant" in n for n in replay.input_notes)
    off = StreamtrainConfig.model_validate({"producer": {"dataset": {"target_columns": ["Y"]}},
                                            "trainer": {"input_standardise": False, "model": "conv", "lr": 0.1}})
    plain = resolve_replay(str(tmp_path / "t_TRAIN.csv"), off)
    assert not {"trainer.input_shift", "trainer.model", "trainer.optimizer", "trainer.lr"} & set(plain.settings)
    assert "not standardised" in plain.input_notes[0] and "set by trainer.model" in plain.model_why


def _fitted(tmp_path: Path) -> tuple[TrainerConfig, torch.nn.Module, list[np.ndarray], np.ndarray]:
    """A regression MLP trained on the table with standardised inputs, its config, and held-out rows."""
    x, y = _table(400)
    scaling = fit_input_scaling([x[i: i + 1] for i in range(len(x))])
    cfg = TrainerConfig(model="mlp", objective="regression", num_features=3, hidden_size=16,
                        target_shift=float(y.mean()), target_scale=float(y.std()), input_shift=scaling.shift,
                        input_scale=scaling.scale)
    model, collate = build_model(cfg), build_collate(cfg)
    samples = [Sample.from_array("0", i, x[i: i + 1].astype(np.float32), target=[float(y[i])]) for i in range(400)]
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(300):
        batch = collate(samples[(step % 8) * 50: (step % 8 + 1) * 50], cfg)
        optimizer.zero_grad()
        F.mse_loss(model(batch), (batch.targets - cfg.target_shift) / cfg.target_scale).backward()
        optimizer.step()
    hx, hy = _table(60, seed=2)
    return cfg, model.eval(), [hx[i: i + 1].astype(np.float32) for i in range(60)], hy


@pytest.mark.parametrize("fmt", ["export", "onnx"])
def test_standardisation_round_trips_through_model_json_predict_and_the_exported_graph(tmp_path: Path,
                                                                                        fmt: str) -> None:
    cfg, model, rows, truth = _fitted(tmp_path)
    path = write_version(tmp_path / "m", spec_for(cfg, job="j", version=1, step=1, class_names=None, offsets={},
                                                  metrics={}), model.state_dict())
    doc = json.loads((path / "model.json").read_text())
    assert doc["model"]["settings"]["input_shift"] == list(cfg.input_shift)
    loaded = streamtrain.load_model(tmp_path / "m")
    predicted = loaded.predict(rows).values[:, 0]
    rmse, mean_rmse = float(np.sqrt(np.mean((predicted - truth) ** 2))), float(truth.std())
    assert rmse < 0.3 * mean_rmse  # learned from the day number: the standardised column reached the model
    out = export_model(loaded, tmp_path / f"g{'.pt2' if fmt == 'export' else '.onnx'}", fmt)  # type: ignore[arg-type]
    values, lengths = graph_inputs(rows)
    if fmt == "onnx":
        import onnx
        from onnx.reference import ReferenceEvaluator

        graph = np.asarray(ReferenceEvaluator(onnx.load(out)).run(None, {"values": values.numpy(),
                                                                          "lengths": lengths.numpy()})[0])
    else:
        with torch.no_grad():
            graph = torch.export.load(out).module()(values, lengths).numpy()
    np.testing.assert_allclose(graph[:, 0], predicted, rtol=1e-4, atol=1e-3)


def test_the_online_estimate_warms_up_then_freezes_the_same_on_every_rank() -> None:
    cfg = TrainerConfig(num_features=2, input_warmup_samples=300)
    rng = np.random.default_rng(0)
    ranks = [InputEstimate(cfg), InputEstimate(cfg)]
    batches = [[Sample.from_array("0", i, (rng.normal(0, 1, (3, 2)) * [5, 0.1] + [736_000, 2]).astype(np.float32))
                for i in range(40)] for _ in range(20)]
    config = cfg
    for step in range(0, 20, 2):  # two ranks, each its own batch; the reduce sums both ranks' moments

        def reduce(local: np.ndarray, _step: int = step) -> np.ndarray:
            ranks[1].reference = ranks[0].reference  # the other rank took the same reference from the same sum
            return local + ranks[1]._local(batches[_step + 1])

        config = ranks[0].update(batches[step], config, reduce)
    assert ranks[0].frozen and ranks[0].samples == 320  # 300 reached after the 4th step of 80: frozen at 320
    shift, scale = config.input_shift, config.input_scale
    assert abs(shift[0] - 736_000) < 2 and abs(scale[0] - 5) < 0.5 and abs(shift[1] - 2) < 0.05
    assert ranks[0].update(batches[0], config, lambda a: a) is config  # frozen: unchanged, no collective


def test_a_feature_column_of_missing_values_leaves_its_samples_out_named(tmp_path: Path) -> None:
    x, y = _table(10)
    _write_csv(tmp_path / "d.csv", x, y, blank=(2, 0))
    data = load_dataset(tmp_path / "d.csv", target_columns=("Y",))
    assert len(data) == 9 and data.skipped_samples[0].index == 2 and "feature 0" in data.skipped_samples[0].reason


def test_a_checkpoint_keeps_the_online_estimate_so_a_resumed_group_keeps_its_scale(tmp_path: Path) -> None:
    from streamtrain.trainer.checkpoint import Checkpoint, load_checkpoint, save_checkpoint

    model = build_model(TrainerConfig(num_features=2, num_classes=2, hidden_size=4, num_layers=1))
    save_checkpoint(tmp_path, Checkpoint(step=3, model=model.state_dict(), optimizer={}, inputs=[[736_000.5, 2.0],
                                                                                                   [5.0, 0.1]]))
    loaded = load_checkpoint(tmp_path)
    assert loaded is not None and loaded.inputs == [[736_000.5, 2.0], [5.0, 0.1]]
