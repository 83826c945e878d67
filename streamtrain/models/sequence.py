"""The built-in model for real sequences (`trainer.model = "seq"`): a dilated masked conv net over packed series.

Why a masked convolution rather than a GRU or a transformer encoder: its cost is linear in the batch's
*total* size, which is what the coordinator's time model `T = a·size + b` assumes. A GRU steps through
time one frame after another, so a batch costs its longest series (and runs hundreds of tiny
sequential kernels on a CPU); self-attention costs the square of each series' length. Dilations
1, 2, 4, ... give a receptive field of `1 + (k-1)·(2^L - 1)` frames (61 for k=5, L=4) at the cost
of L plain convolutions.

Layout: the packed frames are laid out on one long time axis with a gap of zeros between series, as
wide as the largest dilated kernel's reach, and every layer's output is zeroed in the gaps again; a
convolution then never reads across a series boundary, exactly as if each series were convolved
alone with zero padding. The gaps add a fixed number of frames per series (16 for k=5, L=4).

The axis is then padded with zeros to one of eight lengths per power of two (`bucketed_length`, at most
1/8 more frames). A stream of variable-size batches has a new total length almost every step, and on a
CPU PyTorch hands these convolutions (past ~600 frames) to oneDNN, which builds a kernel for each new
shape: some 12 ms of CPU time per step whatever the batch, which made a 700-frame batch cost three times a
550-frame one. With the lengths bucketed the shapes repeat and the kernels are reused, so a step's cost
follows its size (`length_buckets=0` turns it off).

Normalisation happens here, inside the model, not in a collate function: real series come in their
own units (PLAID's currents range from milliamperes to tens of amperes), so each series is
z-normalised per channel, and its level and scale enter as two per-series features, `asinh(mean)`
and `log10(std)`. The shape the conv layers see is unit-free while the amplitude (a heater draws a
hundred times a laptop's current) is still there to tell classes apart. Training and held-out
evaluation share it, and any collate that packs raw values (the default one) works unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .batching import PackedBatch, bucketed_length
from .conv import last_frames, segment_mean

__all__ = ["SequenceClassifier", "series_features"]

#: Smallest standard deviation a series is divided by: a constant series normalises to zeros, not inf.
MIN_STD = 1e-6


def series_features(values: torch.Tensor, segment_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Per-series normalised frames: (N, F) raw values → (N, 3F) of [z-score, asinh(mean), log10(std)].

    Args:
        values: (N, F) packed frames.
        segment_ids: (N,) series of each frame.
        lengths: (num_series,) frames per series.
    """
    mean = segment_mean(values, segment_ids, lengths)
    centred = values - mean[segment_ids]
    std = segment_mean(centred * centred, segment_ids, lengths).sqrt().clamp_min(MIN_STD)
    z = centred / std[segment_ids]
    level = torch.asinh(mean)[segment_ids]
    scale = torch.log10(std)[segment_ids]
    return torch.cat([z, level, scale], dim=1)


class SequenceClassifier(nn.Module):
    """Series → per-series normalisation → linear embedding → residual dilated conv blocks → mean and max pooling
    per series → class logits.

    Args:
        num_features: Channels per frame (F: 1 for a univariate series).
        num_classes: Logits per series.
        hidden_size: Channels of the conv blocks (H).
        num_layers: Residual conv blocks; block i has dilation 2^i.
        kernel_size: Odd temporal kernel width.
        length_buckets: Lengths per power of two the packed axis is padded to (see the module doc; 0: none).
        last_state: Pool each series' last frame beside its mean and max (for `forecast`: where a series ends is
            what its next values follow from, and pooling forgets it).
    """

    def __init__(
        self, num_features: int, num_classes: int, hidden_size: int = 32, num_layers: int = 4, kernel_size: int = 5,
        length_buckets: int = 8, last_state: bool = False,
    ) -> None:
        super().__init__()
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd, got {kernel_size}")
        bucketed_length(0, length_buckets)  # a bad count fails here, not at the first batch
        self.hidden_size = hidden_size
        self.length_buckets = length_buckets
        self.gap = (kernel_size // 2) * 2 ** (num_layers - 1)
        self.embed = nn.Linear(3 * num_features, hidden_size)
        self.convs = nn.ModuleList(
            nn.Conv1d(hidden_size, hidden_size, kernel_size, dilation=2**i, padding=(kernel_size // 2) * 2**i)
            for i in range(num_layers)
        )
        self.last_state = last_state
        self.head = nn.Linear((3 if last_state else 2) * hidden_size, num_classes)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """Logits of shape (batch.num_samples, num_classes); an empty batch gives (0, num_classes)."""
        return self.head(self.pooled(batch))

    def pooled(self, batch: PackedBatch) -> torch.Tensor:
        """What the head reads: each series' mean and max (and last frame) of the conv blocks' output, (n, 2H or
        3H)."""
        seg, lengths = batch.segment_ids, batch.lengths
        h = self.embed(series_features(batch.values, seg, lengths))
        n_frames, n_series = h.shape[0], lengths.shape[0]
        # Frame i of series s sits at i + (s + 1)·gap on the gapped axis: a gap before every series and after the last.
        where = torch.arange(n_frames, device=h.device) + (seg + 1) * self.gap
        span = bucketed_length(n_frames + (n_series + 1) * self.gap, self.length_buckets)
        mask = h.new_zeros(span).index_fill_(0, where, 1.0).view(1, 1, span)
        x = h.new_zeros(span, self.hidden_size).index_copy_(0, where, h).t().unsqueeze(0)
        for conv in self.convs:
            x = x + F.gelu(conv(x)) * mask
        h = x[0].t().index_select(0, where)
        pooled_max = h.new_zeros(n_series, self.hidden_size).scatter_reduce_(
            0, seg.unsqueeze(1).expand(-1, self.hidden_size), h, reduce="amax", include_self=False)
        pooled = [segment_mean(h, seg, lengths), pooled_max]
        if self.last_state:
            pooled.append(last_frames(h, batch.cu_seqlens))
        return torch.cat(pooled, dim=1)
