"""Model versions: atomic writes, keep-K, checks on read, load_model on a trained model, weights-only checkpoints."""

from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import streamtrain
from streamtrain.config import TrainerConfig
from streamtrain.models import build_collate, build_model
from streamtrain.synthetic import synthetic_samples
from streamtrain.trainer.checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from streamtrain.versions import (
    ModelSpec,
    VersionError,
    load_model,
    read_version,
    spec_for,
    version_dirs,
    write_version,
)

CFG = TrainerConfig(num_features=4, num_classes=3, hidden_size=16, num_layers=1)
NAMES = ("fan", "heater", "lamp")


def _spec(version: int, cfg: TrainerConfig = CFG, **metrics: float) -> ModelSpec:
    return spec_for(cfg, job="job", version=version, step=10 * version, class_names=NAMES, offsets={"0": version},
                    metrics=metrics)


def _trained(cfg: TrainerConfig = CFG, steps: int = 60) -> torch.nn.Module:
    """The conv model after a few SGD steps on the synthetic task (strong signal: it learns in a few steps)."""
    model = build_model(cfg)
    collate = build_collate(cfg)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        batch = collate(synthetic_samples([4, 9, 16, 25] * 4, cfg.num_features, cfg.num_classes, seed=step,
                                          signal=2.0), cfg)
        optimizer.zero_grad()
        F.cross_entropy(model(batch), batch.labels).backward()
        optimizer.step()
    return model.eval()


def test_a_trained_model_round_trips_and_predicts_as_it_scored(tmp_path: Path) -> None:
    model = _trained()
    held_out = synthetic_samples([3, 7, 12, 30, 5, 8] * 10, CFG.num_features, CFG.num_classes, seed=999, signal=2.0)
    with torch.no_grad():
        expected = model(build_collate(CFG)(held_out, CFG)).argmax(dim=1).numpy()
    labels = np.array([s.label for s in held_out])
    accuracy = float((expected == labels).mean())
    assert accuracy > 0.8  # the model learned something: a test of predictions worth making
    write_version(tmp_path, _spec(1, heldout_accuracy=accuracy), model.state_dict())

    loaded = streamtrain.load_model(tmp_path)  # the model directory: its latest version
    result = loaded.predict([s.array() for s in held_out])
    assert loaded.version == 1 and loaded.classes == NAMES and loaded.spec.metrics["heldout_accuracy"] == accuracy
    np.testing.assert_array_equal(result.labels, expected)
    assert result.names == tuple(NAMES[i] for i in expected)
    np.testing.assert_allclose(result.probabilities.sum(axis=1), 1.0)
    one = loaded.predict(held_out[0].array().astype(np.float64))  # one 2-D array is one sample, any wire dtype
    assert len(one) == 1 and one.labels[0] == expected[0]


def test_predict_names_the_sample_of_the_wrong_shape(tmp_path: Path) -> None:
    write_version(tmp_path, _spec(1), build_model(CFG).state_dict())
    with pytest.raises(ValueError, match=r"sample 1: shape \[5, 3\] is not \(size, 4\)"):
        load_model(tmp_path).predict([np.zeros((5, 4)), np.zeros((5, 3))])


def test_predict_refuses_what_serve_refuses_naming_the_sample_and_the_reason(tmp_path: Path) -> None:
    write_version(tmp_path, _spec(1), _trained(steps=5).state_dict())
    model = load_model(tmp_path)
    good = np.ones((6, 4), np.float32)
    poisoned = good.copy()
    poisoned[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"^sample 1: payload holds NaN or infinity \(invalid-sample\)"):
        model.predict([good, poisoned, good])
    with pytest.raises(ValueError, match=r"^sample 0: .*size 0 < 1 \(invalid-sample\)"):
        model.predict([np.zeros((0, 4), np.float32)])
    with pytest.raises(ValueError, match=r"^sample 0: .*infinity \(invalid-sample\)"):
        model.predict(np.full((3, 4), np.inf))
    assert np.isfinite(model.predict([good, good]).probabilities).all()
    sample = streamtrain.versions.predictor.Sample.from_array("d", 0, poisoned)
    assert model.problem(sample) == ("invalid-sample", "payload holds NaN or infinity")  # serve's rule, the same


