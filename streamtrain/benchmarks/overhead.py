"""`streamtrain bench overhead`: what the pipeline adds to a bare `torch.distributed` DDP step (docs/benchmarks).

The same model, optimizer, per-rank batches and ranks run two ways in one process group, in alternating blocks
of steps: (a) bare DDP (the default all-reduce) on tensors collated before timing, and (b) streamtrain's own step
path: each step's records decoded from their wire bytes as the rank's consumer reads them, `StepRunner.run_step`
(collate, the weighted aggregation, the prequential scores, the gradient check) and the held-out evaluation every
`--eval-every` steps (by default `trainer.eval_every`'s default, what a deployment pays; `bench realdata` evaluates
every 3 steps to time its target, and at that cadence a third of the steps carry an evaluation, so the median period
is theirs). Each step's wall period is split into its parts; the
CPU time of the training thread per step is kept too (an emulated slower device multiplies it: a fixed cost here
is paid `factor` times on the slow rank). Kafka's own round trips (the plan's, the feedback's) are not in this
bench: `bench realdata` splits the live period into them.
"""

from __future__ import annotations

import copy
import os
import socket
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from streamtrain.config.trainer import TrainerConfig
from streamtrain.report.record import Record

from .common import TIMES, Bench, Out, Result, Target, table, targets_table

__all__ = ["BENCH", "DatasetOverhead", "OverheadResult"]

#: The parts of a step's wall period, in the order shown.
PARTS = ("decode", "collate", "compute", "all_reduce", "evaluation", "rest")
_DATASETS = ("plaid", "tecator")
#: The evaluation cadence a deployment gets unless it sets `trainer.eval_every`.
DEFAULT_EVAL_EVERY = int(TrainerConfig.model_fields["eval_every"].default)


class DatasetOverhead(Record):
    """One dataset's figures: per-step wall period and CPU time of both ways (medians over every measured step of
    every repeat, rank 0's clock), the streamtrain period's split, and the repeats' own period medians."""

    dataset: str
    model: str
    ranks: int
    rank_batch: int
    bare_period_s: float
    streamtrain_period_s: float
    bare_cpu_s: float
    streamtrain_cpu_s: float
    split_s: dict[str, float]
    """Seconds per part of `PARTS`: medians, but the evaluation's mean (its time spread over the steps between
    evaluations)."""
    bare_periods_s: list[float]
    streamtrain_periods_s: list[float]
    """Each repeat's median period, in running order."""

    @property
    def ratio(self) -> float:
        """streamtrain's period over bare DDP's: the median of the repeats' ratios (they ran back to back)."""
        return statistics.median(s / b for s, b in zip(self.streamtrain_periods_s, self.bare_periods_s, strict=True))


class OverheadResult(Result):
    """What `overhead.json` holds."""

    steps: int
    repeats: int
    eval_every: int = 3
    """Steps between held-out evaluations in the streamtrain way (files from before the option: realdata's 3)."""
    datasets: list[DatasetOverhead]


def _config(dataset: str, ranks: int, global_batch: int, eval_every: int) -> Any:
    """The configuration `bench realdata` trains `dataset` with (no emulated slow-down), one CPU thread a rank,
    evaluating every `eval_every` steps."""
    from streamtrain.benchmarks.balance.setup import RealdataSetup, Run
    from streamtrain.config import load_config
    from streamtrain.stack.replay import resolve_replay

    setup = RealdataSetup(dataset=dataset, global_batch=global_batch, slowdowns=(1.0,) * ranks)
    sets = {**setup.settings_of(Run(policy="static", slowdowns=(1.0,) * ranks)), "trainer.slowdowns": "",
            "trainer.torch_threads": 1}
    replay = resolve_replay(dataset, load_config(overrides=sets))
    return load_config(overrides={**sets, **replay.settings, "trainer.eval_every": eval_every})


