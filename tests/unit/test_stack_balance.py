"""Balance in a streaming run (keeping up, headroom, work waiting, static vs measured), held-out figures, and
`up --dataset`'s resolution of a dataset against the model's settings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from streamtrain.config import StreamtrainConfig, load_config, parse_assignment
from streamtrain.models.batching import collate_packed
from streamtrain.producers.sources import build_source
from streamtrain.report.figures import build_series
from streamtrain.report.ledger import DeviceRecords, RunRecords
from streamtrain.report.run_balance import (
    balance_figures,
    closing_lines,
    fit_time_models,
    heldout_figures,
    keeps_up,
    lag_trend,
    static_step_estimate,
    waiting_work,
)
from streamtrain.report.schema import HeldoutFigures, StackReport
from streamtrain.runtime.commands import set_args
from streamtrain.stack.replay import held_out_chance, replay_producer_spec, resolve_replay
from streamtrain.stack.services import device_streams
from streamtrain.trainer.distributed import DistContext
from streamtrain.trainer.evaluation import HeldOutEvaluator
from streamtrain.wire import Evaluation, PendingSample, StepFeedback

ONE = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")

SPEED = {"fast": 1e-4, "slow": 4e-4}  # seconds per unit of size: "slow" is 4x slower


def feedback(device: str, step: int, samples: int, size: int, *, new: tuple[int, ...] = (), lowest: int = 0,
             sent_at: int = 0) -> StepFeedback:
    return StepFeedback(job="j", step=step, device_id=device, rank=0, plan_step=step, samples=samples,
                        total_size=size, compute_seconds=SPEED[device] * size + 0.01, data_wait_seconds=0.0,
                        comm_seconds=0.0, step_seconds=SPEED[device] * size + 0.02, memory_bytes=1,
                        lowest_unprocessed_offset=lowest, buffer_depth=0,
                        new_samples=tuple(PendingSample(o, 10) for o in new), sent_at=sent_at or 1000 * (step + 1))


def test_lag_trend_and_keeping_up() -> None:
    assert lag_trend([0, 1, 2, 3], [10, 12, 14, 16]) == pytest.approx(2.0)
    assert lag_trend([1.0], [5.0]) is None
    assert keeps_up(0.3, 10.0) is True and keeps_up(2.0, 10.0) is False  # 3% vs 20% of the arrivals
    assert keeps_up(None, 10.0, lag_now=4) is True  # under a second of arrivals waiting
    assert keeps_up(None, None) is None


def test_work_waiting_counts_only_what_the_coordinator_knew_of() -> None:
    # Step 0 reports offsets 0-9, step 1 reports 10-19. Step 2's plan knew of 0-9 (reported two steps before).
    run = RunRecords(devices=["fast"], feedback=[
        feedback("fast", 0, 0, 0, new=tuple(range(10)), lowest=0),
        feedback("fast", 1, 3, 30, new=tuple(range(10, 20)), lowest=3),
        feedback("fast", 2, 9, 90, lowest=12),  # trained 3-11: everything known (0-9) is done
        feedback("fast", 3, 2, 20, lowest=14),  # 14-19 were known by step 1 and are still waiting
    ])
    waiting = waiting_work(run)
    assert [waiting[s]["fast"] for s in range(4)] == [0, 0, 0, 6]


def test_static_batches_priced_by_fitted_models_against_the_measured_step() -> None:
    # ett-stream-like batches: the slow device trains a quarter of the fast one's size, so compute is balanced.
    rng = np.random.default_rng(0)
    records = []
    for step in range(30):
        fast = int(rng.integers(800, 1200))
        records += [feedback("fast", step, fast // 10, fast), feedback("slow", step, fast // 40, fast // 4)]
    models = fit_time_models(records, ["fast", "slow"])
    assert models["slow"][0] == pytest.approx(4e-4, rel=0.02) and models["fast"][1] == pytest.approx(0.01, abs=1e-3)
    estimate = static_step_estimate(records, ["fast", "slow"])
    assert estimate is not None and estimate.steps == 30
    # Static splits the global batch evenly: the slow device's half costs 4x its share -> about 2.5x the step.
    assert estimate.speedup is not None and 2.0 < estimate.speedup < 3.0, estimate
    assert static_step_estimate(records[:1], ["fast", "slow"]) is None  # no model for a device: no estimate


def test_report_figures_and_closing_lines() -> None:
    devices = ["fast", "slow"]
    offsets = np.arange(100, dtype=np.int64)  # 100 records per device, appended at 20 per second
    records = {d: DeviceRecords(np.zeros(100, np.int64), offsets, offsets, np.ones(100, bool), 1000 * offsets // 20,
                                np.full(100, 10), offsets) for d in devices}
    fbs = [feedback(d, s, 4, 40 + s, new=tuple(range(4 * s, 4 * s + 4)), lowest=4 * s + 4, sent_at=1000 * s // 5 + 50)
           for s in range(25) for d in devices]
    evals = [Evaluation("j", 10, "plaid", 537, 0.3, 1.9, 0.2, sent_at=2000),
             Evaluation("j", 20, "plaid", 537, 0.7, 0.8, 0.3, sent_at=4000)]
    run = RunRecords(devices=devices, records=records, feedback=fbs, evaluations=evals)
    series = build_series(run)
    figures = balance_figures(run, series)
    held = heldout_figures(evals, series["t0_ms"])
    assert figures.devices_keeping_up == 2 and figures.steps_every_device_waiting == 0
    assert held.heldout_accuracy_first == 0.3 and held.heldout_accuracy_final == 0.7
    assert held.heldout_seconds_max == 0.3 and [p.step for p in held.heldout] == [10, 20]
    per = figures.balance_per_device["slow"]
    assert per.keeps_up is True and per.headroom is not None and 0.0 < per.headroom < 1.0
    report = StackReport.model_validate({**dict(figures), **dict(held), "num_classes": 11, "policy": "ett-stream"})
    lines = closing_lines(report)
    assert lines[0].startswith("held-out accuracy (plaid, 537 samples): 0.300 at the first evaluation, 0.700")
    assert "chance 0.09 with 11 classes" in lines[0] and "2 of 2 devices" in lines[1]
    assert "no such step" in lines[2] and lines[3].startswith("step time (slowest device's compute, median over")
    assert heldout_figures([], 0) == HeldoutFigures()
    # With the held-out set's own baseline (its most common class), that is what the line reads against.
    with_baseline = closing_lines(report.model_copy(update={"heldout_chance": 0.162}))
    assert with_baseline[0].endswith("0.700 at the last; chance 0.16 (always its most common class)")


def test_chance_is_the_held_out_sets_most_common_class_whatever_its_numbering(tmp_path: Path) -> None:
    # Labels numbered with gaps (3, 7, 10: 11 outputs, three used) and uneven: 1/11 would flatter any model.
    labels = np.array([3] * 5 + [7] * 3 + [10] * 2)
    np.savez(tmp_path / "held.npz", x=np.ones((10, 4, 1), np.float32), y=labels)
    assert held_out_chance(_config(**{"trainer.eval_path": str(tmp_path / "held.npz")})) == pytest.approx(0.5)
    assert held_out_chance(_config(**{"trainer.eval_packaged": "plaid"})) == pytest.approx(87 / 537)
    assert held_out_chance(_config()) is None  # no held-out set
    assert held_out_chance(_config(**{"trainer.eval_path": str(tmp_path / "gone.npz")})) is None


def _config(**sets: object) -> StreamtrainConfig:
    return load_config(env={}, overrides=sets)


def test_up_dataset_plaid_replays_the_train_split_and_evaluates_on_the_test_split(tmp_path: Path) -> None:
    cfg = _config(**{"trainer.num_features": 1, "trainer.num_classes": 11, "coordinator.global_batch": 256})
    replay = resolve_replay("plaid", cfg)
    chosen = ("trainer.model", "trainer.input_shift", "trainer.input_scale",  # from the data's shape and values
              "trainer.optimizer", "trainer.lr", "trainer.lr_scaling", "trainer.ema_decay")
    assert {k: v for k, v in replay.settings.items() if k not in chosen} == {
        "producer.dataset.packaged": "plaid", "trainer.eval_packaged": "plaid",
        "producer.dataset.class_names": [str(c) for c in range(11)]}
    assert replay.settings["trainer.model"] == "seq" and len(replay.settings["trainer.input_scale"]) == 1
    assert replay.settings["trainer.ema_decay"] == 0.95  # versions are the weights' moving average
    assert (replay.samples, replay.classes, replay.held_out) == (537, 11, "plaid")
    own = tmp_path / "x.npz"
    np.savez(own, x=np.ones((3, 5, 1), dtype=np.float32), y=np.array([0, 4, 10]))
    mine = resolve_replay("plaid", _config(**{"trainer.num_features": 1, "trainer.num_classes": 11,
                                              "trainer.eval_max_samples": 5, "trainer.eval_path": str(own)}))
    assert "trainer.eval_packaged" not in mine.settings and mine.held_out == str(own)  # an explicit one stays
    with pytest.raises(ValueError, match=r"held-out set .*gone.npz: dataset .*gone.npz does not exist"):
        resolve_replay("plaid", _config(**{"trainer.eval_path": str(tmp_path / "gone.npz")}))
    # Left unset, the model takes the dataset's dimensions and classes; set, they are checked against it.
    derived = resolve_replay("plaid", _config())
    assert derived.settings["trainer.num_features"] == 1 and derived.settings["trainer.num_classes"] == 11
    assert _config(**derived.settings).trainer.num_features == 1
    assert "trainer.num_features" not in resolve_replay("plaid", _config(**{"trainer.num_features": 1})).settings
    with pytest.raises(ValueError, match=r"trainer.num_features=1\)"):
        resolve_replay("plaid", _config(**{"trainer.num_features": 3}))
    with pytest.raises(ValueError, match=r"trainer.num_classes=11\)"):
        resolve_replay("plaid", _config(**{"trainer.num_classes": 5}))


def test_up_dataset_makes_an_unset_global_batch_an_eighth_of_a_small_dataset() -> None:
    # PLAID's 537 training series at the default 256 a step would be two steps a pass.
    assert _config().coordinator.global_batch * 8 > 537
    assert resolve_replay("plaid", _config(), devices=4).settings["coordinator.global_batch"] == 537 // 8
    assert resolve_replay("plaid", _config(), devices=100).settings["coordinator.global_batch"] == 100  # >= 1 each
    chosen = resolve_replay("plaid", _config(**{"coordinator.global_batch": 256})).settings
    assert "coordinator.global_batch" not in chosen  # one the user set stays, however large


def test_up_dataset_file_takes_the_test_file_beside_it_and_one_producer_serves_every_device(tmp_path: Path) -> None:
    for split in ("TRAIN", "TEST"):
        (tmp_path / f"X_{split}.ts").write_text("@univariate false\n@dimensions 2\n@classLabel true a b\n@data\n"
                                                 "1,2,3:4,5,6:a\n1,2:3,4:b\n")
    cfg = _config(**{"trainer.num_features": 2, "trainer.num_classes": 2})
    replay = resolve_replay(str(tmp_path / "X_TRAIN.ts"), cfg)
    assert replay.settings["trainer.eval_path"] == str(tmp_path / "X_TEST.ts")
    spec = replay_producer_spec(device_streams(3, rates=[1, 2, 3]), 7, 9100, {}, [])
    sets = dict(parse_assignment(spec.argv[i + 1]) for i, a in enumerate(spec.argv) if a == "--set")
    child = _config(**sets, **replay.settings, **{"trainer.num_features": 2})  # as up gives it: the user's too
    assert child.producer.device_ids == ["0", "1", "2"] and child.producer.rate.rates == [1, 2, 3]
    assert child.producer.dataset.path == tmp_path / "X_TRAIN.ts" and spec.ports == (9100,)
    with pytest.raises(ValueError, match="does not exist"):
        resolve_replay(str(tmp_path / "nope.ts"), cfg)


def test_up_dataset_gives_the_model_an_output_for_a_class_only_the_held_out_split_has(tmp_path: Path) -> None:
    header = "@univariate true\n@classLabel true a b c\n@data\n"
    (tmp_path / "Y_TRAIN.ts").write_text(header + "1,2,3:a\n4,5:b\n")
    (tmp_path / "Y_TEST.ts").write_text(header + "1,2:a\n3,4,5:c\n")
    replay = resolve_replay(str(tmp_path / "Y_TRAIN.ts"), _config())
    assert replay.settings["trainer.num_classes"] == 3 and replay.settings["trainer.num_features"] == 1


def test_up_dataset_numbers_classes_alike_in_the_replay_and_the_held_out_set(tmp_path: Path) -> None:
    """A held-out split lacking a training class, and holding one the training split lacks: `up` names every class
    once, and the producer's samples and the evaluator's labels (read by the children from their --set) agree."""
    for split, classes in (("train", ["cat", "dog", "fox"]), ("test", ["cat", "fox", "owl"])):
        for c in classes:
            (tmp_path / split / c).mkdir(parents=True)
            np.save(tmp_path / split / c / "0.npy", np.full((4, 2), float(len(c)), dtype=np.float32))
    cfg = _config(**{"trainer.eval_path": str(tmp_path / "test")})
    replay = resolve_replay(str(tmp_path / "train"), cfg)
    assert replay.settings["producer.dataset.class_names"] == ["cat", "dog", "fox", "owl"]
    assert replay.settings["trainer.num_classes"] == 4 and replay.classes == 4
    sets = dict(parse_assignment(a) for a in set_args(replay.settings)[1::2])
    child = load_config(env={}, overrides={"trainer.eval_path": str(tmp_path / "test"), **sets})
    _source, replayed = build_source(child.producer.model_copy(update={"devices": 1}))
    assert replayed is not None
    assert {Path(src).parent.name: int(y) for src, y in zip(replayed.sources, replayed.labels, strict=True)} == {
        "cat": 0, "dog": 1, "fox": 2}
    evaluator = HeldOutEvaluator(child.trainer, ONE, collate_packed, child.producer.dataset)
    held = sorted(int(y) for batch in evaluator.batches for y in batch.labels)
    assert held == [0, 2, 3]  # cat, fox, owl: fox is 2 as in training, not 1 as the held-out split alone says
    # A user's own list wins and is not replaced.
    mine = resolve_replay(str(tmp_path / "train"), _config(**{"producer.dataset.class_names": ["fox", "dog", "cat"],
                                                                "trainer.eval_path": str(tmp_path / "train")}))
    assert "producer.dataset.class_names" not in mine.settings and mine.classes == 3