def test_a_version_is_found_by_number_or_refused_never_swapped_for_another(tmp_path: Path) -> None:
    model = build_model(CFG)
    for version in (51, 52, 55):
        write_version(tmp_path, _spec(version), model.state_dict())
    assert load_model(tmp_path, version="52").version == 52  # a number given as text
    with pytest.raises(VersionError, match=r"no version 3 \(there are 51, 52, 55\)"):
        load_model(tmp_path, version=3)
    single = tmp_path / "v000055"  # a version's own directory (`up`'s <out>/model is one)
    assert load_model(single, version=55).version == 55 and load_model(single).version == 55
    for asked in (3, "3"):
        with pytest.raises(VersionError, match=r"v000055 is version 55 .*not version 3: .*model directory"):
            load_model(single, version=asked)
    with pytest.raises(VersionError, match=r"version 'newest': give 'latest' or a version number"):
        load_model(tmp_path, version="newest")
    assert load_model(single / "model.json").version == 55  # the file of a version names its directory
    assert load_model(single / "model.safetensors").version == 55


def test_a_model_without_classes_has_none(tmp_path: Path) -> None:
    cfg = CFG.model_copy(update={"objective": "regression", "target_width": 2})
    spec = spec_for(cfg, job="job", version=1, step=1, class_names=NAMES, offsets={}, metrics={})
    path = write_version(tmp_path, spec, build_model(cfg).state_dict())
    doc = json.loads((path / "model.json").read_text())
    assert doc["classes"] == {"count": 0, "names": None} and "tags" not in doc
    loaded = load_model(tmp_path)
    assert loaded.classes is None and loaded.predict([np.ones((5, 4))]).labels is None
    tagged = CFG.model_copy(update={"objective": "multilabel", "num_tags": 2})
    spec = spec_for(tagged, job="job", version=2, step=1, class_names=None, offsets={}, metrics={},
                    tag_names=("door", "window"))
    doc = json.loads(write_version(tmp_path, spec, build_model(tagged).state_dict()).joinpath("model.json").read_text())
    assert doc["classes"]["count"] == 0 and doc["tags"] == {"count": 2, "names": ["door", "window"]}
    assert load_model(tmp_path).tags == ("door", "window") and load_model(tmp_path).classes is None
    assert load_model(tmp_path, version=1).tags is None


def test_versions_are_numbered_kept_to_k_and_read_by_number(tmp_path: Path) -> None:
    model = build_model(CFG)
    for version in range(1, 6):
        write_version(tmp_path, _spec(version), model.state_dict(), keep=3)
    assert [n for n, _ in version_dirs(tmp_path)] == [3, 4, 5]
    assert load_model(tmp_path).version == 5
    assert load_model(tmp_path, version=4).spec.step == 40
    with pytest.raises(VersionError, match=r"no version 1 \(there are 3, 4, 5\)"):
        load_model(tmp_path, version=1)
    with pytest.raises(VersionError, match="was written before"):
        write_version(tmp_path, _spec(5), model.state_dict())