def _records(dataset: str, rank: int, ranks: int, rank_batch: int, steps: int) -> list[list[tuple[bytes, Any]]]:
    """Each step's records of this rank, as its topic holds them: its shard of the training split, in order."""
    from streamtrain.datasets.files import load_dataset
    from streamtrain.datasets.packaged import packaged_file
    from streamtrain.wire import Sample, encode

    data = load_dataset(packaged_file(dataset, "train"))
    mine = list(range(rank, len(data), ranks))
    out = []
    for step in range(steps):
        rows = [mine[(step * rank_batch + i) % len(mine)] for i in range(rank_batch)]
        out.append([encode(Sample.from_array(
            str(rank), i, data.samples[i].astype(np.float32), label=int(data.labels[i]) if data.labelled else None,
            target=None if data.targets is None else data.targets[i])) for i in rows])
    return out


class _Clock:
    """Marks within one step: wall and thread-CPU time per part."""

    def __init__(self) -> None:
        self.parts: dict[str, list[float]] = defaultdict(list)
        self.periods: list[float] = []
        self.cpu: list[float] = []

    def step(self, body: Callable[[dict[str, float]], None]) -> None:
        parts: dict[str, float] = {}
        wall, cpu = time.perf_counter(), time.thread_time()
        body(parts)
        period = time.perf_counter() - wall
        self.cpu.append(time.thread_time() - cpu)
        self.periods.append(period)
        parts["rest"] = max(0.0, period - sum(parts.values()))
        for name in PARTS:
            self.parts[name].append(parts.get(name, 0.0))


def _ways(rank: int, ranks: int, port: int, dataset: str, global_batch: int, steps: int,
          eval_every: int) -> tuple[dict[str, Callable[[int, dict[str, float]], None]], str, int]:
    """Join the group and build both ways' step functions over this rank's records: (ways, model, batch a rank)."""
    from torch.nn.parallel import DistributedDataParallel

    from streamtrain.trainer.distributed import init_distributed
    from streamtrain.trainer.evaluation import HeldOutEvaluator
    from streamtrain.trainer.step import build_optimizer, build_step_runner
    from streamtrain.wire import Sample, decode

    cfg = _config(dataset, ranks, global_batch, eval_every)
    trainer = cfg.trainer
    ctx = init_distributed(trainer, rank=rank, world_size=ranks, master_port=port)
    rank_batch = global_batch // ranks
    records = _records(dataset, rank, ranks, rank_batch, steps)
    runner = build_step_runner(trainer, ctx)
    evaluator = HeldOutEvaluator(trainer, ctx, runner.collate, cfg.producer.dataset, objective=runner.objective)
    bare = DistributedDataParallel(copy.deepcopy(runner.model.module), bucket_cap_mb=trainer.bucket_cap_mb,
                                   gradient_as_bucket_view=True)
    bare_opt = build_optimizer(bare.module, trainer)
    batches = [runner.collate([decode(v, h, Sample) for v, h in step], trainer) for step in records]
    objective = runner.objective

    def bare_step(i: int, parts: dict[str, float]) -> None:
        batch = batches[i]
        bare_opt.zero_grad(set_to_none=True)
        objective.losses(bare(batch), batch).mean().backward()
        bare_opt.step()

    def streamtrain_step(i: int, parts: dict[str, float]) -> None:
        began = time.perf_counter()
        samples = [decode(v, h, Sample, device=str(rank)) for v, h in records[i]]
        parts["decode"] = time.perf_counter() - began
        result = runner.run_step(samples)
        parts["collate"], parts["all_reduce"] = result.collate_seconds, result.comm_seconds
        parts["compute"] = result.compute_seconds - result.collate_seconds
        if (i + 1) % trainer.eval_every == 0:
            began = time.perf_counter()
            evaluator.evaluate(runner.model.module, i + 1)
            parts["evaluation"] = time.perf_counter() - began

    return {"bare": bare_step, "streamtrain": streamtrain_step}, trainer.model, rank_batch


