"""One DDP step of one rank over the samples it was given: collate, forward, backward, optimizer step.

The Kafka-facing rank loop builds a `StepRunner` once (`build_step_runner`) and calls `run_step`
every step with whatever samples the plan gave this rank, possibly none:

    ctx = init_distributed(config.trainer)             # RANK / WORLD_SIZE / MASTER_* as torchrun
    runner = build_step_runner(config.trainer, ctx)
    result = runner.run_step(samples)                  # StepResult: timings, loss, memory, ...

Every rank must call `run_step` the same number of times: each call is a set of collectives.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from streamtrain.config.trainer import TrainerConfig
from streamtrain.models.batching import Batch
from streamtrain.models.plugins import CollateFn, build_collate, build_model, check_plugins
from streamtrain.models.standardise import InputEstimate
from streamtrain.objectives import Objective, build_objective, read_sums
from streamtrain.wire import Sample

from .aggregation import AggregationState, aggregation_hook
from .averaging import WeightAverage
from .compression import CompressionStats, TopKCompressor
from .distributed import (
    DistContext,
    keep_freed_memory,
    malloc_in_use,
    peak_memory_bytes,
    reserve_memory,
    reset_peak_memory,
)

__all__ = ["NON_FINITE_LOSS", "StepResult", "StepRunner", "build_optimizer", "build_step_runner", "linear_lr_scale"]

logger = logging.getLogger(__name__)

#: Dead-letter reason of the samples of a step skipped because a loss or the aggregated gradient was not finite.
NON_FINITE_LOSS = "non-finite-loss"


@dataclass(frozen=True)
class StepResult:
    """What one rank did in one step (the measured half of `StepFeedback`)."""

    samples: int
    total_size: int
    loss: float | None
    """Mean loss over this rank's samples; None when it trained none."""
    weight: float
    """λ_i this rank contributed with."""
    global_weight: float
    """Σλ over all ranks."""
    global_samples: int
    """Samples over all ranks: the global batch."""
    lr: float
    """Learning rate the optimizer step used (of the first parameter group)."""
    stepped: bool
    """False when the whole group trained nothing, or the step was skipped, so the optimizer was not stepped."""
    collate_seconds: float
    compute_seconds: float
    """Collate, forward, backward and optimizer time, less the exposed communication."""
    comm_seconds: float
    """Communication backward waited for: blocking in hooks plus the tail after the last hook."""
    step_seconds: float
    memory_bytes: int
    """Peak memory of the step: CUDA max allocated; on the CPU, peak RSS over the last `CPU_MEMORY_WINDOW` steps
    measured."""
    compressed_buckets: int = 0
    buckets: int = 0
    stop: bool = False
    """Some rank asked the group to stop after this step (every rank sees the same value)."""
    group_backlog: int = 0
    """Σ over the ranks of the `backlog` they passed (every rank sees the same value)."""
    cpu_seconds: float = 0.0
    """CPU time of the training thread in the step (collate to optimizer step)."""
    skipped: bool = False
    """Some rank's loss or the aggregated gradient was not finite: no rank stepped (every rank sees the same
    value); this rank's samples were not trained."""
    grad_norm: float | None = None
    """L2 norm of the aggregated gradient before clipping (the same on every rank); None when nobody trained."""
    prequential: dict[str, float] = field(default_factory=dict)
    """Test-then-train: the objective's metric sums of this rank's samples under the model as it was before the
    step, from the step's own forward pass (empty when it trained none or the step was skipped)."""
    publish: bool = False
    """Some rank asked for a model version after this step (every rank sees the same value)."""


#: Steps over which a CPU rank's peak memory (peak RSS) is measured: reset at a window's first step, read after its
#: first and its last, and the last figure read reported by every step (reading /proc every step was a fixed cost of
#: each, bench overhead). A GPU's peak is the step's own.
CPU_MEMORY_WINDOW = 10

#: Parameter dtypes the fused optimizers take.
_FUSED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def linear_lr_scale(global_batch: int, base_batch: int, max_scale: float) -> float:
    """Linear scaling rule: global_batch / base_batch, capped at `max_scale` (0 for an empty batch)."""
    return min(global_batch / base_batch, max_scale)


