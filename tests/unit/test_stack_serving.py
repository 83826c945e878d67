"""`up` keeps each run's final model in <out>/model and says what it replaces of an earlier run's."""

from __future__ import annotations

from pathlib import Path

import torch

from streamtrain.config import TrainerConfig
from streamtrain.models import build_model
from streamtrain.stack.serving import forget_versions, keep_final_model
from streamtrain.versions import load_model, spec_for, write_version

CFG = TrainerConfig(num_features=2, num_classes=3, hidden_size=4, num_layers=1)


def _publish(versions: Path, job: str, *numbers: int) -> None:
    for n in numbers:
        write_version(versions, spec_for(CFG, job=job, version=n, step=10 * n, class_names=None, offsets={},
                                         metrics={"heldout_accuracy": 0.5}), build_model(CFG).state_dict())


def test_the_final_version_is_kept_and_an_earlier_runs_model_is_replaced_aloud(tmp_path: Path) -> None:
    said: list[str] = []
    versions, model = tmp_path / "versions", tmp_path / "model"
    _publish(versions, "first", 1, 2)
    assert keep_final_model(versions, model, said.append) == model
    assert load_model(model).spec.job == "first" and load_model(model).version == 2
    assert "load it with" in said[-1] and f"streamtrain.load_model('{model}')" in said[-1]

    said.clear()
    forget_versions(versions, said.append)  # the next run in the same --out
    assert not versions.exists() and "removing 2 model version(s) of the previous run" in said[0]
    assert load_model(model).spec.job == "first"  # the earlier run's final model is still there
    _publish(versions, "second", 1)
    keep_final_model(versions, model, said.append)
    assert "replacing the model of an earlier run" in said[-2] and "job first, version 2, step 20" in said[-2]
    assert load_model(model).spec.job == "second"


def test_a_run_without_versions_keeps_no_model_and_says_so(tmp_path: Path) -> None:
    said: list[str] = []
    assert keep_final_model(tmp_path / "versions", tmp_path / "model", said.append) is None
    assert "no model version was published" in said[0] and not (tmp_path / "model").exists()


def test_the_kept_models_line_shows_its_objectives_headline_figures(tmp_path: Path) -> None:
    said: list[str] = []
    regression = CFG.model_copy(update={"objective": "regression"})
    write_version(tmp_path / "versions", spec_for(regression, job="j", version=3, step=30, class_names=None, offsets={},
                                                  metrics={"heldout_rmse": 2.314, "heldout_baseline_rmse": 12.9,
                                                           "prequential_rmse": 2.6, "prequential_samples": 300.0}),
                  build_model(regression).state_dict())
    keep_final_model(tmp_path / "versions", tmp_path / "model", said.append)
    assert said[-1].startswith("model: version 3 (step 30, held-out rmse 2.314, test-then-train rmse 2.6) kept in")


def test_the_kept_models_line_says_which_head_seqflat_chose(tmp_path: Path) -> None:
    config = CFG.model_copy(update={"objective": "regression", "model": "seqflat", "series_points": 8})
    model = build_model(config)

    def kept_line(version: int, held_out: float) -> str:
        said: list[str] = []
        spec = spec_for(config, job="j", version=version, step=9, class_names=None, offsets={},
                        metrics={"heldout_rmse": held_out, **model.version_metrics()})
        write_version(tmp_path / "versions", spec, model.state_dict())
        keep_final_model(tmp_path / "versions", tmp_path / "model", said.append)
        return said[-1]

    with torch.no_grad():
        model.choice.copy_(torch.eye(len(model.choice))[0]), model.scored.fill_(256.0)  # the first: 0.05, alone
    assert kept_line(1, 1.5).startswith("model: version 1 (step 9, held-out rmse 1.5, whole-series MLP alone at "
                                        "dropout 0.05, chosen on 256 held-out scores) kept in")
    assert load_model(tmp_path / "model").spec.metrics["seqflat_dropout"] == 0.05
    with torch.no_grad():  # the ridge head (the last), fitted on 140 samples at a penalty of 6.3
        model.choice.copy_(torch.eye(len(model.choice))[-1]), model.ridge.penalty.fill_(6.3)
        model.ridge.fitted.fill_(140.0)
    assert kept_line(2, 1.0).startswith("model: version 2 (step 9, held-out rmse 1, whole-series ridge line (penalty "
                                        "6.3 by GCV, fitted on 140 samples), chosen on 256 held-out scores) kept in")
    assert "seqflat_dropout" not in load_model(tmp_path / "model").spec.metrics


def test_the_kept_models_line_says_whether_mlp_chose_its_line(tmp_path: Path) -> None:
    config = CFG.model_copy(update={"objective": "regression", "model": "mlp"})
    model, said = build_model(config), []
    for version, line in ((1, False), (2, True)):
        with torch.no_grad():
            model.choice.copy_(torch.eye(2)[int(line)]), model.scored.fill_(300.0), model.ridge.penalty.fill_(0.25)
            model.ridge.fitted.fill_(200.0)
        spec = spec_for(config, job="j", version=version, step=5, class_names=None, offsets={},
                        metrics={"heldout_rmse": 1.0, **model.version_metrics()})
        write_version(tmp_path / "versions", spec, model.state_dict())
        keep_final_model(tmp_path / "versions", tmp_path / "model", said.append)
    kept = [line for line in said if line.startswith("model: ")]
    assert ", MLP over a ridge line, chosen on 300 held-out scores) kept in" in kept[0], kept
    assert ", ridge line (penalty 0.25 by GCV, fitted on 200 samples), chosen on 300 held-out scores) kept in" in kept[
        1], kept
    assert load_model(tmp_path / "model").spec.metrics["mlp_ridge"] == 1.0


def test_a_device_has_a_backlog_while_seconds_of_its_stream_wait() -> None:
    from streamtrain.stack.serving import backlog_from_series

    # Device 0 produces 9/s (25x in a burst); its lag is what its steps saw: a few records, then hundreds.
    series = {"t0_ms": 1_000_000, "rates": {"devices": {"0": {"produced_per_s": [9.0] * 20 + [225.0] * 6}}},
              "devices": {"0": {"t": [1.0, 5.0, 21.0, 24.0, 30.0, 31.0], "lag": [2, 11, 3, 540, 800, 12]}}}
    had = backlog_from_series(series)
    assert [had("0", 1_000_000 + s * 1000) for s in (0.5, 4.0, 20.0, 22.0, 29.0, 30.5)] == [
        False, False, False, True, True, False]
    assert not had("1", 1_023_000)  # a device the series does not know: no backlog known
