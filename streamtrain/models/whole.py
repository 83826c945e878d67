"""The built-in model for series of one length (`trainer.model = "seqflat"`): `seq` beside a path that reads the
whole series, position by position.

In a dataset whose series all have one length, a position means the same thing in every sample: the 40th
wavelength of a spectrum (Tecator), the 30th day of an epidemic (Covid3Month), the 100th point of an outline
(ArrowHead). `seq`'s convolutions and pooling are blind to where in the series a pattern sits, which is what a
gesture or an appliance's current wants and what these do not: on the quality panel `seq` reached a held-out RMSE
3x a ridge regression's on Tecator and lost to the mean on Covid3Month. So `seqflat` adds to `seq`'s outputs those
of an MLP with a linear path (`TabularMLP`, with dropout) over the whole series laid out flat, the way the
references read it:

- each series resampled to `trainer.series_points` points per channel (`resample`: unchanged when it has that many
  frames, linearly interpolated when fewer, each point the mean of its share of the frames when more), so the
  model takes any length, as every model must (the start-up probe, `predict`, an exported graph);
- those points twice, as they come (standardised per feature by the default packing: the level a fat content or a
  death rate follows) and z-scored within the series per channel (its shape: chemometrics' standard normal
  variate, which takes out the baseline shifts that make a spectrum's raw points nearly collinear), with each
  channel's level and scale (`asinh(mean)`, `log10(std)`), as `seq` has them.

Summed logits: each path learns what the other misses, and on the panel the sum was at least as good as the better
of the two alone on every series of one length (Tecator's RMSE 2.2-2.6 against ridge's 2.65; BasicMotions,
gestures, 0.95 where the flat path alone reached 0.77). Series of varying length keep `seq`: there a position
means different things in different samples (resampled, PLAID lost 2 to 8 points of accuracy).

Its regularisation is fixed (`trainer.dropout`, `trainer.ema_decay`), not chosen from the data. On a few hundred
series whose target the series explain by a few percent of its variance it fits the noise: 160 training series,
250 steps, held-out RMSE 1.14 against the mean's 1.05, where ridge regression with its penalty chosen by GCV reaches
1.04; and the whole-series path's input dropout, a ridge penalty of about one per series per input, keeps it from
an exact linear read of two positions (0.79x the mean's RMSE; 0.27x at dropout 0). The quality panel's sets are
not of that kind (Covid3Month: 0.040 against the mean's 0.045 and ridge's 0.043).
"""

from __future__ import annotations

import torch
from torch import nn

from .batching import PackedBatch
from .conv import segment_mean
from .sequence import MIN_STD, SequenceClassifier
from .tabular import TabularMLP

__all__ = ["WHOLE_DROPOUT", "WHOLE_LAYERS", "WholeSeriesNet", "resample", "whole_series_features"]

#: The whole-series MLP's dropout when `trainer.dropout` is unset: it has hundreds of inputs per series and a few
#: dozen series to learn from (on the panel 0.5 held BasicMotions at 0.93-0.96 where 0.2 let it fall to 0.85, and
#: Tecator's RMSE at 3.0 against 3.4).
WHOLE_DROPOUT = 0.5
#: Hidden layers of the whole-series MLP (`trainer.num_layers` is `seq`'s blocks).
WHOLE_LAYERS = 2


def resample(values: torch.Tensor, cu_seqlens: torch.Tensor, lengths: torch.Tensor, points: int) -> torch.Tensor:
    """Every packed series on `points` evenly spaced points per channel: (n, points, F).

    A series of `points` frames comes out unchanged; a shorter one is linearly interpolated (one of one frame is that
    frame repeated); a longer one gives, for each point, the mean of the frames of its share of the series
    (`points` equal bins), so no frame is skipped.

    Args:
        values: (N, F) packed frames.
        cu_seqlens: (n + 1,) cumulative lengths.
        lengths: (n,) frames per series, each at least 1.
        points: Points per series (at least 1).
    """
    n, features = lengths.shape[0], values.shape[1]
    dtype, device = values.dtype, values.device
    grid = torch.arange(points, device=device, dtype=dtype).unsqueeze(0)
    last = (lengths - 1).clamp_min(0).unsqueeze(1)
    where = grid * last.to(dtype) / max(points - 1, 1)
    below = where.floor().to(torch.int64)
    weight = (where - below.to(dtype)).unsqueeze(2)
    start = cu_seqlens[:-1].unsqueeze(1)
    interpolated = values[start + below] * (1 - weight) + values[start + torch.minimum(below + 1, last)] * weight
    segment = torch.repeat_interleave(torch.arange(n, device=device), lengths, output_size=values.shape[0])
    within = torch.arange(values.shape[0], device=device) - cu_seqlens[:-1][segment]
    bins = segment * points + within * points // lengths[segment].clamp_min(1)
    sums = values.new_zeros(n * points, features).index_add_(0, bins, values)
    counts = values.new_zeros(n * points).index_add_(0, bins, torch.ones_like(values[:, 0]))
    binned = (sums / counts.clamp_min(1).unsqueeze(1)).view(n, points, features)
    return torch.where((lengths > points).view(n, 1, 1), binned, interpolated)


def whole_series_features(batch: PackedBatch, points: int) -> torch.Tensor:
    """(n, 2·F·points + 2·F): each series resampled (`resample`), as it comes and z-scored by its own mean and standard
    deviation per channel (those of its frames, as `seq` takes them: a constant series, one frame included, comes out
    exactly 0), with each channel's `asinh(mean)` and `log10(std)`."""
    grid = resample(batch.values, batch.cu_seqlens, batch.lengths, points)
    seg, lengths = batch.segment_ids, batch.lengths
    mean = segment_mean(batch.values, seg, lengths)
    centred = batch.values - mean[seg]
    std = segment_mean(centred * centred, seg, lengths).sqrt().clamp_min(MIN_STD)
    z = (grid - mean.unsqueeze(1)) / std.unsqueeze(1)
    return torch.cat([grid.flatten(1), z.flatten(1), torch.asinh(mean), torch.log10(std)], dim=1)


class WholeSeriesNet(nn.Module):
    """`seq` (`SequenceClassifier`) plus an MLP with a linear path over `whole_series_features`; outputs summed.

    Args:
        num_features: Channels per frame (F).
        num_outputs: Outputs per series.
        hidden_size: Channels of `seq` and width of the MLP's hidden layers.
        num_layers: `seq`'s conv blocks (the MLP has `WHOLE_LAYERS`).
        kernel_size: `seq`'s temporal kernel width.
        points: Points per channel the whole-series path resamples each series to (`trainer.series_points`).
        dropout: The whole-series MLP's dropout in training (`trainer.dropout`).
        length_buckets: `seq`'s padded lengths per power of two.
        last_state: `seq` pools each series' last frame too (`forecast`).
    """

    def __init__(self, num_features: int, num_outputs: int, hidden_size: int = 64, num_layers: int = 2,
                 kernel_size: int = 5, points: int = 64, dropout: float = WHOLE_DROPOUT, length_buckets: int = 8,
                 last_state: bool = False) -> None:
        super().__init__()
        self.points = points
        self.seq = SequenceClassifier(num_features, num_outputs, hidden_size, num_layers, kernel_size,
                                      length_buckets=length_buckets, last_state=last_state)
        self.whole = TabularMLP(2 * num_features * (points + 1), num_outputs, hidden_size, WHOLE_LAYERS, dropout)
        self.last_state = last_state

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """Outputs of shape (batch.num_samples, num_outputs); an empty batch gives (0, num_outputs)."""
        return self.seq(batch) + self.whole.outputs(whole_series_features(batch, self.points))