def build_optimizer(model: nn.Module, config: TrainerConfig) -> torch.optim.Optimizer:
    """The configured optimizer over `model`'s trainable parameters at the base learning rate."""
    params = [p for p in model.parameters() if p.requires_grad]
    # The fused kernels update every parameter in one call (CPU and CUDA alike): on a small model the per-tensor
    # loop was most of the optimizer's time, a cost every step pays whatever its batch (bench overhead).
    fused = bool(params) and all(p.dtype in _FUSED_DTYPES for p in params)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, fused=fused or None)
    return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay,
                           fused=fused or None)


class StepRunner:
    """Runs DDP steps of one rank with weighted aggregation and optional Top-k compression.

    Args:
        model: The model wrapped in DDP with `aggregation_hook` registered on `state`.
        optimizer: Optimizer over the model's parameters; its current learning rates are the base.
        state: The hook's state.
        config: Trainer settings (loss weighting, learning-rate scaling).
        collate: Samples → batch.
        device: Device the model lives on.
        objective: Loss and metrics of the outputs (default: the one `trainer.objective` names).
    """

    def __init__(
        self,
        model: DistributedDataParallel,
        optimizer: torch.optim.Optimizer,
        state: AggregationState,
        config: TrainerConfig,
        collate: CollateFn,
        device: torch.device,
        *,
        objective: Objective | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.state = state
        self.config = config
        self.collate = collate
        self.objective = objective if objective is not None else build_objective(config)
        self.device = device
        self.base_lrs = [float(group["lr"]) for group in optimizer.param_groups]
        self.steps = 0
        self.skipped_steps = 0
        self._memory_bytes = 0
        self._params = [p for p in model.module.parameters() if p.requires_grad]
        self._one_dtype = len({p.dtype for p in self._params}) <= 1
        self._grad_elements = sum(p.numel() for p in self._params)
        # Float buffers (e.g. batch-norm statistics) change in the forward pass: a skipped step restores them.
        self._buffers = [b for b in model.module.buffers() if b.is_floating_point()]
        self.average = WeightAverage(model.module, config.ema_decay) if config.ema_decay > 0 else None
        """The moving average of the weights that evaluations and versions use (`trainer.ema_decay`; None: off)."""
        self._sums_over_ranks = getattr(model.module, "sum_over_ranks", None)
        """A model's hook to sum statistics of its own over the ranks (`seqflat`'s ridge head): called on every rank
        once a step, after the optimizer's step, with an in-place all-reduce of a tensor."""
        self.inputs: InputEstimate | None = None
        """The online estimate of the input standardisation while it warms up (`streamtrain.models.standardise`;
        set by the rank when `trainer.input_shift` is unset): folded in before each step's collate."""

    @property
    def handed_out(self) -> nn.Module:
        """The bare module held-out evaluations and published versions use: the moving average of the weights when
        `trainer.ema_decay` is set, else the live model."""
        return self.average.module if self.average is not None else self.model.module

    @property
    def compression_stats(self) -> CompressionStats | None:
        """Counts of sparse and dense buckets and steps, when compression is on."""
        return self.state.compressor.stats if self.state.compressor is not None else None

    def _weight_of(self, samples: Sequence[Sample]) -> float:
        if self.config.aggregation == "mean":
            return 1.0  # conventional DDP: every rank counts the same, even an idle one
        if self.config.weight_by == "size":
            return float(sum(s.size for s in samples))
        return float(len(samples))

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # host timers only mean something after the kernels ran

    def run_step(
        self,
        samples: Sequence[Sample],
        weight: float | None = None,
        lr_scale: float | None = None,
        *,
        stop: bool = False,
        backlog: int = 0,
        publish: bool = False,
    ) -> StepResult:
        """Train one step on `samples` (possibly none) together with the other ranks.

        Args:
            samples: This rank's samples for the step.
            weight: λ_i override (e.g. the plan's aggregation weight); default from
                `config.aggregation` / `config.weight_by` and the samples themselves.
            lr_scale: Learning-rate scale override (e.g. the plan's); default the linear rule on
                the measured global batch. Ignored when `config.lr_scaling` is off.
            stop: This rank asks the group to stop after this step; the answer (any rank asked)
                is `StepResult.stop`. It rides on the step's weight all-reduce: no extra collective.
            backlog: Samples the coordinator knew of that this rank keeps past the step; summed over the
                ranks into `StepResult.group_backlog` on the same all-reduce.
            publish: This rank asks for a model version after this step; the answer (any rank asked) is
                `StepResult.publish`, on the same all-reduce.

        Returns:
            Timings, loss, sizes and memory of the step.
        """
        window_starts = self._memory_window()
        started = time.perf_counter()
        cpu_started = time.thread_time()  # forward, backward (CPU autograd) and the optimizer run on this thread
        batch = self._batch_of(samples)
        collated = time.perf_counter()
        own_weight = self._weight_of(samples) if weight is None else float(weight)
        self.state.begin_step(own_weight, batch.num_samples, stop, backlog, publish)
        self.optimizer.zero_grad(set_to_none=True)
        self._train_mode()
        saved = [b.detach().clone() for b in self._buffers]
        loss, scored = self._forward(batch)
        self.state.mark_loss(loss)
        loss.backward()  # returns once every bucket's hook future has completed
        self._sync()
        backward_done = time.perf_counter()
        self.state.end_step()
        comm = self.state.blocking_seconds
        if self.state.last_hook_left_at is not None:
            comm += backward_done - self.state.last_hook_left_at
        global_weight, global_samples = self.state.global_totals()
        lr = self._apply_lr(global_samples, lr_scale)
        grad_norm = self._finish_gradients(global_weight) if global_samples > 0 else None
        # Every rank holds the same reduced gradient, so every rank reaches the same verdict (see aggregation).
        skipped = grad_norm is not None and not math.isfinite(grad_norm)
        # An empty global batch has all-zero gradients; stepping would still apply momentum and decay.
        stepped = global_samples > 0 and not skipped
        self._end_step(stepped, skipped, saved)
        loss_value = float(loss.detach()) if batch.num_samples > 0 else None
        prequential = {} if scored is None or skipped else self._scores(scored, batch)
        self._sync()
        finished = time.perf_counter()
        cpu_seconds = time.thread_time() - cpu_started
        if window_starts or (self.steps + 1) % CPU_MEMORY_WINDOW == 0:
            self._memory_bytes = peak_memory_bytes(self.device)
        self.steps += 1
        decisions = self.state.compressor.decisions if self.state.compressor is not None else []
        return StepResult(
            samples=batch.num_samples,
            total_size=batch.total_size,
            loss=loss_value,
            weight=own_weight,
            global_weight=global_weight,
            global_samples=global_samples,
            lr=lr,
            stepped=stepped,
            collate_seconds=collated - started,
            compute_seconds=max(0.0, finished - started - comm),
            comm_seconds=comm,
            step_seconds=finished - started,
            memory_bytes=self._memory_bytes,
            compressed_buckets=sum(decisions),
            buckets=self.state.hook_calls,
            stop=self.state.group_stop(),
            group_backlog=self.state.group_backlog(),
            cpu_seconds=cpu_seconds,
            skipped=skipped,
            grad_norm=grad_norm,
            prequential=prequential,
            publish=self.state.group_publish(),
        )

    def _memory_window(self) -> bool:
        """Start a window of the peak-memory figure when this step begins one (every step on a GPU; see
        `CPU_MEMORY_WINDOW`); whether it did."""
        starts = self.device.type != "cpu" or self.steps % CPU_MEMORY_WINDOW == 0
        if starts:
            reset_peak_memory(self.device)
        return starts

    def _batch_of(self, samples: Sequence[Sample]) -> Batch:
        """The step's batch on the device, the input estimate folded in first while it warms up (a collective)."""
        if self.inputs is not None and not self.inputs.frozen:
            self.config = self.inputs.update(samples, self.config, self._sum_over_ranks)
        batch = self.collate(samples, self.config)
        # A collate packs on the CPU: moving a CPU batch there would walk its fields for nothing.
        return batch if self.device.type == "cpu" else batch.to(self.device)

    def _train_mode(self) -> None:
        """Training mode, set only when an evaluation left the model off it (`train()` walks every module)."""
        if not (self.model.training and self.model.module.training):
            self.model.train()

    def _end_step(self, stepped: bool, skipped: bool, saved: list[torch.Tensor]) -> None:
        """The optimizer's step, or a skipped step's buffers restored; then the model's own sums over the ranks."""
        if stepped:
            self._optimizer_step()
        elif skipped:
            self.skipped_steps += 1
            with torch.no_grad():
                for buffer, before in zip(self._buffers, saved, strict=True):
                    buffer.copy_(before)
        if self._sums_over_ranks is not None:  # on every rank, idle ones too: it may run a collective
            self._sums_over_ranks(self._all_reduce)

    def _optimizer_step(self) -> None:
        self.optimizer.step()
        if self.average is not None:
            self.average.update(self.model.module)

    @staticmethod
    def _all_reduce(tensor: torch.Tensor) -> None:
        """Sum `tensor` over the ranks, in place (nothing when alone)."""
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(tensor)

    def _sum_over_ranks(self, local: np.ndarray) -> np.ndarray:
        summed = torch.as_tensor(local, dtype=torch.float64, device=self.device)
        self._all_reduce(summed)
        return summed.cpu().numpy()

    def _forward(self, batch: Batch) -> tuple[torch.Tensor, Mapping[str, torch.Tensor | float] | None]:
        """The step's loss (this rank's mean over its samples: the hook weights it by lambda_i) and, from the same
        outputs, the objective's metric sums of the samples under the model before the step (test, then train);
        a rank with no samples gets an exact zero that reaches every parameter, and no sums."""
        if batch.num_samples == 0:
            return self._idle_loss(batch), None
        outputs = self.model(batch)
        return self.objective.losses(outputs, batch).mean(), self.objective.metric_sums(outputs.detach(), batch)

    def _idle_loss(self, batch: Batch) -> torch.Tensor:
        """An exact zero that reaches every parameter, for a rank with no samples, without running the model's layers.

        DDP all-reduces a bucket only once every parameter in it has a gradient, and every rank must run the same
        collectives, so an idle rank still runs forward and backward (`no_sync` would skip its all-reduces while the
        others wait in theirs); the aggregation hook gives it weight 0. DDP's forward must run (its reducer then
        expects this step's gradients), but the model's layers over an empty batch cost as much as over one sample
        (~3.6 ms of CPU on Tecator's model, ~1 ms without): a fixed cost of every idle step, paid `factor` times by
        an emulated slow device that sits a step out (coordinator.sit_out_every). For this call the module's
        forward is the zero that reaches every parameter, and nothing else.
        """
        module = self.model.module
        try:
            module.forward = self._touch_all  # an instance attribute: DDP's call of the module runs it instead
        except (AttributeError, RuntimeError, TypeError):  # a module that takes no attribute (TorchScript): its layers
            return (self.model(batch).sum() + self._touch_all()) * 0.0
        try:
            return self.model(None) * 0.0
        finally:
            del module.forward

    def _touch_all(self, *_: object) -> torch.Tensor:
        return torch.stack([p.sum() for p in self._params]).sum() if self._params else torch.zeros(())

    def _scores(self, scored: Mapping[str, torch.Tensor | float], batch: Batch) -> dict[str, float]:
        """The step's test-then-train sums as numbers (none when they are not finite); then the baseline learns
        from the samples, which it too was scored on before they were trained."""
        sums = read_sums(scored)
        if not all(math.isfinite(v) and v >= 0 for v in sums.values()):  # the objective broke its contract here
            logger.warning("step %d: test-then-train sums not finite or negative (%s), left out of the figures",
                           self.steps, ", ".join(k for k, v in sums.items() if not (math.isfinite(v) and v >= 0)))
            return {}
        self.objective.observe(batch)
        return sums

    def _finish_gradients(self, total_weight: float) -> float:
        """Turn the reduced gradient, Σ λ_i g_i, into the weighted mean (over Σλ, see aggregation), clipped to
        `max_grad_norm` when that is set, in one fused multiply; returns the mean's L2 norm before clipping (a
        host sync; not finite when some rank's loss or gradient was not)."""
        grads = self._flat_gradients()
        if grads is None:
            grads = [p.grad for p in self._params if p.grad is not None]
        if not grads:
            return 0.0
        over = 1.0 / total_weight if total_weight > 0 else 1.0  # Σλ = 0: exact zeros, left as they are
        norm = float(self._total_norm(grads)) * over
        factor = over
        if self.config.max_grad_norm > 0 and norm > self.config.max_grad_norm:  # as clip_grad_norm_ clips
            factor *= self.config.max_grad_norm / (norm + 1e-6)
        if factor != 1.0:
            torch._foreach_mul_(grads, factor)
        return norm

    def _flat_gradients(self) -> list[torch.Tensor] | None:
        """The step's reduced buckets, when the gradients are views of them and they hold every gradient (None
        otherwise): a norm and a multiply over one flat bucket each, where per-tensor calls cost on the CPU as many
        passes as the model has parameter tensors (bench overhead)."""
        buffers = self.state.buffers
        if not (self.model.gradient_as_bucket_view and buffers):
            return None
        if sum(b.numel() for b in buffers) != self._grad_elements:
            return None
        return buffers

    def _total_norm(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """The L2 norm over every gradient: one fused norm of each and one of those, where the parameters share a
        dtype (`get_total_norm` moves each tensor's norm to one device first, a dozen calls a step for nothing)."""
        if not self._one_dtype:
            return torch.nn.utils.get_total_norm(grads)
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))

    def _apply_lr(self, global_samples: int, lr_scale: float | None) -> float:
        if not self.config.lr_scaling:
            scale = 1.0
        elif lr_scale is not None:
            scale = lr_scale
        else:
            scale = linear_lr_scale(global_samples, self.config.base_batch, self.config.max_lr_scale)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base * scale
        return float(self.optimizer.param_groups[0]["lr"])


