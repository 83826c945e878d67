"""The built-in model a dataset gets when `trainer.model` is left unset, chosen from the data's shape, and how it
is trained when the optimiser settings are left unset.

- every sample one frame (a CSV row, a feature vector): `mlp`, on standardised features; a row has no time axis
  for a convolution to slide along;
- series all of one length: `seqflat`, `seq` beside an MLP over the whole series position by position
  (`streamtrain.models.whole`): in such a dataset a position means the same in every sample (a wavelength, a day),
  which `seq`'s pooling cannot see; on the quality panel it took Tecator's RMSE from 3x ridge regression's to
  below it and Covid3Month from worse than the mean to better than ridge;
- series of varying length: `seq`, the dilated conv net with per-series normalisation, which beat `conv` on the
  series of the quality panel (`streamtrain bench quality`; `conv` is the synthetic task's model and stays
  available); resampled to one grid, a position would mean different things in different series.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["EMA_DECAY", "MAX_SERIES_INPUTS", "MAX_SERIES_POINTS", "SEQFLAT_BLOCKS", "TRAINING_DEFAULTS",
           "ModelChoice", "default_model", "default_training"]

#: How `up --dataset` trains each built-in model when the optimiser settings are left unset, chosen on the quality
#: panel (`streamtrain bench quality`): AdamW, whose per-parameter steps suit the small, uneven global batches a
#: stream gives, without the linear learning-rate scaling (a burst's large batch would multiply the step); the MLP
#: a smaller rate (a few hundred rows are seen many times over within a run, and overfit sooner).
TRAINING_DEFAULTS: dict[str, dict[str, object]] = {
    model: {"trainer.optimizer": "adamw", "trainer.lr": 0.001 if model == "mlp" else 0.003,
            "trainer.lr_scaling": False} for model in ("mlp", "seq", "seqflat", "conv")}

#: `seqflat`'s conv blocks (`trainer.num_layers`) from `up --dataset`: dilations 1 to 8, 61 frames in view with
#: kernels of 5. On the panel's series of one length 4 blocks beat 2 everywhere (Tecator's RMSE 1.8 against 4.4,
#: GunPoint 0.99 against 0.89), and `seq`'s own design is 4 (`streamtrain.models.sequence`).
SEQFLAT_BLOCKS = 4

#: Exponential moving average of the weights `up --dataset` gives a built-in model (`trainer.ema_decay`): on the
#: panel's series of one length it took Tecator's RMSE from 3.0 (spread 2.5-4.8 over 4 seeds) to 2.2 (1.8-2.8),
#: BasicMotions from 0.93 to 0.96, and changed the tabular sets' figures by less than their spread.
EMA_DECAY = 0.95

#: Most points per channel `seqflat`'s whole-series path gets from `up --dataset` (longer series are averaged in
#: bins), and most values over all channels: its first layer has hidden_size weights per value.
MAX_SERIES_POINTS, MAX_SERIES_INPUTS = 256, 4096


@dataclass(frozen=True)
class ModelChoice:
    """The built-in model for a dataset, why (for a person), and the settings it comes with."""

    name: str
    why: str
    settings: dict[str, object] = field(default_factory=dict)


def default_model(sizes: np.ndarray, num_features: int = 1) -> ModelChoice:
    """The built-in model for samples of these sizes (frames) and features per frame."""
    if len(sizes) and int(sizes.max()) == 1:
        return ModelChoice("mlp", "every sample is one frame (tabular): an MLP with a linear path on standardised "
                           "features")
    shortest, longest = (int(sizes.min()), int(sizes.max())) if len(sizes) else (0, 0)
    if shortest == longest and longest > 1:
        points = max(1, min(longest, MAX_SERIES_POINTS, MAX_SERIES_INPUTS // num_features))
        read = "as they are" if points == longest else f"averaged onto {points} points"
        return ModelChoice("seqflat", f"series all of {longest} frames: the dilated conv net ({SEQFLAT_BLOCKS} blocks) "
                           f"beside an MLP over the whole series position by position ({read}): in series of one "
                           "length a position means the same in every sample",
                           {"trainer.series_points": points, "trainer.num_layers": SEQFLAT_BLOCKS})
    return ModelChoice("seq", f"series of {shortest} to {longest} frames: the dilated conv net with per-series "
                       "normalisation, the best built-in model on the quality panel's series of varying length")


def default_training(model: str) -> dict[str, object]:
    """The optimiser settings `up --dataset` gives `model` when none of them is set (none for a model of yours)."""
    return dict(TRAINING_DEFAULTS.get(model, {}))
