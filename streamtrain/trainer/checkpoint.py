"""Atomic checkpoints of the trainer group: model, optimizer, step and per-device offsets.

Rank 0 writes `checkpoint.pt` in the configured directory: to a temporary file in the same
directory, fsynced, then renamed over the old one (rename is atomic on POSIX), then the directory
is fsynced so the rename itself survives a power cut. A crash at any point leaves either the old
checkpoint or the new one, never a torn file; stale temporaries are removed on the next save. A
checkpoint holding a non-finite tensor (model or optimizer state) is refused before anything is written:
resuming from it would poison the model for good.

A checkpoint holds only tensors, numbers, strings, booleans, None and lists, tuples and dicts of them, and is
read back with `torch.load(weights_only=True)`: it may sit on storage other hosts write to, and an unpickler
that would build any object a file names would run whatever code such a file carries. A file that holds
anything else is refused (`CheckpointError`), not executed.
"""

from __future__ import annotations

import logging
import os
import pickle
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from streamtrain.durable import fsync_dir

from .errors import TrainerSetupError

__all__ = ["CHECKPOINT_NAME", "Checkpoint", "CheckpointError", "NonFiniteCheckpointError", "load_checkpoint",
           "non_finite_tensors", "resume_offset", "save_checkpoint"]

logger = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.pt"
_TMP_PREFIX = ".checkpoint-"


@dataclass
class Checkpoint:
    """What a checkpoint holds.

    Attributes:
        step: Steps completed: training resumes at this step number.
        model: The model's state_dict (unwrapped from DDP).
        optimizer: The optimizer's state_dict.
        offsets: Device id -> first offset not yet trained or dropped when the checkpoint was taken.
        job: Training job name.
        world_size: Ranks of the group that wrote it.
        done_ahead: Device id -> offsets above its `offsets` entry already processed (trained out of order),
            as [start, end) pairs: a resume skips them instead of training them twice.
        inputs: The input standardisation the ranks estimated online (shift, scale), so a resumed group keeps the
            scale its weights were trained on; empty when none was estimated.
    """

    step: int
    model: dict[str, Any]
    optimizer: dict[str, Any]
    offsets: dict[str, int] = field(default_factory=dict)
    job: str = ""
    world_size: int = 1
    done_ahead: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    inputs: list[list[float]] = field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        return {"version": 1, "step": self.step, "model": self.model, "optimizer": self.optimizer,
                "offsets": dict(self.offsets), "job": self.job, "world_size": self.world_size,
                # Plain lists and dicts only: what a weights-only load accepts.
                "done_ahead": {d: [list(r) for r in ranges] for d, ranges in self.done_ahead.items()},
                "inputs": [list(map(float, v)) for v in self.inputs]}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Checkpoint:
        return cls(step=int(state["step"]), model=state["model"], optimizer=state["optimizer"],
                   offsets={str(k): int(v) for k, v in state.get("offsets", {}).items()},
                   job=str(state.get("job", "")), world_size=int(state.get("world_size", 1)),
                   done_ahead={str(d): [(int(a), int(b)) for a, b in ranges]
                               for d, ranges in state.get("done_ahead", {}).items()},
                   inputs=[[float(x) for x in v] for v in state.get("inputs", [])])


class CheckpointError(TrainerSetupError):
    """A checkpoint file that cannot be read back as a checkpoint (the message names the file): the rank does not
    start, as with any other setting it cannot start with."""


class NonFiniteCheckpointError(ValueError):
    """A checkpoint would have stored a NaN or an infinity; nothing was written."""


def non_finite_tensors(state: Any, prefix: str = "") -> list[str]:
    """Dotted names of the floating-point tensors in a (nested) state dict that hold a NaN or an infinity."""
    if isinstance(state, torch.Tensor):
        return [prefix] if state.is_floating_point() and not bool(torch.isfinite(state).all()) else []
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, list | tuple) else ()
    return [name for key, value in items
            for name in non_finite_tensors(value, f"{prefix}.{key}" if prefix else str(key))]


def save_checkpoint(directory: Path, checkpoint: Checkpoint) -> Path:
    """Write `checkpoint` atomically to `directory/checkpoint.pt` (the directory is created).

    Returns:
        The checkpoint's path.

    Raises:
        NonFiniteCheckpointError: a model or optimizer tensor is not finite (nothing is written; the old
            checkpoint stays).
        OSError: the directory is not writable or the disk is full (the old checkpoint is intact).
    """
    bad = non_finite_tensors({"model": checkpoint.model, "optimizer": checkpoint.optimizer})
    if bad:
        raise NonFiniteCheckpointError(f"checkpoint of step {checkpoint.step} not written: {len(bad)} tensor(s) hold "
                                       f"NaN or infinity ({', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''})")
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob(f"{_TMP_PREFIX}*"):
        stale.unlink(missing_ok=True)  # left by a crash mid-save
    final = directory / CHECKPOINT_NAME
    fd, tmp_name = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=directory)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(checkpoint.state_dict(), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(directory)
    logger.info("checkpoint of step %d written to %s (offsets %s)", checkpoint.step, final, checkpoint.offsets)
    return final


def load_checkpoint(directory: Path | None) -> Checkpoint | None:
    """The checkpoint in `directory`, or None when there is none (or no directory is configured).

    Raises:
        CheckpointError: the file is not a checkpoint: torn, of another format, or holding objects other than
            tensors and plain values (refused unread: loading is weights-only).
    """
    if directory is None:
        return None
    path = directory / CHECKPOINT_NAME
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        checkpoint = Checkpoint.from_state_dict(state)
    except (pickle.UnpicklingError, RuntimeError, EOFError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a checkpoint streamtrain can load weights-only "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); move it "
                              "away to start afresh, or point trainer.checkpoint_dir elsewhere") from exc
    logger.info("loaded checkpoint of step %d from %s", checkpoint.step, path)
    return checkpoint


def resume_offset(checkpoint_offset: int | None, committed: int | None) -> int | None:
    """Where a device's consumption resumes: the checkpoint's offset when it has one, else the committed one.

    The checkpoint wins because the model it restores has trained exactly the samples below its
    offset: a committed offset above it (commits after every step) would skip samples the restored
    model never saw, and one below it (a commit lost after the checkpoint) would train some twice.
    """
    if checkpoint_offset is not None:
        if committed is not None and committed != checkpoint_offset:
            logger.info("resuming at the checkpoint's offset %d (committed: %d)", checkpoint_offset, committed)
        return checkpoint_offset
    return committed
