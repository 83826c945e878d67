"""Model versions (`[versions]` in the TOML file, STREAMTRAIN_VERSIONS__* in the environment): where the trainers
publish the model they train, how often, and how many are kept. `serve` and `load_model` read the same directory."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["VersionsConfig"]


class VersionsConfig(BaseModel):
    """How the trainers publish model versions (safetensors weights + model.json) while they train."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    dir: Path | None = None
    """Directory of the model versions (local, or storage every trainer node and `serve` mounts): rank 0 writes
    `v000001/`, `v000002/`, ... each atomically (a temporary directory renamed into place). None: no versions."""

    publish_every_seconds: float = Field(default=1.0, ge=0, le=86_400)
    """Seconds between two versions while training: the step that ends past this much time since the last version
    publishes (every rank at once), provided something was trained since it (an idle fleet writes no versions of
    unchanged weights); a final version is always written when the run ends. 0: only the final version. Shorter is
    fresher (a served model is at most this much behind what was trained) and costs a write of the weights, and
    with `evaluate` a held-out evaluation, per version."""

    keep: int = Field(default=5, ge=1, le=100_000)
    """Versions kept in `dir`; older ones are deleted once a newer one is in place (keep at least 2, so a
    version `serve` is loading is not deleted under it)."""

    evaluate: bool = False
    """On: evaluate each version on the held-out set (when one is configured) before it is written, so its
    held-out figures are its own weights'. Off (the default; a full evaluation per version costs about as much
    training time as a version interval on a small CPU): a version carries the latest evaluation's figures, with
    the step they were measured at (`heldout_step`: every `trainer.eval_every` steps and at the end). Either way
    every version carries test-then-train figures (`prequential_*`) over the last `trainer.prequential_window`
    steps, each sample scored by the forward pass before the step that trained it."""
