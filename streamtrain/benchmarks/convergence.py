"""`streamtrain bench convergence`: weighted vs plain gradient aggregation with uneven batches (docs/benchmarks)."""

from __future__ import annotations

import itertools
import tempfile
import time
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from pydantic import Field, model_validator

from streamtrain.config import ProducerConfig
from streamtrain.config.trainer import TrainerConfig
from streamtrain.wire import Sample

from . import common
from .common import TIMES, Bench, Record, Result, Target, num, publish, pyplot, table, targets_table

__all__ = ["AGGREGATIONS", "BENCH", "ConvergenceResult", "ConvergenceSetup", "Curve", "analyse", "run_convergence"]

#: The cells, in the order they run and are reported.
AGGREGATIONS = ("sgd", "weighted", "plain")


class ConvergenceSetup(Record):
    """One convergence experiment: the stream, how it is split over ranks, the model and the target."""

    world: int = 4  # gloo ranks (devices) of the weighted and plain cells
    steps: int = Field(200, ge=1)  # steps every cell trains (all cells see exactly the same samples)
    shares: tuple[float, ...] = (0.7, 0.2, 0.08, 0.02)  # expected share of each device in a step's batch (uneven)
    idle_probability: float = 0.2  # chance that a device contributes nothing to a step (its stream stalled)
    batch_min: int = Field(16, ge=1)  # a step's global batch: drawn in [batch_min, batch_max], then idle devices drop
    batch_max: int = 96
    classes: int = 8
    features: int = 16
    labels_per_device: int = 2  # non-IID: classes each device sees (device i: classes 2i, 2i+1)
    size_mean: float = 12.0
    size_dif: float = 8.0  # std of sample sizes (CHRONICA's DIF)
    signal: float = 0.25  # prototype strength of the synthetic task (lower is harder)
    heldout: int = 2000  # held-out samples, drawn from the device streams in proportion to `shares`
    target_accuracy: float = Field(0.85, gt=0, lt=1)  # held-out accuracy to reach (trailing mean of smooth_steps)
    smooth_steps: int = 5
    hidden_size: int = 32
    num_layers: int = 1
    kernel_size: int = 3
    lr: float = 0.05
    momentum: float = 0.9
    base_batch: int = 64
    seed: int = 0
    quick: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> ConvergenceSetup:
        if len(self.shares) != self.world:
            raise ValueError(f"shares has {len(self.shares)} entries for a world of {self.world}")
        if self.world * self.labels_per_device > self.classes:
            raise ValueError("world * labels_per_device must not exceed classes (disjoint device label sets)")
        if self.batch_max < self.batch_min:
            raise ValueError("batch_max must not be below batch_min")
        return self

    def trainer_config(self, aggregation: str) -> TrainerConfig:
        """The trainer settings of a cell (`plain` is the trainer's `mean` aggregation)."""
        return TrainerConfig(
            num_features=self.features, num_classes=self.classes, hidden_size=self.hidden_size,
            num_layers=self.num_layers, kernel_size=self.kernel_size, precision="float32", device="cpu",
            backend="gloo", torch_threads=1, optimizer="sgd", lr=self.lr, momentum=self.momentum,
            aggregation="mean" if aggregation == "plain" else "weighted", weight_by="samples",
            lr_scaling=True, base_batch=self.base_batch, seed=self.seed, metrics=False,
        )

    def counts(self) -> np.ndarray:
        """(steps, world) samples each device contributes to each step (zeros included)."""
        rng = np.random.default_rng([self.seed, 0xC0])
        shares = np.asarray(self.shares, dtype=np.float64) / np.sum(self.shares)
        out = np.zeros((self.steps, self.world), dtype=np.int64)
        for row in out:
            row[:] = rng.multinomial(int(rng.integers(self.batch_min, self.batch_max + 1)), shares)
            row[rng.random(self.world) < self.idle_probability] = 0
        return out

    def _draw(self, seed: int, counts: Any, name: str = "") -> list[list[list[Sample]]]:
        """`[row][device]` → `counts[row][device]` samples of that device's stream drawn with `seed`, in order."""
        from streamtrain.producers.sources import SyntheticSource

        source = SyntheticSource(ProducerConfig.model_validate({
            "devices": self.world, "seed": seed, "metrics": False,
            "size": {"kind": "normal", "mean": self.size_mean, "dif": self.size_dif},
            "synthetic": {"features": self.features, "classes": self.classes, "labels_per_device":
                          self.labels_per_device, "signal": self.signal, "task_seed": self.seed}}), self.world)
        numbers = [itertools.count() for _ in range(self.world)]
        return [[[Sample.from_array(f"{name}{device}", next(numbers[device]), d.array, label=d.label)
                  for d in source.take(device, n)] for device, n in enumerate(row)] for row in counts]

    def schedule(self) -> list[list[list[Sample]]]:
        """`[step][device]` → that device's samples of the step, in stream order (deterministic)."""
        return self._draw(self.seed, self.counts().tolist())

    def heldout_samples(self) -> list[Sample]:
        """Held-out samples from the same device streams (another seed), in proportion to `shares`."""
        counts = [max(1, round(self.heldout * share / sum(self.shares))) for share in self.shares]
        return [s for device in self._draw(self.seed + 10_007, [counts], "heldout-")[0] for s in device]


