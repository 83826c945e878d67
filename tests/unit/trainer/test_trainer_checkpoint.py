"""Checkpoints are atomic: a crash mid-save leaves the previous checkpoint whole; resume offset rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from streamtrain.trainer import checkpoint as ckpt
from streamtrain.trainer.checkpoint import (
    CHECKPOINT_NAME,
    Checkpoint,
    NonFiniteCheckpointError,
    load_checkpoint,
    resume_offset,
    save_checkpoint,
)


def _checkpoint(step: int) -> Checkpoint:
    return Checkpoint(step=step, model={"w": torch.full((3,), float(step))}, optimizer={"state": {}},
                      offsets={"d0": 10 * step, "d1": step}, job="job", world_size=2,
                      done_ahead={"d0": [(10 * step + 2, 10 * step + 4)]})


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    assert load_checkpoint(tmp_path) is None and load_checkpoint(None) is None
    save_checkpoint(tmp_path / "ck", _checkpoint(3))
    loaded = load_checkpoint(tmp_path / "ck")
    assert loaded is not None
    assert (loaded.step, loaded.offsets, loaded.job, loaded.world_size) == (3, {"d0": 30, "d1": 3}, "job", 2)
    assert loaded.done_ahead == {"d0": [(32, 34)]}
    assert torch.equal(loaded.model["w"], torch.full((3,), 3.0))


def test_crash_mid_save_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_checkpoint(tmp_path, _checkpoint(1))

    def torn_save(obj: Any, fh: Any) -> None:
        fh.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.torch, "save", torn_save)
    with pytest.raises(OSError):
        save_checkpoint(tmp_path, _checkpoint(2))
    monkeypatch.undo()
    loaded = load_checkpoint(tmp_path)
    assert loaded is not None and loaded.step == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_NAME]  # no temporary left behind


def test_stale_temporaries_are_removed_and_replaced_atomically(tmp_path: Path) -> None:
    (tmp_path / ".checkpoint-crashed").write_bytes(b"junk")
    save_checkpoint(tmp_path, _checkpoint(1))
    save_checkpoint(tmp_path, _checkpoint(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_NAME]
    loaded = load_checkpoint(tmp_path)
    assert loaded is not None and loaded.step == 2


def test_resume_offset_prefers_the_checkpoint() -> None:
    assert resume_offset(None, None) is None
    assert resume_offset(None, 7) == 7
    assert resume_offset(5, 7) == 5  # the restored model has not trained 5 and 6
    assert resume_offset(9, 7) == 9  # a commit lost after the checkpoint


@pytest.mark.parametrize("where", ["model", "optimizer"])
def test_a_checkpoint_with_a_non_finite_tensor_is_refused_and_the_previous_one_kept(tmp_path: Path,
                                                                                    where: str) -> None:
    save_checkpoint(tmp_path, _checkpoint(1))
    poisoned = _checkpoint(2)
    if where == "model":
        poisoned.model["w"][1] = float("nan")
    else:
        poisoned.optimizer = {"state": {0: {"momentum_buffer": torch.tensor([1.0, float("inf")])}}, "param_groups": []}
    with pytest.raises(NonFiniteCheckpointError, match=r"step 2 not written: 1 tensor\(s\) hold NaN or infinity"):
        save_checkpoint(tmp_path, poisoned)
    loaded = load_checkpoint(tmp_path)
    assert loaded is not None and loaded.step == 1 and torch.isfinite(loaded.model["w"]).all()
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_NAME]  # no temporary left behind
