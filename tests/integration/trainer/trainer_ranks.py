"""Rank programs for the multi-rank trainer tests (spawned with torch.multiprocessing, gloo on CPU).

Each rank writes what it observed to `<out>/<scenario>.rank<r>.pt`; the tests compare those files
with a single-process reference computed in the pytest process.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from nan_model import MARKED_SIZE

from streamtrain.config.trainer import TrainerConfig
from streamtrain.models.batching import collate_packed
from streamtrain.models.plugins import build_model
from streamtrain.objectives import build_objective
from streamtrain.synthetic import synthetic_samples
from streamtrain.trainer.compression import TopKCompressor
from streamtrain.trainer.distributed import destroy_distributed, free_port, init_distributed
from streamtrain.trainer.evaluation import HeldOutEvaluator
from streamtrain.trainer.step import build_step_runner, linear_lr_scale
from streamtrain.wire import Sample

#: Tiny float64 model: fast, and exact enough to compare at 1e-9.
BASE = TrainerConfig(
    num_features=4,
    num_classes=3,
    hidden_size=8,
    num_layers=1,
    kernel_size=3,
    precision="float64",
    device="cpu",
    torch_threads=1,
    lr=0.1,
    momentum=0.9,
    base_batch=8,
    bucket_cap_mb=0.001,  # several buckets, so the hook runs more than once per step
    seed=11,
)

#: `BASE` with the model that answers a marked sample with NaN logits (`nan_model`).
NAN_MODEL = BASE.model_copy(update={"model": "nan_model:build"})

#: Samples per rank per step: uneven, with idle ranks (step 1: rank 2; step 3: rank 0), one empty step.
COUNTS = ((3, 1, 6), (5, 2, 0), (0, 0, 0), (0, 4, 1))

#: `BASE` under each objective beyond classification (the equality with single-process SGD holds for every one).
OBJECTIVES = {
    "regression": BASE.model_copy(update={"objective": "regression", "target_width": 2, "target_shift": 0.5}),
    "multilabel": BASE.model_copy(update={"objective": "multilabel", "num_tags": 3}),
    "forecast": BASE.model_copy(update={"objective": "forecast", "horizon": 2}),
}

#: `seqflat` choosing its head (dropout unset) on the regression targets: its ridge head sums every rank's samples.
RIDGE = OBJECTIVES["regression"].model_copy(update={"model": "seqflat", "series_points": 6})


def step_samples(step: int, rank: int, config: TrainerConfig = BASE) -> list[Sample]:
    """The samples `rank` trains in `step` (deterministic, so the reference can rebuild them), with the targets
    `config.objective` trains on (a forecast's series two frames longer, for its horizon)."""
    count = COUNTS[step][rank % len(COUNTS[step])]
    longer = config.horizon if config.objective == "forecast" else 0
    sizes = [1 + longer + (7 * step + 3 * rank + 5 * i) % 9 for i in range(count)]
    samples = synthetic_samples(sizes, BASE.num_features, BASE.num_classes, seed=100 * step + rank,
                                device_id=f"d{rank}")
    if config.objective == "regression":
        return [replace(s, target=(float(s.array()[:, 0].mean()), float(s.label or 0))) for s in samples]
    if config.objective == "multilabel":
        return [replace(s, target=(float(s.label == 0), float(s.label == 1), float(s.array()[:, 1].mean() > 0)))
                for s in samples]
    return samples


def objective_samples(config: TrainerConfig) -> Callable[[int, int], list[Sample]]:
    """`step_samples` under `config`'s objective."""
    return lambda step, rank: step_samples(step, rank, config)


def backlog(step: int, rank: int) -> int:
    """The backlog rank `rank` reports in `step` (summed over the group into `StepResult.group_backlog`)."""
    return 10 * rank + step


def marked_samples(step: int, rank: int) -> list[Sample]:
    """`step_samples`, plus in step 1 on rank 1 one sample `nan_model` answers with NaN (the step must be skipped)."""
    samples = step_samples(step, rank)
    if (step, rank) == (1, 1):
        samples += synthetic_samples([MARKED_SIZE], BASE.num_features, BASE.num_classes, seed=7, device_id="d1")
    return samples


def reference_sgd(config: TrainerConfig, world: int, skipped: tuple[int, ...] = (),
                  scores: list[dict[str, float]] | None = None) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Single-process SGD on the union of every rank's samples, per step (none in the `skipped` steps): parameters
    and learning rates. With `scores`, each step's metric sums of the union under the model before the step are
    appended to it."""
    model = build_model(config)
    objective = build_objective(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    lrs: list[float] = []
    for step in range(len(COUNTS)):
        union = [s for rank in range(world) for s in step_samples(step, rank, config)]
        scale = linear_lr_scale(len(union), config.base_batch, config.max_lr_scale) if config.lr_scaling else 1.0
        lrs.append(config.lr * scale)
        if not union or step in skipped:
            continue
        for group in optimizer.param_groups:
            group["lr"] = config.lr * scale
        batch = collate_packed(union, config)
        optimizer.zero_grad()
        outputs = model(batch)
        if scores is not None:
            scores.append({k: float(v) for k, v in objective.metric_sums(outputs.detach(), batch).items()})
        objective.losses(outputs, batch).mean().backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, lrs


def _train(config: TrainerConfig, rank: int, world: int,
           samples: Callable[[int, int], list[Sample]] = step_samples) -> dict[str, Any]:
    ctx = init_distributed(config)
    runner = build_step_runner(config, ctx)
    # Each rank's backlog differs by rank and step: the group's sum rides on the weight all-reduce.
    results = [runner.run_step(samples(step, rank), backlog=backlog(step, rank)) for step in range(len(COUNTS))]
    stats = runner.compression_stats
    return {
        "params": {k: v.detach().cpu().clone() for k, v in runner.model.module.state_dict().items()},
        "results": results,
        "compressed_step_ratio": None if stats is None else stats.compressed_step_ratio,
        "decisions": None if stats is None else (stats.buckets, stats.compressed_buckets),
    }


def _train_objective(config: TrainerConfig, rank: int, world: int) -> dict[str, Any]:
    return _train(config, rank, world, objective_samples(config))


def _ridge(rank: int, world: int) -> dict[str, Any]:
    """`seqflat`'s ridge head after the steps, through the trainer's hook (idle ranks included)."""
    ctx = init_distributed(RIDGE)
    runner = build_step_runner(RIDGE, ctx)
    for step in range(len(COUNTS)):
        runner.run_step(step_samples(step, rank, RIDGE))
    ridge = runner.model.module.ridge
    return {"ridge": {k: v.detach().clone() for k, v in ridge.state_dict().items()},
            "sums": [t.clone() for t in ridge._sums]}


def _size_weighted_grads(rank: int, world: int) -> dict[str, Any]:
    """One step with lambda = total size: the aggregated gradient each rank ends up holding."""
    config = BASE.model_copy(update={"weight_by": "size"})
    runner = build_step_runner(config, init_distributed(config))
    result = runner.run_step(step_samples(0, rank))
    grads = {name: p.grad.detach().clone() for name, p in runner.model.module.named_parameters() if p.grad is not None}
    return {"grads": grads, "result": result}


def reference_size_weighted_grads(world: int) -> dict[str, torch.Tensor]:
    """Sum over ranks of (total size_i / total size) * grad of rank i's mean loss, from the initial model."""
    model = build_model(BASE)
    total = sum(s.size for rank in range(world) for s in step_samples(0, rank))
    out = {name: torch.zeros_like(p) for name, p in model.named_parameters()}
    for rank in range(world):
        samples = step_samples(0, rank)
        if not samples:
            continue
        model.zero_grad()
        batch = collate_packed(samples, BASE)
        torch.nn.functional.cross_entropy(model(batch), batch.labels).backward()
        share = sum(s.size for s in samples) / total
        for name, p in model.named_parameters():
            assert p.grad is not None
            out[name] += share * p.grad
    return out


#: Held-out samples of the "heldout" scenario: sizes 1-30, so the deal by size has something to balance.
HELD_OUT = 23


def write_held_out(path: Path) -> Path:
    """A labelled held-out set in the ragged .npz layout (the same file for every caller)."""
    sizes = [1 + (13 * i) % 30 for i in range(HELD_OUT)]
    samples = synthetic_samples(sizes, BASE.num_features, BASE.num_classes, seed=7)
    np.savez(path, x=np.concatenate([s.array() for s in samples]), y=np.array([s.label for s in samples]),
             sizes=np.array(sizes))
    return path


def _held_out(rank: int, world: int) -> dict[str, Any]:
    """Each rank evaluates its slice of the held-out set with the initial model, four times: the first gathers the
    sums' names, the second adds them up in one all-reduce, in the third rank 1 gives a sum the others do not know
    (every rank gathers again), and the fourth all-reduces the names now agreed. Counts the gathers of each."""
    config = BASE.model_copy(update={"eval_path": write_held_out(Path(tempfile.mkdtemp()) / "held.npz")})
    ctx = init_distributed(config)
    runner = build_step_runner(config, ctx)
    evaluator = HeldOutEvaluator(config, ctx, runner.collate)
    objective, gather = evaluator.objective, dist.all_gather_object
    seen: list[dict[str, float]] = []
    gathers: list[int] = []
    summarise, metric_sums = objective.summarise, objective.metric_sums

    def counted(*args: Any, **kwargs: Any) -> Any:
        gathers[-1] += 1
        return gather(*args, **kwargs)

    def seeing(sums: dict[str, float]) -> dict[str, float]:
        seen.append(dict(sums))
        return summarise(sums)

    objective.summarise = seeing  # type: ignore[method-assign]
    dist.all_gather_object = counted
    results = []
    try:
        for step in range(4):
            if step == 2 and rank == 1:
                objective.metric_sums = lambda out, batch, base=None: {  # type: ignore[method-assign]
                    **metric_sums(out, batch, base), "rank_1_only": out.new_tensor(2.0)}
            gathers.append(0)
            results.append(evaluator.evaluate(runner.model.module, step=step))
    finally:
        dist.all_gather_object = gather
    return {"result": results[0], "results": results, "sums": seen, "gathers": gathers,
            "batches": len(evaluator.batches), "own_samples": evaluator.own_samples, "own_size": evaluator.own_size}


def _compressor_votes(rank: int, world: int) -> dict[str, Any]:
    """Reduce known tensors with the Top-k compressor directly, where ranks disagree on compressing."""
    flat = torch.randn(200, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
    out: dict[str, Any] = {"input": flat.clone()}
    # Every rank's energy loss is far below 1e9: all vote sparse.
    out["sparse"] = TopKCompressor(0.1, 1e9).reduce(flat.clone()).wait()
    # Rank 0 offers a tensor Top-k keeps losslessly; the others offer dense noise: all must go dense.
    mixed = flat.clone()
    if rank == 0:
        mixed[20:] = 0.0
    compressor = TopKCompressor(0.1, 0.01)
    out["mixed_input"] = mixed.clone()
    out["mixed"] = compressor.reduce(mixed).wait()
    out["mixed_decisions"] = list(compressor.decisions)
    return out


SCENARIOS: dict[str, Callable[[int, int], dict[str, Any]]] = {
    "weighted": lambda rank, world: _train(BASE, rank, world),
    "mean": lambda rank, world: _train(BASE.model_copy(update={"aggregation": "mean"}), rank, world),
    "no_lr_scaling": lambda rank, world: _train(BASE.model_copy(update={"lr_scaling": False}), rank, world),
    "topk_always": lambda rank, world: _train(
        BASE.model_copy(update={"compression": True, "compression_delta": 1e9}), rank, world
    ),
    "topk_never": lambda rank, world: _train(
        BASE.model_copy(update={"compression": True, "compression_delta": 0.0}), rank, world
    ),
    # Rank 1's loss is NaN in step 1 (its gradients are not): every rank must skip that step, and only that one.
    "non_finite": lambda rank, world: _train(NAN_MODEL, rank, world, marked_samples),
    "non_finite_topk": lambda rank, world: _train(
        NAN_MODEL.model_copy(update={"compression": True, "compression_delta": 1e9}), rank, world, marked_samples
    ),
    **{f"weighted_{name}": functools.partial(_train_objective, config) for name, config in OBJECTIVES.items()},
    "compressor_votes": _compressor_votes,
    "size_weighted": _size_weighted_grads,
    "heldout": _held_out,
    "ridge": _ridge,
}

#: Scenarios `run_ranks` runs by default (everything that needs no GPU).
CPU_SCENARIOS = tuple(SCENARIOS)

SCENARIOS |= {
    # GPU only (tests marked gpu): CUDA tensors over NCCL, and over gloo for ranks sharing one GPU.
    "cuda_nccl": lambda rank, world: _train(BASE.model_copy(update={"device": "cuda", "backend": "nccl"}), rank, world),
    "cuda_gloo": lambda rank, world: _train(BASE.model_copy(update={"device": "cuda", "backend": "gloo"}), rank, world),
}


def _rank_main(rank: int, world: int, port: int, out: str, names: list[str]) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        for name in names:
            scenario = SCENARIOS[name]
            torch.save(scenario(rank, world), Path(out) / f"{name}.rank{rank}.pt")
            dist.barrier()
    finally:
        destroy_distributed()


def run_ranks(world: int, out: Path, names: list[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Spawn `world` ranks running the named scenarios (default: the CPU ones); return per-rank observations."""
    names = list(CPU_SCENARIOS) if names is None else names
    mp.spawn(_rank_main, args=(world, free_port(), str(out), names), nprocs=world, join=True)
    return {name: [torch.load(out / f"{name}.rank{r}.pt", weights_only=False) for r in range(world)] for name in names}
