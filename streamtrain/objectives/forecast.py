"""`forecast`: self-supervised, no labels: predict the next `horizon` values of each series from the values before.

The collate function holds the last `trainer.horizon` frames of every series back as its future (the
`targets`) and packs the frames before them as its input. The model's `horizon * num_features` outputs are
read as steps away from the input's last value, in units of the input's own mean absolute step (MASE's
scale, plus a floor for a constant input):

    forecast = last value + scale * output

so an output of 0 is the last-value baseline exactly, and series of any level and amplitude train alike.
The loss is the Huber loss (δ = 1 scale unit) of those outputs; the metrics are MAE and RMSE in the series'
own units, against the last-value baseline's.

The default packing scales a series whose largest |value| exceeds `trainer.max_input_abs` down to it, input and
future alike, and says by what factor (`PackedBatch.bound_factors`): the loss is scale-free and reads the scaled
values as they are, while forecasts, metrics and predictions are divided by the factor, back into the series'
own units (a batch without factors, a plug-in collate's, is read as unscaled).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from streamtrain.wire import Sample

from .base import SERIES_TOO_SHORT, Objective, Ratio, TargetProblem
from .regression import ERROR_RATIOS, error_sums

__all__ = ["Forecast", "last_value_and_scale", "own_units"]

#: The scale's floor, relative to the input's mean magnitude (and absolute, for an all-zero input).
RELATIVE_FLOOR = 1e-3
ABSOLUTE_FLOOR = 1e-6


def last_value_and_scale(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Each series' last input frame and its mean absolute step (floored), both (N, F), from a packed batch."""
    values, seg, lengths = batch.values, batch.segment_ids, batch.lengths
    n, width = lengths.shape[0], values.shape[1]
    last = values[batch.cu_seqlens[1:] - 1] if n else values.new_zeros(0, width)
    # Each frame's step from the one before it, zero at a series' first frame. Rolled rather than sliced ([1:]
    # against [:-1]): tensors of the batch's own length, so an exported graph takes batches of any size.
    rows = torch.arange(values.shape[0], device=values.device)
    same = (seg == seg.roll(1, 0)) & (rows > 0)
    steps = (values - values.roll(1, 0)).abs() * same.unsqueeze(1).to(values.dtype)
    summed = values.new_zeros(n, width).index_add_(0, seg, steps)
    mean_step = summed / (lengths - 1).clamp_min(1).unsqueeze(1).to(values.dtype)
    level = values.new_zeros(n, width).index_add_(0, seg, values.abs()) / lengths.clamp_min(1).unsqueeze(1).to(
        values.dtype)
    return last, mean_step + RELATIVE_FLOOR * level + ABSOLUTE_FLOOR


def own_units(values: torch.Tensor, batch: Any) -> torch.Tensor:
    """Per-series `values` (N, ...) of a packed batch in the series' own units: divided by the factor the packing
    scaled each series by (`bound_factors`; a batch without them was not scaled)."""
    factors = getattr(batch, "bound_factors", None)
    if factors is None:
        return values
    return values / factors.to(values.dtype).reshape(-1, *[1] * (values.dim() - 1))


class Forecast(Objective):
    """`trainer.horizon * trainer.num_features` outputs per sample: the series' next values, as steps from its last.

    Metrics: `loss`, `mae`, `rmse` over every forecast value, and `baseline_mae` / `baseline_rmse`, those of
    forecasting the last value (needs no state).
    """

    name = "forecast"
    batch_fields = ("values", "segment_ids", "cu_seqlens", "lengths", "targets")
    headline = "mae"
    baseline = "baseline_mae"
    baseline_note = "the last value of each series"
    ratios = (Ratio("loss", "loss_sum", "count"), *ERROR_RATIOS)

    def output_width(self) -> int:
        return self.config.horizon * self.config.num_features

    def target_problem(self, sample: Sample) -> TargetProblem | None:
        horizon = self.config.horizon
        if sample.size <= horizon:
            return TargetProblem(SERIES_TOO_SHORT, f"size {sample.size}: a series needs more than trainer.horizon="
                                 f"{horizon} frames (its last {horizon} are the future it is trained to forecast)")
        return None

    def probe_target(self, index: int, rng: np.random.Generator) -> tuple[int | None, list[float] | None]:
        return None, None

    def min_size(self) -> int:
        return self.config.horizon + 1

    def _shaped(self, flat: torch.Tensor) -> torch.Tensor:
        return flat.reshape(flat.shape[0], self.config.horizon, -1)

    def fitting_target(self, batch: Any) -> torch.Tensor:
        """The steps from each series' last value to its next `horizon` values, in its mean step (N, outputs)."""
        last, scale = last_value_and_scale(batch)
        return ((self._shaped(batch.targets) - last.unsqueeze(1)) / scale.unsqueeze(1)).flatten(1)

    def losses(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        each = F.huber_loss(outputs, self.fitting_target(batch), reduction="none", delta=1.0)
        return each.mean(dim=1)

    def forecast(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        """The forecast values (N, horizon, F) in the series' own units."""
        last, scale = last_value_and_scale(batch)
        return own_units(last.unsqueeze(1) + scale.unsqueeze(1) * self._shaped(outputs), batch)

    def metric_sums(self, outputs: torch.Tensor, batch: Any,
                    baseline: torch.Tensor | None = None) -> dict[str, torch.Tensor | float]:
        truth = own_units(self._shaped(batch.targets), batch)
        last, _scale = last_value_and_scale(batch)
        return {
            "count": float(truth.shape[0]),
            "loss_sum": self.losses(outputs, batch).sum(),
            **error_sums(self.forecast(outputs, batch), own_units(last.unsqueeze(1), batch).expand_as(truth), truth),
        }

    def predicted(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return self.forecast(outputs, batch)
