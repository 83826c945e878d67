"""`streamtrain bench convergence`, the run: the sgd cell in one process, then weighted and plain on `world`
gloo ranks, each rank training its device's share of every step with the trainer's own step runner."""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .render import plot_convergence
from .results import ConvergenceResult, Curve, analyse, schedule_summary
from .setup import AGGREGATIONS, ConvergenceSetup

__all__ = ["Progress", "run_convergence"]

logger = logging.getLogger(__name__)

#: `(cell, step, steps, samples so far, held-out accuracy)` — what a progress display receives.
Progress = Callable[[str, int, int, int, float], None]


# Rank programs run in processes started by torch.multiprocessing with the spawn method.


def _rank_main(rank: int, world: int, port: int, setup: ConvergenceSetup, cells: list[str], out: str,
               messages: Any) -> None:
    import torch

    from streamtrain.models.batching import collate_packed
    from trainer.distributed import destroy_distributed, init_distributed
    from trainer.step import build_step_runner

    base = setup.trainer_config("weighted")
    ctx = init_distributed(base, rank=rank, world_size=world, local_rank=rank, master_addr="127.0.0.1",
                           master_port=port)
    try:
        schedule = setup.schedule()
        heldout = collate_packed(setup.heldout_samples(), base) if rank == 0 else None
        for cell in cells:
            config = setup.trainer_config(cell)
            runner = build_step_runner(config, ctx)
            curve: dict[str, list[float]] = {"step": [], "samples": [], "accuracy": [], "loss": []}
            seen = 0
            started = time.perf_counter()
            for step, per_device in enumerate(schedule):
                mine = [s for device in per_device for s in device] if world == 1 else per_device[rank]
                result = runner.run_step(mine)
                seen += result.global_samples
                if heldout is None:
                    continue
                model = runner.model.module
                model.eval()
                with torch.no_grad():
                    logits = model(heldout)
                    loss = float(torch.nn.functional.cross_entropy(logits, heldout.labels))
                    accuracy = float((logits.argmax(1) == heldout.labels).double().mean())
                curve["step"].append(step + 1)
                curve["samples"].append(seen)
                curve["accuracy"].append(accuracy)
                curve["loss"].append(loss)
                messages.put((cell, step + 1, setup.steps, seen, accuracy))
            if rank == 0:
                params = {k: v.detach().cpu().clone() for k, v in runner.model.module.state_dict().items()}
                torch.save({"curve": curve, "params": params, "seconds": time.perf_counter() - started},
                           Path(out) / f"{cell}.pt")
            torch.distributed.barrier()
    finally:
        destroy_distributed()


def _spawn(world: int, setup: ConvergenceSetup, cells: list[str], out: Path, progress: Progress | None) -> None:
    import torch.multiprocessing as mp

    from trainer.distributed import free_port

    spawn = mp.get_context("spawn")
    messages = spawn.SimpleQueue()
    context = mp.start_processes(_rank_main, args=(world, free_port(), setup, cells, str(out), messages),
                                 nprocs=world, join=False, start_method="spawn")

    def drain() -> None:
        while not messages.empty():
            cell, step, steps, seen, accuracy = messages.get()
            if progress is not None:
                progress(cell, step, steps, seen, accuracy)

    while not context.join(timeout=0.2):
        drain()
    drain()


def run_convergence(setup: ConvergenceSetup, out: Path, progress: Progress | None = None,
                    plot: bool = True) -> ConvergenceResult:
    """Run the three cells, write `out/convergence.json` (and `convergence.png`) and return the result."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="st-convergence-") as tmp:
        work = Path(tmp)
        _spawn(1, setup, ["sgd"], work, progress)
        _spawn(setup.world, setup, ["weighted", "plain"], work, progress)
        loaded = {name: torch.load(work / f"{name}.pt", weights_only=False) for name in AGGREGATIONS}
    curves = {name: Curve.model_validate(loaded[name]["curve"]) for name in AGGREGATIONS}

    def max_diff(a: str, b: str) -> float:
        pa, pb = loaded[a]["params"], loaded[b]["params"]
        return max(float((pa[k].double() - pb[k].double()).abs().max()) for k in pa)

    result = ConvergenceResult(
        target_accuracy=setup.target_accuracy,
        cells=analyse(setup, curves),
        weighted_vs_sgd_max_param_diff=max_diff("weighted", "sgd"),
        plain_vs_sgd_max_param_diff=max_diff("plain", "sgd"),
        schedule=schedule_summary(setup),
        setup=setup,
        cell_seconds={name: round(float(loaded[name]["seconds"]), 2) for name in AGGREGATIONS},
        seconds=round(time.perf_counter() - began, 1),
        curves=curves,
    )
    result.write(out / "convergence.json")
    if plot:
        plot_convergence(result, out / "convergence.png")
    return result
