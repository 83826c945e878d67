"""Adaptive Top-k sparsification of gradient buckets (ScaDLES §IV).

A bucket goes sparse only when Top-k keeps nearly all of its energy on *every* rank:
`| ‖g‖² - ‖Topk(g)‖² | / ‖g‖² ≤ δ`. The ranks vote with one tiny all-reduce per bucket, so all of
them run the same collective afterwards (all-gather of (indices, values) or a dense all-reduce);
without the vote a rank sending sparse and one sending dense would deadlock or mix garbage.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["CompressionStats", "TopKCompressor", "energy_loss", "topk"]

logger = logging.getLogger(__name__)


def topk(flat: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices and values of the k entries of largest magnitude of a 1-D tensor."""
    _, index = flat.abs().topk(k, sorted=False)
    return index, flat[index]


def energy_loss(flat: torch.Tensor, kept: torch.Tensor) -> float:
    """Relative energy lost by keeping only `kept`: |‖g‖² - ‖kept‖²| / ‖g‖² (0 for a zero gradient)."""
    total = float(flat.double().pow(2).sum())
    if total == 0.0:
        return 0.0
    return abs(total - float(kept.double().pow(2).sum())) / total


@dataclass
class CompressionStats:
    """Running counts of what the compressor sent; the compressed-step ratio is ScaDLES' CNC ratio."""

    steps: int = 0
    compressed_steps: int = 0
    buckets: int = 0
    compressed_buckets: int = 0
    elements_sent: int = 0
    """Floats (plus as many indices) this rank contributed, to compare with `elements_dense`."""
    elements_dense: int = 0

    @property
    def compressed_step_ratio(self) -> float:
        """Share of steps in which every bucket went sparse (0 before the first step)."""
        return self.compressed_steps / self.steps if self.steps else 0.0

    @property
    def compressed_bucket_ratio(self) -> float:
        """Share of buckets sent sparse."""
        return self.compressed_buckets / self.buckets if self.buckets else 0.0


class TopKCompressor:
    """Reduces (sums) one flat bucket over the group, sparse or dense as the ranks agree.

    Args:
        ratio: Fraction of entries Top-k keeps, in (0, 1].
        delta: Energy-loss threshold δ; 0 only ever compresses lossless buckets.
        process_group: Group to reduce over (None: the default group).
    """

    def __init__(self, ratio: float, delta: float, process_group: dist.ProcessGroup | None = None) -> None:
        if not 0 < ratio <= 1:
            raise ValueError(f"topk ratio must be in (0, 1], got {ratio}")
        if delta < 0:
            raise ValueError(f"compression delta must be >= 0, got {delta}")
        self.ratio = ratio
        self.delta = delta
        self.process_group = process_group
        self.stats = CompressionStats()
        self.decisions: list[bool] = []
        """Sparse (True) or dense per bucket in the current step, in hook order."""

    def begin_step(self) -> None:
        """Forget the last step's per-bucket decisions."""
        self.decisions = []

    def end_step(self) -> None:
        """Count the finished step as compressed when it had buckets and all of them went sparse."""
        self.stats.steps += 1
        if self.decisions and all(self.decisions):
            self.stats.compressed_steps += 1

    def reduce(self, flat: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
        """Sum `flat` (already weighted) over the group: Σ_i Topk(g_i) when every rank agrees, else Σ_i g_i.

        Blocks on the vote (a sync point inside backward); the data collective itself is async.
        """
        numel = flat.numel()
        k = min(numel, max(1, math.ceil(self.ratio * numel)))
        index, values = topk(flat, k)
        # `not <=`: a non-finite bucket (NaN energy) votes dense, so the group's verdict on the step reaches everyone.
        vote_dense = k >= numel or not energy_loss(flat, values) <= self.delta
        votes = torch.tensor([1.0 if vote_dense else 0.0], device=flat.device)
        dist.all_reduce(votes, group=self.process_group)
        sparse = float(votes.item()) == 0.0  # .item() syncs the device stream on CUDA
        self.decisions.append(sparse)
        self.stats.buckets += 1
        self.stats.elements_dense += numel
        if not sparse:
            self.stats.elements_sent += numel
            work = dist.all_reduce(flat, group=self.process_group, async_op=True)
            assert work is not None
            return work.get_future().then(lambda fut: fut.value()[0])
        self.stats.compressed_buckets += 1
        self.stats.elements_sent += k
        world = dist.get_world_size(self.process_group)
        all_index = [torch.empty_like(index) for _ in range(world)]
        all_values = [torch.empty_like(values) for _ in range(world)]
        index_work = dist.all_gather(all_index, index, group=self.process_group, async_op=True)
        values_work = dist.all_gather(all_values, values, group=self.process_group, async_op=True)
        assert index_work is not None and values_work is not None

        def densify(_: torch.futures.Future[object]) -> torch.Tensor:
            index_work.wait()
            dense = torch.zeros_like(flat)
            # index_add_ accumulates where two ranks picked the same entry.
            for idx, val in zip(all_index, all_values, strict=True):
                dense.index_add_(0, idx, val)
            return dense

        return values_work.get_future().then(densify)
