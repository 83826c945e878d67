"""A published version rebuilds the model it was trained as: every setting a built-in model, its collate or its
objective reads is kept in model.json (`MODEL_SETTINGS`), or is named here as one that only shapes training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

from streamtrain.config import TrainerConfig
from streamtrain.models import build_collate, build_model
from streamtrain.models.batching import collate_for_prediction
from streamtrain.models.plugins import probe_samples
from streamtrain.objectives import build_objective
from streamtrain.versions import MODEL_SETTINGS, load_model, spec_for, write_version
from streamtrain.wire import Sample

#: Settings the model's code reads that do not change what a version predicts, and why.
TRAINING_ONLY = {
    "input_warmup_samples": "how many samples the online input estimate waits for; the estimate itself is kept",
    "target_names": "the names the metrics are reported under while training",
    "ema_decay": "which weights are handed out; the handed-out weights are what a version holds",
}


class _Recording(TrainerConfig):
    """A TrainerConfig that notes every field read from it (copies included)."""

    read: ClassVar[set[str]] = set()

    def __getattribute__(self, name: str) -> Any:
        if name in type(self).model_fields:
            _Recording.read.add(name)
        return super().__getattribute__(name)


SHAPES = [("conv", "classification"), ("seq", "classification"), ("seqflat", "regression"), ("mlp", "regression"),
          ("seq", "forecast"), ("conv", "multilabel"), ("seqflat", "classification")]


@pytest.mark.parametrize(("model", "objective"), SHAPES)
def test_every_setting_a_built_in_model_reads_is_kept_in_the_version(model: str, objective: str) -> None:
    cfg = _Recording(model=model, objective=objective, num_features=2, num_classes=3, hidden_size=8, num_layers=1,
                     target_width=2, horizon=2, num_tags=3, series_points=12)
    _Recording.read = set()
    objective_ = build_objective(cfg)
    net = build_model(cfg, objective_.output_width())
    batch = build_collate(cfg)(probe_samples(cfg, sizes=(12, 12, 12), objective=objective_), cfg)
    objective_.losses(net(batch), batch)
    objective_.predicted(net(batch), batch)
    unkept = sorted(_Recording.read - set(MODEL_SETTINGS) - set(TRAINING_ONLY))
    assert not unkept, f"{model}/{objective} reads {unkept}: keep them in MODEL_SETTINGS or name why not here"


def _published(tmp_path: Path, cfg: TrainerConfig) -> tuple[torch.nn.Module, list[np.ndarray]]:
    torch.manual_seed(1)
    net = build_model(cfg)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_()  # away from the seeded initialisation: a rebuilt model must take these weights
    net.eval()
    spec = spec_for(cfg, job="job", version=1, step=3, class_names=None, offsets={}, metrics={})
    write_version(tmp_path, spec, net.state_dict())
    rng = np.random.default_rng(0)
    return net, [rng.standard_normal((25, cfg.num_features)).astype(np.float32) for _ in range(4)]


def _expected(net: torch.nn.Module, cfg: TrainerConfig, arrays: list[np.ndarray]) -> np.ndarray:
    """What the published model itself predicts for `arrays`."""
    batch = collate_for_prediction([Sample.from_array("0", i, a) for i, a in enumerate(arrays)], cfg)
    with torch.no_grad():
        return build_objective(cfg).predicted(net(batch), batch).numpy()


def _values(values: np.ndarray | None) -> np.ndarray:
    assert values is not None
    return values


@pytest.mark.parametrize("points", [25, 100])
def test_a_whole_series_model_of_any_points_loads_and_predicts_as_it_was_trained(tmp_path: Path,
                                                                                 points: int) -> None:
    cfg = TrainerConfig(model="seqflat", objective="regression", num_features=2, hidden_size=8, num_layers=1,
                        target_width=1, series_points=points, dropout=0.2)
    net, arrays = _published(tmp_path, cfg)
    loaded = load_model(tmp_path)
    assert loaded.config.series_points == points and loaded.config.dropout == 0.2
    np.testing.assert_allclose(_values(loaded.predict(arrays).values), _expected(net, cfg, arrays),
                               rtol=1e-5, atol=1e-6)


def test_a_whole_series_version_written_before_its_points_were_kept_still_loads(tmp_path: Path) -> None:
    cfg = TrainerConfig(model="seqflat", objective="regression", num_features=2, hidden_size=8, num_layers=1,
                        target_width=1, series_points=25)
    net, arrays = _published(tmp_path, cfg)
    spec_file = next(tmp_path.rglob("model.json"))
    document = json.loads(spec_file.read_text())
    del document["model"]["settings"]["series_points"], document["model"]["settings"]["dropout"]
    spec_file.write_text(json.dumps(document))
    loaded = load_model(tmp_path)
    assert loaded.config.series_points == 25
    np.testing.assert_allclose(_values(loaded.predict(arrays).values), _expected(net, cfg, arrays),
                               rtol=1e-5, atol=1e-6)
