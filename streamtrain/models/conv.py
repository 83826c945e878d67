"""The default model: a small temporal conv net that runs on packed variable-length sequences.

Every layer works on the (total_size, H) packed tensor, so its cost is linear in the batch's total
size. A convolution must not look across a sample boundary: each frame gathers its k neighbours
and zeroes those of another segment (or off either end), which equals a per-sample Conv1d with
zero 'same' padding. Samples are then mean-pooled per segment with `index_add_`; with `last_state` the
hidden state of each sample's last frame joins the pool (a forecast needs where the series ends, which a
mean forgets).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .batching import PackedBatch

__all__ = ["MaskedConv1d", "PackedConvNet", "last_frames", "neighbour_index", "segment_mean"]


def neighbour_index(segment_ids: torch.Tensor, kernel_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows each frame's kernel reads and whether each read stays inside the frame's own sample.

    Args:
        segment_ids: (N,) int64 sample index of each packed frame (non-decreasing).
        kernel_size: Odd kernel width k.

    Returns:
        `(index, valid)`, both (N, k): `index` clamped into [0, N), `valid` false where the
        neighbour lies off the packed tensor or in another segment.
    """
    n = segment_ids.shape[0]
    radius = kernel_size // 2
    offsets = torch.arange(-radius, radius + 1, device=segment_ids.device)
    raw = torch.arange(n, device=segment_ids.device).unsqueeze(1) + offsets
    index = raw.clamp(0, max(n - 1, 0))
    valid = (raw >= 0) & (raw < n) & (segment_ids[index] == segment_ids.unsqueeze(1))
    return index, valid


def segment_mean(values: torch.Tensor, segment_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Mean of `values` (N, H) over each segment, giving (num_segments, H)."""
    sums = values.new_zeros(lengths.shape[0], values.shape[1]).index_add_(0, segment_ids, values)
    return sums / lengths.clamp_min(1).unsqueeze(1).to(values.dtype)


def last_frames(values: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """The last row of each segment of `values` (N, H), giving (num_segments, H); zeros for an empty segment."""
    ends = cu_seqlens[1:]
    rows = values[(ends - 1).clamp_min(0)] if values.shape[0] else values.new_zeros(ends.shape[0], values.shape[1])
    return rows * (ends > cu_seqlens[:-1]).unsqueeze(1).to(values.dtype)


class MaskedConv1d(nn.Module):
    """Conv1d over packed frames that never mixes two samples (one (k·H_in → H_out) matmul)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        # Weight layout [offset][channel] along the input axis; conv1d_weight() maps it to Conv1d's.
        self.linear = nn.Linear(kernel_size * in_channels, out_channels)

    def forward(self, x: torch.Tensor, index: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        gathered = x[index] * valid.unsqueeze(-1).to(x.dtype)
        return self.linear(gathered.reshape(x.shape[0], self.linear.in_features))

    def conv1d_weight(self) -> torch.Tensor:
        """The equivalent `nn.Conv1d` weight of shape (out, in, k)."""
        out_channels = self.linear.out_features
        return self.linear.weight.view(out_channels, self.kernel_size, -1).permute(0, 2, 1)


class PackedConvNet(nn.Module):
    """Frames → linear embedding → residual masked-conv blocks → per-sample mean → class logits.

    Args:
        num_features: Features per frame (F).
        num_classes: Logits per sample.
        hidden_size: Channels (H).
        num_layers: Residual conv blocks.
        kernel_size: Odd temporal kernel width.
        last_state: Pool each sample's last frame beside its mean (for `forecast`).
    """

    def __init__(
        self, num_features: int, num_classes: int, hidden_size: int = 64, num_layers: int = 2, kernel_size: int = 5,
        last_state: bool = False,
    ) -> None:
        super().__init__()
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd, got {kernel_size}")
        self.kernel_size = kernel_size
        self.last_state = last_state
        self.embed = nn.Linear(num_features, hidden_size)
        self.convs = nn.ModuleList(MaskedConv1d(hidden_size, hidden_size, kernel_size) for _ in range(num_layers))
        self.head = nn.Linear(hidden_size * (2 if last_state else 1), num_classes)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """Logits of shape (batch.num_samples, num_classes); an empty batch gives (0, num_classes)."""
        index, valid = neighbour_index(batch.segment_ids, self.kernel_size)
        h = self.embed(batch.values)
        for conv in self.convs:
            h = h + F.gelu(conv(h, index, valid))
        pooled = segment_mean(h, batch.segment_ids, batch.lengths)
        if self.last_state:
            pooled = torch.cat([pooled, last_frames(h, batch.cu_seqlens)], dim=1)
        return self.head(pooled)
