"""Held-out evaluation while training: the objective's metrics of the shared model on a test split.

Which samples: `trainer.eval_path` (any file or directory dataset replay reads, e.g. a `*_TEST.ts`) or
`trainer.eval_packaged` (a packaged dataset's test split, e.g. PLAID_TEST.ts), optionally cut to a
class-stratified `trainer.eval_max_samples`. Who evaluates: every rank, each its own slice — the
samples dealt out by size so every slice holds about the same total size, hence takes about the same
time — and one all-reduce of the metric sums gives every rank the result. Sharding keeps
the pause short: rank 0 alone would hold every other rank at the next step's collectives for the whole
set. Each rank collates its slice once at start-up (which also checks `trainer.collate` and the
held-out samples' shape before training starts).

What is measured is the objective's (`streamtrain.objectives`): accuracy for classification, MAE and RMSE
for regression and forecasts, F1 for multi-label, each beside its baseline's. The baseline is scored with
what the whole fleet has trained so far (the ranks' baseline states added up first: the training mean,
the most common class), so it is the same model-free guess whichever rank scores a sample.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from streamtrain.config.producer import DatasetConfig
from streamtrain.config.trainer import TrainerConfig
from streamtrain.datasets import Dataset, DatasetError, load_dataset, packaged_file, stratified_subset
from streamtrain.models.batching import Batch
from streamtrain.models.plugins import CollateFn
from streamtrain.objectives import Objective, add_sums, build_objective, read_sums
from streamtrain.wire import Sample

from .distributed import DistContext
from .errors import TrainerSetupError

__all__ = ["HeldOutEvaluator", "HeldOutResult", "deal_by_size", "held_out_source"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeldOutResult:
    """One evaluation, combined over every rank."""

    step: int
    samples: int
    accuracy: float | None
    """Classification's accuracy (None for other objectives)."""
    loss: float
    seconds: float
    """This rank's wall time from the evaluation's start to the combined result (the pause in training)."""
    metrics: dict[str, float]
    """The objective's metrics and its baseline's (`Objective.summarise` of the summed metric sums)."""


def held_out_source(config: TrainerConfig) -> tuple[str, Path, str] | None:
    """(what to call it, the file or directory, the setting that named it), or None when nothing is configured.

    Raises:
        TrainerSetupError: the packaged dataset is not installed.
    """
    if config.eval_packaged is not None:
        try:
            return config.eval_packaged, packaged_file(config.eval_packaged, "test"), "trainer.eval_packaged"
        except DatasetError as exc:
            raise TrainerSetupError(f"trainer.eval_packaged: {exc}") from None
    if config.eval_path is not None:
        return str(config.eval_path), config.eval_path, "trainer.eval_path"
    return None


def deal_by_size(sizes: np.ndarray, rank: int, world: int) -> np.ndarray:
    """This rank's indices when samples are dealt largest first, back and forth over the ranks (a snake), so
    every rank's total size is about the same."""
    order = np.argsort(-sizes, kind="stable")
    turns = np.arange(len(order)) % (2 * world)
    owner = np.where(turns < world, turns, 2 * world - 1 - turns)
    return np.sort(order[owner == rank])


def _chunks(samples: Sequence[Sample], max_size: int) -> list[list[Sample]]:
    out: list[list[Sample]] = []
    for sample in samples:
        if not out or (sum(s.size for s in out[-1]) + sample.size > max_size and out[-1]):
            out.append([])
        out[-1].append(sample)
    return out