def test_a_crash_mid_write_leaves_no_version_and_the_next_write_cleans_up(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    model = build_model(CFG)
    write_version(tmp_path, _spec(1), model.state_dict())

    def crash(*_args: object) -> None:
        raise OSError("power cut")

    with monkeypatch.context() as patch:
        patch.setattr(os, "rename", crash)
        with pytest.raises(OSError, match="power cut"):
            write_version(tmp_path, _spec(2), model.state_dict())
    assert [n for n, _ in version_dirs(tmp_path)] == [1] and load_model(tmp_path).version == 1
    crashed = tmp_path / ".v000002-crashed"  # what a writer killed before its rename leaves, an hour ago
    crashed.mkdir()
    os.utime(crashed, (time.time() - 7200, time.time() - 7200))
    busy = tmp_path / ".v000007-busy"  # another writer's work in progress: not ours to remove
    busy.mkdir()
    write_version(tmp_path, _spec(2), model.state_dict())
    assert sorted(p.name for p in tmp_path.iterdir()) == [".v000007-busy", "v000001", "v000002"]


def test_non_finite_weights_are_never_written(tmp_path: Path) -> None:
    state = build_model(CFG).state_dict()
    state["head.bias"] = torch.full_like(state["head.bias"], float("nan"))
    with pytest.raises(VersionError, match=r"head\.bias"):
        write_version(tmp_path, _spec(1), state)
    assert version_dirs(tmp_path) == []


def test_corrupt_or_missing_files_are_named(tmp_path: Path) -> None:
    path = write_version(tmp_path, _spec(1), build_model(CFG).state_dict())
    weights = path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(VersionError, match=r"model\.safetensors: its SHA-256 .*weights\.sha256"):
        load_model(path)
    weights.unlink()
    with pytest.raises(VersionError, match=r"model\.safetensors: missing"):
        read_version(path)
    (path / "model.json").write_text("{not json")
    with pytest.raises(VersionError, match=r"model\.json: not valid JSON"):
        load_model(path)
    with pytest.raises(VersionError, match="no such file"):
        load_model(tmp_path / "nowhere")


def test_a_model_json_field_that_does_not_fit_is_named(tmp_path: Path) -> None:
    path = write_version(tmp_path, _spec(1), build_model(CFG).state_dict())
    doc = json.loads((path / "model.json").read_text())
    doc["classes"]["names"] = ["fan"]
    (path / "model.json").write_text(json.dumps(doc))
    with pytest.raises(VersionError, match=r"classes\.names has 1 names for 3 classes"):
        load_model(path)
    doc["classes"]["names"] = None
    doc["model"]["settings"]["hidden_size"] = 32  # weights of 16 channels, a model of 32
    (path / "model.json").write_text(json.dumps(doc))
    with pytest.raises(VersionError, match=r"weights do not fit the model model\.json describes"):
        load_model(path)
    doc["model"]["settings"]["kernel_size"] = 4
    (path / "model.json").write_text(json.dumps(doc))
    with pytest.raises(VersionError, match=r"model\.settings\.kernel_size"):
        load_model(path)
    del doc["lineage"]
    (path / "model.json").write_text(json.dumps(doc))
    with pytest.raises(VersionError, match=r"field lineage\.offsets is missing"):
        load_model(path)


def test_checkpoints_load_weights_only(tmp_path: Path) -> None:
    model = build_model(CFG)
    optimizer = torch.optim.AdamW(model.parameters())
    save_checkpoint(tmp_path, Checkpoint(step=7, model=model.state_dict(), optimizer=optimizer.state_dict(),
                                         offsets={"0": 12}, done_ahead={"0": [(14, 16)]}))
    loaded = load_checkpoint(tmp_path)
    assert loaded is not None and loaded.step == 7 and loaded.done_ahead == {"0": [(14, 16)]}

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("this would have run",))

    with open(tmp_path / "checkpoint.pt", "wb") as fh:
        pickle.dump({"step": 1, "model": Payload()}, fh, protocol=2)  # what a forged file on shared storage could hold
    with pytest.raises(CheckpointError, match=r"checkpoint\.pt is not a checkpoint .* weights-only"):
        load_checkpoint(tmp_path)