def _rank_main(rank: int, ranks: int, port: int, dataset: str, global_batch: int, steps: int, repeats: int,
               eval_every: int, box: Any) -> None:
    """One rank of the group: both ways in alternating blocks; rank 0 puts its clocks' figures in `box`."""
    import torch.distributed as dist

    ways, model, rank_batch = _ways(rank, ranks, port, dataset, global_batch, steps, eval_every)
    clocks = {name: _Clock() for name in ways}
    blocks: dict[str, list[float]] = defaultdict(list)
    warm = max(2, steps // 5)
    for r in range(repeats):
        for name in ("bare", "streamtrain") if r % 2 == 0 else ("streamtrain", "bare"):
            dist.barrier()
            clock, first, way = clocks[name], len(clocks[name].periods), ways[name]
            for i in range(steps):
                clock.step(lambda parts, i=i, way=way: way(i, parts))  # type: ignore[misc]
            blocks[name].append(statistics.median(clock.periods[first + warm:]))
    if rank == 0:
        box.put({"model": model, "rank_batch": rank_batch, "blocks": dict(blocks),
                 "clocks": {n: _summary(c, warm, steps) for n, c in clocks.items()}})
    dist.barrier()
    dist.destroy_process_group()


def _summary(clock: _Clock, warm: int, steps: int) -> dict[str, Any]:
    """Medians over the measured steps of every block (a block's first `warm` steps left out)."""
    keep = [i for i in range(len(clock.periods)) if i % steps >= warm]
    return {"period": statistics.median(clock.periods[i] for i in keep),
            "cpu": statistics.median(clock.cpu[i] for i in keep),
            # The evaluation runs every eval_every steps: its mean is its cost a step (a median would say 0).
            "split": {n: (statistics.fmean if n == "evaluation" else statistics.median)(clock.parts[n][i] for i in keep)
                      for n in PARTS}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answer(box: Any, procs: list[Any], dataset: str, timeout_s: float = 1800) -> dict[str, Any]:
    """Rank 0's figures, or an error as soon as a rank has died without them (a crashed rank never answers)."""
    import queue

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return dict(box.get(timeout=2))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"bench overhead: a rank of the {dataset} group failed (exit codes "
                                   f"{[p.exitcode for p in procs]}; its error is above)") from None
    raise RuntimeError(f"bench overhead: the {dataset} group gave no figures in {timeout_s:.0f} s")


def measure(dataset: str, ranks: int, global_batch: int, steps: int, repeats: int,
            eval_every: int = DEFAULT_EVAL_EVERY) -> DatasetOverhead:
    """Run the group for `dataset` (spawned processes, gloo on this host) and read rank 0's figures."""
    import torch.multiprocessing as mp

    spawn = mp.get_context("spawn")
    box = spawn.Queue()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    port = _free_port()
    procs = [spawn.Process(target=_rank_main, daemon=True,
                           args=(r, ranks, port, dataset, global_batch, steps, repeats, eval_every, box))
             for r in range(ranks)]
    for p in procs:
        p.start()
    try:
        got = _answer(box, procs, dataset)
    finally:
        for p in procs:
            p.join(timeout=60)
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"bench overhead: a rank of the {dataset} group failed "
                           f"(exit codes {[p.exitcode for p in procs]})")
    bare, st = got["clocks"]["bare"], got["clocks"]["streamtrain"]
    return DatasetOverhead(
        dataset=dataset, model=got["model"], ranks=ranks, rank_batch=got["rank_batch"],
        bare_period_s=round(bare["period"], 6), streamtrain_period_s=round(st["period"], 6),
        bare_cpu_s=round(bare["cpu"], 6), streamtrain_cpu_s=round(st["cpu"], 6),
        split_s={k: round(v, 6) for k, v in st["split"].items()},
        bare_periods_s=[round(v, 6) for v in got["blocks"]["bare"]],
        streamtrain_periods_s=[round(v, 6) for v in got["blocks"]["streamtrain"]])