class HeldOutEvaluator:
    """This rank's slice of the held-out set, collated, and the collective that evaluates on it.

    Args:
        config: Trainer settings (the held-out set, features, classes, batch bound).
        ctx: This rank's place in the group.
        collate: The collate function the rank trains with.
        reading: How the replayed dataset is read (`producer.dataset`: CSV columns, class names), so that the
            held-out set is read, and its classes numbered, as the training data is.
        objective: What is measured (default: the one `trainer.objective` names).

    Raises:
        TrainerSetupError: the held-out set cannot be loaded, has unlabelled samples, samples of the wrong
            shape or labels outside [0, num_classes), naming the setting that named it.
    """

    def __init__(self, config: TrainerConfig, ctx: DistContext, collate: CollateFn,
                 reading: DatasetConfig | None = None, *, objective: Objective | None = None) -> None:
        source = held_out_source(config)
        if source is None:
            raise TrainerSetupError("trainer.eval_path: no held-out set configured")
        self.name, path, setting = source
        self.ctx = ctx
        self.objective = objective if objective is not None else build_objective(config)
        reading = reading or DatasetConfig()
        try:
            dataset = load_dataset(path, reading.label_column, reading.sample_column, reading.class_names,
                                   reading.target_columns)
        except DatasetError as exc:
            raise TrainerSetupError(f"{setting}: {exc}") from None
        if dataset.class_names is not None and reading.class_names is None:
            logger.warning("rank %d: held-out set %s numbers its classes by its own names (%s): set "
                           "producer.dataset.class_names so that the training data numbers them alike",
                           ctx.rank, self.name, ", ".join(f"{n}={i}" for i, n in enumerate(dataset.class_names[:12])))
        _check_held_out(dataset, config, setting)
        usable = _usable(dataset, self.objective, setting)
        keep = usable[stratified_subset(dataset.labels[usable], config.eval_max_samples or len(usable), config.seed)]
        sizes = dataset.sizes[keep]
        mine = keep[deal_by_size(sizes, ctx.rank, ctx.world_size)]
        self.total = len(keep)
        samples = [_held_out_sample(dataset, int(i)) for i in mine]
        self._chunks = _chunks(samples, config.eval_batch_size)
        self._setting = setting
        self._names: list[str] | None = None  # the metric sums' names every rank adds up (`_combine`)
        self.batches: list[Batch] = []
        self.collate_with(config, collate)
        self.own_samples = len(samples)
        self.own_size = int(sum(s.size for s in samples))
        logger.info("rank %d: held-out set %s, %d of its %d samples here (total size %d) in %d batches",
                    ctx.rank, self.name, self.own_samples, self.total, self.own_size, len(self.batches))

    def collate_with(self, config: TrainerConfig, collate: CollateFn) -> None:
        """Collate this rank's held-out samples under `config` (again when the input standardisation in force
        changes: the trainers' online estimate)."""
        try:
            self.batches = [collate(chunk, config).to(self.ctx.device) for chunk in self._chunks]
        except Exception as exc:  # a plug-in may raise anything: report it as this setting's failure
            raise TrainerSetupError(f"trainer.collate: failed on held-out samples of {self._setting} "
                                    f"({type(exc).__name__}: {exc})") from exc

    def evaluate(self, model: nn.Module, step: int) -> HeldOutResult:
        """Evaluate `model` (the bare module, not its DDP wrapper) on this rank's slice and combine over ranks.

        A collective: every rank must call it at the same step. Two all-reduces: the fleet's baseline state, sent
        before the forward passes and awaited after them, and the metric sums.
        """
        started = time.perf_counter()
        state = self.objective.baseline_state
        pending = self._fleet_sum(state) if state.numel() else None  # no state: the objective keeps no baseline
        was_training = model.training
        model.eval()
        totals: dict[str, torch.Tensor | float] = {}
        try:
            with torch.inference_mode():
                outputs = [model(batch) for batch in self.batches]
                baseline = pending() if pending is not None else None
                for batch, out in zip(self.batches, outputs, strict=True):
                    for name, value in self.objective.metric_sums(out, batch, baseline).items():
                        totals[name] = totals[name] + value if name in totals else value
                sums = read_sums(totals)  # added up on the device, read once
        finally:
            model.train(was_training)
        if dist.is_initialized() and self.ctx.world_size > 1:
            sums = self._combine(sums)
        metrics = self.objective.summarise(sums)
        return HeldOutResult(step=step, samples=int(sums.get("count", 0)), accuracy=metrics.get("accuracy"),
                             loss=metrics.get("loss", 0.0), seconds=time.perf_counter() - started, metrics=metrics)

    @property
    def _reduce_device(self) -> torch.device:
        """Where a collective's tensor lives: gloo reduces CPU tensors; NCCL needs them on the rank's GPU."""
        return self.ctx.device if self.ctx.backend == "nccl" else torch.device("cpu")

    def _fleet_sum(self, state: torch.Tensor) -> Callable[[], torch.Tensor]:
        """Start adding up the baseline states of every rank (what the fleet has trained so far); the call returned
        waits for the total."""
        if not (dist.is_initialized() and self.ctx.world_size > 1):
            return lambda: state
        total = state.to(self._reduce_device, copy=True)
        work = dist.all_reduce(total, async_op=True)

        def wait() -> torch.Tensor:
            work.wait()
            return total

        return wait

    def _combine(self, sums: dict[str, float]) -> dict[str, float]:
        """The metric sums of every rank added up, in one all-reduce of the names every rank gave last time.

        The names are agreed once by a gather of every rank's sums (and again whenever a rank gives a name the others
        do not know, which the all-reduce's last slot tells them all), so an objective of one's own may name its sums
        as it likes; a rank with no held-out sample gives none.
        """
        if self._names is not None:
            known = set(self._names)
            fits = set(sums) <= known
            values = torch.tensor([sums.get(n, 0.0) for n in self._names] + [0.0 if fits else 1.0],
                                  dtype=torch.float64, device=self._reduce_device)
            dist.all_reduce(values)
            if values[-1].item() == 0.0:
                return dict(zip(self._names, values[:-1].tolist(), strict=True))
        gathered: list[dict[str, float] | None] = [None] * self.ctx.world_size
        dist.all_gather_object(gathered, sums)
        total: dict[str, float] = {}
        for part in gathered:
            add_sums(total, part or {})
        self._names = sorted(total)
        return total