class Curve(Record):
    """A cell's held-out accuracy and loss after every step, against the global samples trained so far."""

    step: list[int]
    samples: list[int]
    accuracy: list[float]
    loss: list[float]


class ConvergenceResult(Result):
    """What `convergence.json` holds: each cell's curve and how far apart the cells' final parameters are."""

    setup: ConvergenceSetup
    curves: dict[str, Curve]
    weighted_vs_sgd_max_param_diff: float
    plain_vs_sgd_max_param_diff: float
    seconds: float


@dataclass(frozen=True)
class ConvergenceCell:
    """One aggregation's figures (`analyse`), in its table's order: samples and steps to the target, samples from
    which it stays there (None: it falls below again), held-out accuracy and loss over the last tenth of the steps."""

    samples_to_target: int | None
    steps_to_target: int | None
    ratio_to_sgd: float | None
    samples_to_stay_at_target: int | None
    final_accuracy: float
    final_heldout_loss: float


def analyse(setup: ConvergenceSetup, curves: dict[str, Curve]) -> dict[str, ConvergenceCell]:
    """Each cell's figures, the target judged on the trailing mean of `setup.smooth_steps` evaluations."""
    rows: dict[str, ConvergenceCell] = {}
    for name in (n for n in AGGREGATIONS if n in curves):  # sgd first: the others' ratios are to it
        curve = curves[name]
        above = np.asarray(common.trailing_mean(curve.accuracy, setup.smooth_steps)) >= setup.target_accuracy
        hit = int(np.argmax(above)) if above.any() else None
        below = np.nonzero(~above)[0]
        stay = (int(below[-1]) + 1 if len(below) else 0) if above[-1] else None
        samples = None if hit is None else curve.samples[hit]
        ref = rows["sgd"].samples_to_target if "sgd" in rows else (samples if name == "sgd" else None)
        tail = max(1, len(curve.accuracy) // 10)
        rows[name] = ConvergenceCell(
            samples_to_target=samples, steps_to_target=None if hit is None else curve.step[hit],
            samples_to_stay_at_target=None if stay is None else curve.samples[stay],
            final_accuracy=round(float(np.mean(curve.accuracy[-tail:])), 4),
            final_heldout_loss=round(float(np.mean(curve.loss[-tail:])), 4),
            ratio_to_sgd=round(float(samples) / ref, 4) if ref and samples is not None else None)
    return rows


def _rank_main(rank: int, world: int, port: int, setup: ConvergenceSetup, cells: list[str], out: str) -> None:
    """One rank of a cell's process group (started by torch.multiprocessing with the spawn method); rank 0 evaluates
    after every step, prints every 25th, and saves each cell's curve and parameters in `out`."""
    import torch

    from streamtrain.models.batching import collate_packed
    from streamtrain.runtime.commands import console
    from streamtrain.trainer.distributed import destroy_distributed, init_distributed
    from streamtrain.trainer.step import build_step_runner

    base = setup.trainer_config("weighted")
    ctx = init_distributed(base, rank=rank, world_size=world, local_rank=rank, master_addr="127.0.0.1",
                           master_port=port)
    try:
        schedule = setup.schedule()
        heldout = collate_packed(setup.heldout_samples(), base) if rank == 0 else None
        for cell in cells:
            runner = build_step_runner(setup.trainer_config(cell), ctx)
            curve: dict[str, list[float]] = {"step": [], "samples": [], "accuracy": [], "loss": []}
            seen = 0
            for step, per_device in enumerate(schedule, start=1):
                mine = [s for device in per_device for s in device] if world == 1 else per_device[rank]
                seen += runner.run_step(mine).global_samples
                if heldout is not None:
                    accuracy, loss = common.heldout_score(runner.model.module, heldout)
                    for column, value in zip(curve, (step, seen, accuracy, loss), strict=True):
                        curve[column].append(value)
                    if step % 25 == 0 or step == setup.steps:
                        console.print(f"{cell:<8} step {step:>4}/{setup.steps}: {seen:>6,} samples, held-out "
                                      f"accuracy {accuracy:.3f}", highlight=False)
            if rank == 0:
                params = {k: v.detach().cpu().clone() for k, v in runner.model.module.state_dict().items()}
                torch.save({"curve": curve, "params": params}, Path(out) / f"{cell}.pt")
            torch.distributed.barrier()
    finally:
        destroy_distributed()


def run_convergence(setup: ConvergenceSetup, out: Path) -> ConvergenceResult:
    """Run the three cells (sgd on one rank, then weighted and plain on `setup.world`), write `out/convergence.json`
    and `convergence.png`, and return the result."""
    import torch
    import torch.multiprocessing as mp

    from streamtrain.trainer.distributed import free_port

    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="st-convergence-") as tmp:
        for world, cells in ((1, ["sgd"]), (setup.world, ["weighted", "plain"])):
            mp.spawn(_rank_main, args=(world, free_port(), setup, cells, tmp), nprocs=world)
        loaded = {name: torch.load(Path(tmp) / f"{name}.pt", weights_only=False) for name in AGGREGATIONS}

    def max_diff_to_sgd(name: str) -> float:
        ours, sgd = loaded[name]["params"], loaded["sgd"]["params"]
        return max(float((ours[k].double() - sgd[k].double()).abs().max()) for k in ours)

    return publish(BENCH, ConvergenceResult(
        setup=setup, curves={name: Curve.model_validate(loaded[name]["curve"]) for name in AGGREGATIONS},
        weighted_vs_sgd_max_param_diff=max_diff_to_sgd("weighted"),
        plain_vs_sgd_max_param_diff=max_diff_to_sgd("plain"),
        seconds=round(time.perf_counter() - began, 1)), out)