def overhead_command(
    out: Out = Path("reports/bench"),
    dataset: Annotated[list[str] | None, typer.Option("--dataset", help="Dataset (repeatable); default: "
                                                      + ", ".join(_DATASETS) + ".")] = None,
    ranks: Annotated[int, typer.Option(min=2, help="Ranks (gloo processes on this host).")] = 4,
    global_batch: Annotated[int, typer.Option(min=2, help="Samples per step over all ranks (realdata's).")] = 64,
    steps: Annotated[int, typer.Option(min=5, help="Steps per block (the first fifth left out).")] = 30,
    # 8, not 4: on a shared 2-core machine one block's ratio moves by ±0.07 on Tecator, and the median of 4 by ±0.04.
    repeats: Annotated[int, typer.Option(min=1, max=20, help="Alternating blocks of each way.")] = 8,
    eval_every: Annotated[int, typer.Option(min=1, help="Steps between held-out evaluations in the streamtrain way "
                                            "(default: trainer.eval_every's; bench realdata uses 3).")]
    = DEFAULT_EVAL_EVERY,
) -> None:
    """Bare torch.distributed DDP against streamtrain's step path on the same model, batches and ranks, per dataset;
    the period split into decode, collate, compute, all-reduce, evaluation and the rest (target: <= 1.15x)."""
    from streamtrain.runtime.commands import console

    from .common import publish

    results = []
    for name in dataset or _DATASETS:
        with console.status(f"{name}: {ranks} ranks, {repeats} x {steps} steps each way ..."):
            results.append(measure(name, ranks, global_batch, steps, repeats, eval_every))
        r = results[-1]
        console.print(f"{name}: bare {r.bare_period_s * 1e3:.1f} ms, streamtrain {r.streamtrain_period_s * 1e3:.1f} "
                      f"ms ({r.ratio:.2f}{TIMES}); CPU a step {r.bare_cpu_s * 1e3:.1f} vs "
                      f"{r.streamtrain_cpu_s * 1e3:.1f} ms", highlight=False)
    publish(BENCH, OverheadResult(steps=steps, repeats=repeats, eval_every=eval_every, datasets=results), out)


def overhead_targets(result: OverheadResult) -> list[Target]:
    return [Target(f"{d.dataset}: streamtrain's step period ≤ 1.15{TIMES} bare DDP's at equal batches (median of the "
                   "repeats' ratios)", f"{d.ratio:.2f}{TIMES} ({d.streamtrain_period_s * 1e3:.1f} vs "
                   f"{d.bare_period_s * 1e3:.1f} ms)", d.ratio <= 1.15, "LBB, CHRONICA: periods against a balanced "
                   "ideal") for d in result.datasets]


def render_overhead(result: OverheadResult) -> str:
    """The `overhead` section of BENCHMARKS.md: targets, then each dataset's periods and split."""
    rows = [[d.dataset, d.model, d.ranks, d.rank_batch, f"{d.bare_period_s * 1e3:.1f}",
             f"{d.streamtrain_period_s * 1e3:.1f}", f"{d.ratio:.2f}{TIMES}", f"{d.bare_cpu_s * 1e3:.1f}",
             f"{d.streamtrain_cpu_s * 1e3:.1f}", *(f"{d.split_s.get(p, 0.0) * 1e3:.2f}" for p in PARTS)]
            for d in result.datasets]
    return "\n\n".join([
        f"{result.repeats} alternating blocks of {result.steps} steps each way (medians; a block's first fifth "
        f"left out); streamtrain's way evaluates on the held-out set every {result.eval_every} steps.",
        targets_table(overhead_targets(result)),
        table(["dataset", "model", "ranks", "batch/rank", "bare ms", "streamtrain ms", "ratio", "bare CPU ms",
               "streamtrain CPU ms", *(f"{p} ms" for p in PARTS)], rows)])


BENCH = Bench("overhead", overhead_command, OverheadResult, render_overhead, overhead_targets,
              args=("--steps", "30", "--repeats", "4"), quick_args=("--steps", "10", "--repeats", "2"),
              timeout_s=1800, command_line="--steps 30 --repeats 4")