def _held_out_sample(dataset: Dataset, i: int) -> Sample:
    label = int(dataset.labels[i])
    target = dataset.targets[i] if dataset.targets is not None else None
    return Sample.from_array("held-out", i, dataset.samples[i], label=label if label >= 0 else None, target=target)


def _usable(dataset: Dataset, objective: Objective, setting: str) -> np.ndarray:
    """Indices of the held-out samples that carry what the objective needs (the others are left out, and said so).

    Raises:
        TrainerSetupError: none does.
    """
    problems = [objective.target_problem(_held_out_sample(dataset, i)) for i in range(len(dataset))]
    usable = np.asarray([i for i, p in enumerate(problems) if p is None], dtype=np.int64)
    left = [p for p in problems if p is not None]
    if not len(usable):
        raise TrainerSetupError(f"{setting}: no held-out sample can be scored by trainer.objective "
                                f"{objective.name}: {left[0].detail}")
    if left:
        logger.warning("held-out set: %d of %d samples left out (%s)", len(left), len(dataset), left[0].detail)
    return usable


def _check_held_out(dataset: Dataset, config: TrainerConfig, setting: str) -> None:
    shapes = {s.shape[1:] for s in dataset.samples}
    if shapes != {(config.num_features,)}:
        shown = ", ".join(f"(size, {', '.join(map(str, s))})" for s in sorted(shapes))
        raise TrainerSetupError(f"{setting}: held-out samples have shape {shown}; the model takes "
                                f"(size, {config.num_features}) (trainer.num_features)")
    if config.objective != "classification":
        return
    if not dataset.labelled:
        raise TrainerSetupError(f"{setting}: the held-out set has unlabelled samples; evaluation needs labels")
    top = int(dataset.labels.max())
    if top >= config.num_classes:
        raise TrainerSetupError(f"{setting}: held-out label {top} is not below trainer.num_classes "
                                f"({config.num_classes})")