#: Each cell's line in the plot: label, colour, style, width.
_LINES = {"sgd": ("single-process SGD", "black", "-", 3.0), "plain": ("plain DDP average", "tab:red", "-", 1.4),
          "weighted": ("weighted (λ = samples)", "tab:blue", "--", 1.6)}


def plot_convergence(result: ConvergenceResult) -> Any:
    """Held-out accuracy and loss against samples trained, one line per cell, with the target."""
    setup, target = result.setup, result.setup.target_accuracy
    fig, (acc_ax, loss_ax) = pyplot().subplots(1, 2, figsize=(11, 4))
    for name, curve in result.curves.items():
        label, color, style, width = _LINES.get(name, (name, "grey", "-", 1.0))
        for ax, values in ((acc_ax, common.trailing_mean(curve.accuracy, setup.smooth_steps)), (loss_ax, curve.loss)):
            ax.plot(curve.samples, values, style, color=color, lw=width, label=label)
    acc_ax.axhline(target, color="grey", lw=0.8, ls=":")
    acc_ax.text(0, target, f" target {target:.2f}", va="bottom", color="grey", fontsize=8)
    acc_ax.set(xlabel="samples trained (global)", ylabel="held-out accuracy",
               title=f"accuracy (trailing mean of {setup.smooth_steps} steps)")
    loss_ax.set(xlabel="samples trained (global)", ylabel="held-out cross-entropy", title="loss")
    acc_ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"convergence with uneven batches: {setup.world} gloo ranks, shares {list(setup.shares)}, "
                 f"idle p={setup.idle_probability}, non-IID ({setup.labels_per_device} classes/device)", fontsize=9)
    return fig


