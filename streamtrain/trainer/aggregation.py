"""Weighted gradient aggregation as a DDP communication hook (CHRONICA Eq. 7, ScaDLES Eq. 4, LB-BSP §3.4).

Rank i holds g_i, the gradient of the *mean* loss over its own λ_i samples. The hook scales its
bucket by λ_i / Σλ and all-reduces with SUM, so every rank ends with Σ_i (λ_i / Σλ) g_i. With
λ = samples trained this is exactly the gradient of the mean loss over the union of all ranks'
samples, whatever the split, including ranks with zero samples (g_i = 0, λ_i = 0: they add
nothing and the other weights renormalise through Σλ).

Σλ must be known before the first bucket is scaled: `AggregationState.begin_step` starts an
async all-reduce of (λ_i, samples_i, stop_i) before the forward pass, and the first hook of the
step waits on it, so that collective overlaps the whole forward and most of the backward. The stop
flag rides along for free: a rank asked to stop (SIGTERM) sets it, and every rank learns from the
same sum that the group stops after this step, with no collective of its own. A rank whose clock says a model
version is due (`trainer.publish`) sets a publish flag the same way.

The bucket all-reduces also carry the group's verdict on the step: a rank whose loss is not finite
(`mark_loss`) scales its buckets by NaN instead of λ_i/Σλ, and non-finite gradients stay non-finite
under any scale, so one bad rank makes every rank's reduced gradient non-finite. Every rank then sees
the same reduced gradient, checks it, and skips the same steps (`StepRunner`), with no extra collective.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations as live objects.
import logging
import math
import time

import torch
import torch.distributed as dist

from .compression import TopKCompressor

__all__ = ["AggregationState", "aggregation_hook"]

logger = logging.getLogger(__name__)


class AggregationState:
    """State of `aggregation_hook`: this step's weights, their global sums, and comm timings.

    Args:
        device: Device of the gradients (where the weight tensors live).
        process_group: Group to reduce over (None: the default group).
        compressor: Adaptive Top-k compressor, or None to always all-reduce dense.
    """

    def __init__(
        self,
        device: torch.device,
        process_group: dist.ProcessGroup | None = None,
        compressor: TopKCompressor | None = None,
    ) -> None:
        self.device = device
        self.process_group = process_group
        self.compressor = compressor
        self._weight = 0.0
        self._sums = torch.zeros(5, dtype=torch.float64, device=device)
        self._sums_work: dist.Work | None = None
        self._scale: torch.Tensor | None = None
        self._loss_finite: torch.Tensor | None = None
        self.hook_calls = 0
        """Buckets reduced this step."""
        self.blocking_seconds = 0.0
        """Time this step's hooks blocked backward (waiting for Σλ, compression votes)."""
        self.last_hook_left_at: float | None = None
        """perf_counter when the last hook of this step returned: local gradients were all ready."""

    def begin_step(self, weight: float, samples: int, stop: bool = False, backlog: int = 0,
                   publish: bool = False) -> None:
        """Start the step: send this rank's λ, sample count, stop flag, backlog and publish flag (async all-reduce,
        no wait).

        Every rank must call this once per step, before the forward pass, in the same order
        relative to other collectives.

        Args:
            weight: λ_i, this rank's aggregation weight (0 when it trains nothing).
            samples: Samples this rank trains this step (summed into the global batch).
            stop: This rank wants the group to stop after this step (see `group_stop`).
            backlog: Reported samples this rank keeps buffered past this step (see `group_backlog`).
            publish: This rank wants a model version published after this step (see `group_publish`).
        """
        if weight < 0:
            raise ValueError(f"aggregation weight must be >= 0, got {weight}")
        self._weight = float(weight)
        values = [float(weight), float(samples), 1.0 if stop else 0.0, float(backlog), 1.0 if publish else 0.0]
        self._sums = torch.tensor(values, dtype=torch.float64, device=self.device)
        self._sums_work = dist.all_reduce(self._sums, group=self.process_group, async_op=True)
        self._scale = None
        self._loss_finite = None
        self.hook_calls = 0
        self.blocking_seconds = 0.0
        self.last_hook_left_at = None
        if self.compressor is not None:
            self.compressor.begin_step()

    def _wait_sums(self) -> None:
        if self._sums_work is not None:
            self._sums_work.wait()
            self._sums_work = None

    def mark_loss(self, loss: torch.Tensor) -> None:
        """Before backward: this rank's loss, so that a non-finite one poisons its buckets (see the module doc)."""
        self._loss_finite = torch.isfinite(loss.detach())  # on the device: no host sync

    def scale(self) -> torch.Tensor:
        """λ_i / Σλ as a device scalar (0 when Σλ = 0; NaN after a non-finite `mark_loss`); waits for the weight
        all-reduce once."""
        if self._scale is None:
            self._wait_sums()
            # Stays on the device: no host sync is needed to scale buckets, even on CUDA.
            scale = self._weight / self._sums[0].clamp_min(torch.finfo(torch.float64).tiny)
            if self._loss_finite is not None:
                scale = torch.where(self._loss_finite, scale, torch.full_like(scale, math.nan))
            self._scale = scale
        return self._scale

    def global_totals(self) -> tuple[float, int]:
        """(Σλ, Σ samples) over all ranks for this step; waits for the weight all-reduce (host sync)."""
        self._wait_sums()
        total_weight, total_samples, *_flags = self._sums.tolist()
        return float(total_weight), round(total_samples)

    def group_stop(self) -> bool:
        """Whether any rank passed stop=True to this step's `begin_step` (the same answer on every rank)."""
        self._wait_sums()
        return bool(self._sums[2].item() > 0)

    def group_backlog(self) -> int:
        """Σ of the ranks' `backlog` for this step (the same answer on every rank)."""
        self._wait_sums()
        return round(self._sums[3].item())

    def group_publish(self) -> bool:
        """Whether any rank passed publish=True to this step's `begin_step` (the same answer on every rank)."""
        self._wait_sums()
        return bool(self._sums[4].item() > 0)

    def end_step(self) -> None:
        """Close the step's compression statistics (call after backward)."""
        if self.compressor is not None:
            self.compressor.end_step()


def aggregation_hook(state: AggregationState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: reduce λ_i/Σλ · g_i over the group (dense all-reduce, or adaptive Top-k).

    Registered with `DistributedDataParallel.register_comm_hook(state, aggregation_hook)`. Unlike
    the default hook it does not divide by the world size: the weights already sum to one.
    """
    entered = time.perf_counter()
    buffer = bucket.buffer()
    buffer.mul_(state.scale().to(buffer.dtype))
    future: torch.futures.Future[torch.Tensor]
    if state.compressor is not None:
        future = state.compressor.reduce(buffer)
    else:
        work = dist.all_reduce(buffer, group=state.process_group, async_op=True)
        assert work is not None
        future = work.get_future().then(lambda fut: fut.value()[0])
    left = time.perf_counter()
    state.hook_calls += 1
    state.blocking_seconds += left - entered
    state.last_hook_left_at = left
    return future