def build_step_runner(config: TrainerConfig, ctx: DistContext) -> StepRunner:
    """Model, DDP wrapper with the aggregation hook, optimizer and collate function of one rank.

    Args:
        config: Trainer settings.
        ctx: This rank's process group context (`init_distributed`).

    Raises:
        TrainerSetupError: `config.model` or `config.collate` cannot be resolved or fail the probe batch
            (`check_plugins`).
    """
    collate = build_collate(config)  # resolve plug-ins first: a bad path fails before any collective
    if ctx.device.type == "cpu":
        if config.keep_freed_memory and malloc_in_use() == "system":
            keep_freed_memory()
        reserve_memory(config.memory_reserve_mb)
        logger.info("rank %d: %s allocator, %d MiB reserved", ctx.rank, malloc_in_use(), config.memory_reserve_mb)
    objective = build_objective(config)
    model = build_model(config, objective.output_width())
    check_plugins(model, collate, config, objective)  # a plug-in that raises or answers wrong fails here, by name
    model = model.to(ctx.device)
    ddp = DistributedDataParallel(
        model,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        bucket_cap_mb=config.bucket_cap_mb,
        gradient_as_bucket_view=True,
    )
    compressor = TopKCompressor(config.topk_ratio, config.compression_delta) if config.compression else None
    state = AggregationState(ctx.device, compressor=compressor)
    ddp.register_comm_hook(state, aggregation_hook)
    optimizer = build_optimizer(ddp.module, config)
    logger.info(
        "rank %d: %s aggregation (lambda = %s), compression %s, lr scaling %s",
        ctx.rank,
        config.aggregation,
        config.weight_by,
        f"top-{config.topk_ratio:g} delta {config.compression_delta:g}" if config.compression else "off",
        f"on (base batch {config.base_batch})" if config.lr_scaling else "off",
    )
    return StepRunner(ddp, optimizer, state, config, collate, ctx.device, objective=objective)