def _stay(cell: ConvergenceCell) -> str:
    samples = cell.samples_to_stay_at_target
    return "never settles at it within the run" if samples is None else f"stays at it from {samples:,} samples"


def convergence_targets(result: ConvergenceResult) -> list[Target]:
    """Weighted aggregation against SGD, and plain averaging's bias."""
    cells = analyse(result.setup, result.curves)
    weighted, plain, sgd = cells["weighted"], cells["plain"], cells["sgd"]
    ratio, gap = weighted.ratio_to_sgd, sgd.final_accuracy - plain.final_accuracy
    return [
        Target("weighted: samples to target within 5% of single-process SGD", "—" if ratio is None else
               f"{ratio:.3f}{TIMES} SGD ({weighted.samples_to_target:,} vs {sgd.samples_to_target:,} samples); "
               f"parameters differ by {result.weighted_vs_sgd_max_param_diff:.1e} after {result.setup.steps} steps",
               None if ratio is None else abs(ratio - 1.0) <= 0.05,
               "LB-BSP §3.4: weighted aggregation gives \"identical statistical efficiency\" to BSP"),
        Target("plain averaging shows its bias",
               f"final accuracy {plain.final_accuracy:.3f} vs SGD {sgd.final_accuracy:.3f} "
               f"({gap * 100:.1f} points {'lower' if gap > 0 else 'higher'}), held-out loss "
               f"{plain.final_heldout_loss:.3f} vs {sgd.final_heldout_loss:.3f}; first reaches the target at "
               f"{num(plain.ratio_to_sgd, 3)}{TIMES} SGD's samples but {_stay(plain)} (SGD {_stay(sgd)})",
               gap > 0,
               "LB-BSP §3.4: naive averaging reached 43% training accuracy vs 59% for BSP (Inception-V3, 20 epochs)"),
    ]


def render_convergence(result: ConvergenceResult) -> str:
    """The `convergence` section of BENCHMARKS.md: setup, targets, the cells."""
    setup = result.setup
    rows = [[name, *("never" if value is None else num(value, 3) for value in astuple(cell))]  # None: not reached
            for name, cell in analyse(setup, result.curves).items()]
    return "\n\n".join([
        f"Setup: {setup.world} gloo ranks, {setup.steps} steps, shares {num(setup.shares)} of a global batch in "
        f"[{setup.batch_min}, {setup.batch_max}], idle probability {setup.idle_probability}, {setup.labels_per_device} "
        f"of {setup.classes} classes per device, sizes mean {setup.size_mean:g} DIF {setup.size_dif:g}, signal "
        f"{setup.signal:g}, target accuracy {setup.target_accuracy:.2f} (trailing mean of {setup.smooth_steps} "
        f"steps), {setup.heldout:,} held-out samples; run time {result.seconds:.0f} s.",
        targets_table(convergence_targets(result)),
        table(["aggregation", "samples to target", "steps", "ratio to SGD", "samples to stay at target",
               "final accuracy", "final held-out loss"], rows),
    ])


def convergence_command(
    ctx: typer.Context,
    out: common.Out = Path("reports/bench"),
    quick: common.Quick = False,
    steps: Annotated[int | None, typer.Option(min=1, help="Steps per cell (default 200; 100 with --quick).")] = None,
    target: Annotated[float | None, typer.Option(min=0.01, max=0.99, help="Held-out accuracy to reach.")] = None,
    seed: common.Seed = 0,
) -> None:
    """Weighted (λ = samples) vs plain gradient averaging on 4 gloo ranks with uneven batches, against single-process
    SGD on the same non-IID stream (--quick: 100 steps, a held-out set of 1,000)."""
    from streamtrain.runtime.commands import config_from

    config_from(ctx)
    chosen = {"steps": steps or (100 if quick else None), "heldout": 1000 if quick else None, "target_accuracy": target}
    setup = ConvergenceSetup.model_validate({"seed": seed, "quick": quick, **{k: v for k, v in chosen.items() if v}})
    run_convergence(setup, out)


BENCH = Bench("convergence", convergence_command, ConvergenceResult, render_convergence, convergence_targets,
              plot_convergence, quick_args=("--quick",), timeout_s=600)
