"""The built-in model a dataset gets when `trainer.model` is left unset, chosen from the data's shape, and how it
is trained when the optimiser settings are left unset.

- every sample one frame (a CSV row, a feature vector): `mlp`, on standardised features; a row has no time axis
  for a convolution to slide along;
- series: `seq`, the dilated conv net with per-series normalisation, which beat `conv` on the series of the
  quality panel (`streamtrain bench quality`; `conv` is the synthetic task's model and stays available).
"""

from __future__ import annotations

import numpy as np

__all__ = ["TRAINING_DEFAULTS", "default_model", "default_training"]

#: How `up --dataset` trains each built-in model when the optimiser settings are left unset, chosen on the quality
#: panel (`streamtrain bench quality`): AdamW, whose per-parameter steps suit the small, uneven global batches a
#: stream gives, without the linear learning-rate scaling (a burst's large batch would multiply the step); the MLP
#: a smaller rate (a few hundred rows are seen many times over within a run, and overfit sooner).
TRAINING_DEFAULTS: dict[str, dict[str, object]] = {
    model: {"trainer.optimizer": "adamw", "trainer.lr": 0.001 if model == "mlp" else 0.003,
            "trainer.lr_scaling": False} for model in ("mlp", "seq", "conv")}


def default_model(sizes: np.ndarray) -> tuple[str, str]:
    """(the built-in model for samples of these sizes, why, for a person)."""
    if len(sizes) and int(sizes.max()) == 1:
        return "mlp", "every sample is one frame (tabular): an MLP with a linear path on standardised features"
    shortest, longest = int(sizes.min()), int(sizes.max())
    length = f"{shortest}" if shortest == longest else f"{shortest} to {longest}"
    return "seq", (f"series of {length} frames: the dilated conv net with per-series normalisation, the best "
                   "built-in series model on the quality panel")


def default_training(model: str) -> dict[str, object]:
    """The optimiser settings `up --dataset` gives `model` when none of them is set (none for a model of yours)."""
    return dict(TRAINING_DEFAULTS.get(model, {}))
