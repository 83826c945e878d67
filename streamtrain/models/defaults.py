"""The built-in model a dataset gets when `trainer.model` is left unset, chosen from the data's shape.

- every sample one frame (a CSV row, a feature vector): `mlp`, on standardised features; a row has no time axis
  for a convolution to slide along;
- series: `seq`, the dilated conv net with per-series normalisation, which beat `conv` on the series of the
  quality panel (`streamtrain bench quality`; `conv` is the synthetic task's model and stays available).
"""

from __future__ import annotations

import numpy as np

__all__ = ["default_model"]


def default_model(sizes: np.ndarray) -> tuple[str, str]:
    """(the built-in model for samples of these sizes, why, for a person)."""
    if len(sizes) and int(sizes.max()) == 1:
        return "mlp", "every sample is one frame (tabular): an MLP with a linear path on standardised features"
    shortest, longest = int(sizes.min()), int(sizes.max())
    length = f"{shortest}" if shortest == longest else f"{shortest} to {longest}"
    return "seq", (f"series of {length} frames: the dilated conv net with per-series normalisation, the best "
                   "built-in series model on the quality panel")