def _run_exported(path: Path, fmt: str, arrays: list[np.ndarray]) -> np.ndarray:
    """Run an exported file as a user without streamtrain would (ONNX: onnx's reference evaluator)."""
    import warnings

    from streamtrain.versions.export import graph_inputs

    values, lengths = graph_inputs(arrays)
    if fmt == "onnx":
        import onnx
        from onnx.reference import ReferenceEvaluator

        return np.asarray(ReferenceEvaluator(onnx.load(path)).run(None, {"values": values.numpy(),
                                                                         "lengths": lengths.numpy()})[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated, still read everywhere
        graph = torch.export.load(path).module() if fmt == "export" else torch.jit.load(path)
    with torch.no_grad():
        return graph(values, lengths).numpy()


EXPORTED = {  # what predict answers, by objective: the array an exported graph returns
    "classification": "probabilities", "multilabel": "probabilities", "regression": "values", "forecast": "values"}


@pytest.mark.parametrize("fmt", ["export", "torchscript", "onnx"])
@pytest.mark.parametrize(("model", "objective"), [("conv", "classification"), ("seq", "classification"),
                                                  ("conv", "regression"), ("seq", "forecast"),
                                                  ("seqflat", "regression"), ("conv", "multilabel")])
def test_an_exported_graph_answers_as_predict_does(tmp_path: Path, fmt: str, model: str, objective: str) -> None:
    if fmt == "onnx":
        pytest.importorskip("onnx")
    from streamtrain.versions.export import export_model

    # seq pads its packed axis to bucketed lengths in eager mode: the graph must not. A regression's outputs are
    # standardised (the graph turns them back into the target's units); samples beyond max_input_abs are bounded.
    cfg = TrainerConfig(model=model, objective=objective, num_features=2, num_classes=3, hidden_size=8,
                        num_layers=2, target_width=2, target_shift=40.0, target_scale=7.0, horizon=3, num_tags=3,
                        max_input_abs=50.0, precision="float32")
    write_version(tmp_path, _spec(1, cfg), build_model(cfg).state_dict())
    loaded = load_model(tmp_path)
    path = str(export_model(loaded, tmp_path / f"model{fmt}", fmt))  # type: ignore[arg-type]
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((n, 2)).astype(np.float32) for n in (4, 41, 9, 150, 6)]
    arrays[1] *= 1000.0  # far above max_input_abs: predict scales it down, so must the graph
    arrays[3] += 80.0
    expected = getattr(loaded.predict(arrays), EXPORTED[objective])
    np.testing.assert_allclose(_run_exported(Path(path), fmt, arrays), expected, rtol=1e-4, atol=1e-5)


def test_an_onnx_graph_that_disagrees_with_predict_is_not_written(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("onnx")
    import contextlib

    from streamtrain.versions import export

    write_version(tmp_path, _spec(1), _trained(steps=20).state_dict())
    # torch's own ONNX form of index_add keeps one row of those sharing an index instead of their sum: the graph
    # runs and answers wrongly (what export wrote before it checked the file).
    monkeypatch.setattr(export, "onnx_symbolics", lambda: contextlib.nullcontext(17))
    with pytest.raises(VersionError, match=r"its ONNX graph \(run by onnx\.reference\) answers a batch of sizes "
                       r"\[.*\] differently from predict \(by up to"):
        export.export_model(load_model(tmp_path), tmp_path / "out" / "model.onnx", "onnx")
    assert list((tmp_path / "out").iterdir()) == []  # neither the file nor its scratch copy


def test_a_model_whose_batches_come_from_a_plug_in_collate_says_why_it_cannot_be_exported(tmp_path: Path) -> None:
    from streamtrain.versions.export import export_model

    cfg = CFG.model_copy(update={"collate": "streamtrain.models.batching:collate_packed"})
    write_version(tmp_path, _spec(1, cfg), build_model(cfg).state_dict())
    with pytest.raises(VersionError, match=r"cannot be exported: its batches come from trainer\.collate"):
        export_model(load_model(tmp_path), tmp_path / "model.pt")
