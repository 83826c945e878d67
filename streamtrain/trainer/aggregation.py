"""Weighted gradient aggregation as a DDP communication hook (CHRONICA Eq. 7, ScaDLES Eq. 4, LB-BSP §3.4).

Rank i holds g_i, the gradient of the *mean* loss over its own λ_i samples. The hook scales its
bucket by λ_i and all-reduces with SUM; once backward is done, the step (`StepRunner`) divides
every gradient by Σλ, so every rank ends with Σ_i (λ_i / Σλ) g_i. With λ = samples trained this is
exactly the gradient of the mean loss over the union of all ranks' samples, whatever the split,
including ranks with zero samples (g_i = 0, λ_i = 0: they add nothing and the other weights
renormalise through Σλ).

The step's own numbers, (λ_i, samples_i, stop_i, backlog_i, publish_i), travel in the first bucket's
all-reduce: appended to its gradients, summed with them, and split off when it completes. So a step
costs the collectives bare DDP's would, and none of its own (a second, separate all-reduce was a
fixed cost every step paid at every rank's pace: `bench overhead`). The stop flag rides along: a rank
asked to stop (SIGTERM) sets it, and every rank learns from the same sum that the group stops after
this step. A rank whose clock says a model version is due (`trainer.publish`) sets a publish flag the
same way. Gradients are float32 or float64 (`trainer.precision`): float32 holds the counts exactly up to
2^24 and the weights to 7 digits. With Top-k compression the numbers go in an all-reduce of their own, started by
the first hook.

The bucket all-reduces also carry the group's verdict on the step: a rank whose loss is not finite
(`mark_loss`) scales its buckets by NaN instead of λ_i, and non-finite gradients stay non-finite
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

#: The step's numbers, in the order they travel.
_WEIGHT, _SAMPLES, _STOP, _BACKLOG, _PUBLISH = range(5)


class AggregationState:
    """State of `aggregation_hook`: this step's weight and numbers, their global sums, and comm timings.

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
        self._own = [0.0] * 5
        self._own_tensor = torch.zeros(5, dtype=torch.float64)
        self._sums: torch.Tensor | None = None
        self._values: list[float] | None = None
        self._sums_done: torch.futures.Future[torch.Tensor] | None = None
        self._scale: torch.Tensor | float | None = None
        self._loss_finite: torch.Tensor | bool | None = None
        self._packed: torch.Tensor | None = None  # the first bucket with the numbers after it, reused step to step
        self.buffers: list[torch.Tensor] = []
        """This step's reduced buckets, in the order their hooks ran (with `gradient_as_bucket_view`, the gradients
        are views of them: `StepRunner` norms and scales them flat)."""
        self.hook_calls = 0
        """Buckets reduced this step."""
        self.blocking_seconds = 0.0
        """Time this step's hooks blocked backward (compression votes)."""
        self.last_hook_left_at: float | None = None
        """perf_counter when the last hook of this step returned: local gradients were all ready."""

    def begin_step(self, weight: float, samples: int, stop: bool = False, backlog: int = 0,
                   publish: bool = False) -> None:
        """Start the step: this rank's λ, sample count, stop flag, backlog and publish flag, summed over the group
        with the step's first bucket.

        Every rank must call this once per step, before the forward pass.

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
        self._own = [float(weight), float(samples), 1.0 if stop else 0.0, float(backlog), 1.0 if publish else 0.0]
        self._own_tensor = torch.tensor(self._own, dtype=torch.float64)  # made here, not inside backward's hook
        self._sums = None
        self._values = None
        self._sums_done = None
        self._scale = None
        self._loss_finite = None
        self.buffers = []
        self.hook_calls = 0
        self.blocking_seconds = 0.0
        self.last_hook_left_at = None
        if self.compressor is not None:
            self.compressor.begin_step()

    def mark_loss(self, loss: torch.Tensor) -> None:
        """Before backward: this rank's loss, so that a non-finite one poisons its buckets (see the module doc)."""
        if self.device.type == "cpu":  # read here, not inside backward's hook, where every host call costs more
            self._loss_finite = math.isfinite(loss.item())
        else:
            self._loss_finite = torch.isfinite(loss.detach())  # on the device: no host sync

    def scale(self) -> torch.Tensor | float:
        """λ_i (NaN after a non-finite `mark_loss`): what this rank's buckets are scaled by; a device scalar on an
        accelerator, whose loss is not read back to the host for it."""
        if self._scale is None:
            if not isinstance(self._loss_finite, torch.Tensor):  # the CPU's verdict, already a bool
                self._scale = self._weight if self._loss_finite is not False else math.nan
            else:
                scale = torch.tensor(self._weight, dtype=torch.float64, device=self.device)
                if self._loss_finite is not None:  # stays on the device: no host sync
                    scale = torch.where(self._loss_finite, scale, torch.full_like(scale, math.nan))
                self._scale = scale
        return self._scale

    def carry(self, buffer: torch.Tensor, scale: torch.Tensor | float) -> torch.futures.Future[torch.Tensor]:
        """All-reduce the step's first bucket, scaled by `scale` on its way into the packed tensor (one pass over it),
        with this rank's numbers appended; the future gives the bucket back."""
        size = buffer.numel()
        packed = self._packed
        if packed is None or packed.numel() != size + len(self._own) or packed.dtype != buffer.dtype \
                or packed.device != buffer.device:
            packed = self._packed = buffer.new_empty(size + len(self._own))
        torch.mul(buffer, scale, out=packed[:size])
        packed[size:].copy_(self._own_tensor)
        work = dist.all_reduce(packed, group=self.process_group, async_op=True)
        assert work is not None

        def split(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            out = fut.value()[0]
            self._sums = out[size:].to(torch.float64, copy=True)  # packed is written again next step
            buffer.copy_(out[:size])
            return buffer

        self._sums_done = work.get_future().then(split)
        return self._sums_done

    def send_alone(self) -> None:
        """All-reduce this rank's numbers in a collective of their own (async; read once backward is done)."""
        sums = torch.tensor(self._own, dtype=torch.float64, device=self.device)
        work = dist.all_reduce(sums, group=self.process_group, async_op=True)
        assert work is not None
        self._sums_done = work.get_future().then(lambda fut: fut.value()[0])

    def _read(self) -> list[float]:
        """The step's sums as numbers, read from the device once."""
        if self._values is None:
            if self._sums is None:
                if self._sums_done is None:
                    raise RuntimeError("the step's sums were never sent: no bucket was reduced since begin_step")
                self._sums = self._sums_done.wait()
            self._values = self._sums.tolist()
        return self._values

    def global_totals(self) -> tuple[float, int]:
        """(Σλ, Σ samples) over all ranks for this step (host sync; after backward)."""
        values = self._read()
        return float(values[_WEIGHT]), round(values[_SAMPLES])

    def group_stop(self) -> bool:
        """Whether any rank passed stop=True to this step's `begin_step` (the same answer on every rank)."""
        return self._read()[_STOP] > 0

    def group_backlog(self) -> int:
        """Σ of the ranks' `backlog` for this step (the same answer on every rank)."""
        return round(self._read()[_BACKLOG])

    def group_publish(self) -> bool:
        """Whether any rank passed publish=True to this step's `begin_step` (the same answer on every rank)."""
        return self._read()[_PUBLISH] > 0

    def end_step(self) -> None:
        """Close the step's compression statistics (call after backward)."""
        if self.compressor is not None:
            self.compressor.end_step()


def aggregation_hook(state: AggregationState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: reduce λ_i · g_i over the group (dense all-reduce, or adaptive Top-k), the step's numbers
    riding in the first bucket.

    Registered with `DistributedDataParallel.register_comm_hook(state, aggregation_hook)`. Unlike
    the default hook it does not divide by the world size: the step divides by Σλ once backward is done.
    """
    entered = time.perf_counter()
    buffer = bucket.buffer()
    state.buffers.append(buffer)
    scale = state.scale()
    if not isinstance(scale, float):
        scale = scale.to(buffer.dtype)
    first = state.hook_calls == 0
    future: torch.futures.Future[torch.Tensor]
    if first and state.compressor is None:
        future = state.carry(buffer, scale)
    else:
        buffer.mul_(scale)
        if first:
            state.send_alone()
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
