"""`streamtrain bench convergence`: weighted vs plain gradient aggregation with uneven batches.

Every cell trains the trainer's real code path — the packed conv net (`trainer.model`), packing
(`trainer.batching`), the step runner with its weighted-aggregation DDP hook (`trainer.step`,
`trainer.aggregation`) — on the same stream of samples in the same order:

- `sgd`: one process (a DDP group of one) trains the union of every device's samples of a step;
- `weighted`: `world` gloo ranks on the CPU, rank r trains device r's share of the step, the hook
  weights rank r by λ_r / Σλ (λ = samples), which is exactly SGD on the union (LB-BSP Eq. 7);
- `plain`: the same ranks and samples with conventional DDP averaging (every rank 1/world, idle
  ranks included), which over-weights samples in small batches (LB-BSP Eq. 6).

The data is the producers' synthetic stream (`producers.sources.SyntheticSource`): non-IID
devices (each sees only `labels_per_device` classes), variable sizes (normal with DIF), and
deliberately uneven per-step shares, with ranks idle at random. Accuracy is measured after every
step on a held-out set drawn from the same device streams in the same proportions (the population
the union of the streams represents). "Samples to target" is the global samples trained up to the
first step whose held-out accuracy reaches `target_accuracy`.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from streamtrain.config import ProducerConfig
from streamtrain.config.trainer import TrainerConfig
from streamtrain.wire import Sample

__all__ = [
    "AGGREGATIONS",
    "ConvergenceSetup",
    "Progress",
    "analyse",
    "plot_convergence",
    "run_convergence",
]

logger = logging.getLogger(__name__)

#: The cells, in the order they run and are reported.
AGGREGATIONS = ("sgd", "weighted", "plain")

#: `(cell, step, steps, samples so far, held-out accuracy)` — what a progress display receives.
Progress = Callable[[str, int, int, int, float], None]


@dataclass(frozen=True)
class ConvergenceSetup:
    """One convergence experiment: the stream, how it is split over ranks, the model and the target."""

    world: int = 4
    """gloo ranks (devices) of the weighted and plain cells."""
    steps: int = 200
    """Steps every cell trains (all cells see exactly the same samples)."""
    shares: tuple[float, ...] = (0.7, 0.2, 0.08, 0.02)
    """Expected share of each device in a step's global batch (uneven on purpose)."""
    idle_probability: float = 0.2
    """Chance that a device contributes nothing to a step (its stream stalled)."""
    batch_min: int = 16
    """Smallest global batch drawn for a step (before idle devices drop out)."""
    batch_max: int = 96
    """Largest global batch drawn for a step."""
    classes: int = 8
    features: int = 16
    labels_per_device: int = 2
    """Non-IID: classes each device sees (device i: classes 2i, 2i+1)."""
    size_mean: float = 12.0
    size_dif: float = 8.0
    """Std of sample sizes (CHRONICA's DIF)."""
    signal: float = 0.25
    """Prototype strength of the synthetic task (lower is harder)."""
    heldout: int = 2000
    """Held-out samples, drawn from the device streams in proportion to `shares`."""
    target_accuracy: float = 0.85
    """Held-out accuracy to reach (judged on the trailing mean of `smooth_steps` steps)."""
    smooth_steps: int = 5
    hidden_size: int = 32
    num_layers: int = 1
    kernel_size: int = 3
    lr: float = 0.05
    momentum: float = 0.9
    base_batch: int = 64
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form notes carried into the JSON (e.g. `quick`)."""

    def __post_init__(self) -> None:
        if len(self.shares) != self.world:
            raise ValueError(f"shares has {len(self.shares)} entries for a world of {self.world}")
        if self.world * self.labels_per_device > self.classes:
            raise ValueError("world * labels_per_device must not exceed classes (disjoint device label sets)")
        if not 0 < self.target_accuracy < 1:
            raise ValueError(f"target_accuracy must be in (0, 1), got {self.target_accuracy}")
        if self.steps < 1 or self.batch_min < 1 or self.batch_max < self.batch_min:
            raise ValueError("steps >= 1 and 1 <= batch_min <= batch_max are required")

    def trainer_config(self, aggregation: str) -> TrainerConfig:
        """The trainer settings of a cell (`plain` is the trainer's `mean` aggregation)."""
        return TrainerConfig(
            num_features=self.features, num_classes=self.classes, hidden_size=self.hidden_size,
            num_layers=self.num_layers, kernel_size=self.kernel_size, precision="float32", device="cpu",
            backend="gloo", torch_threads=1, optimizer="sgd", lr=self.lr, momentum=self.momentum,
            aggregation="mean" if aggregation == "plain" else "weighted", weight_by="samples",
            lr_scaling=True, base_batch=self.base_batch, seed=self.seed, metrics=False,
        )

    def _producer_config(self, seed: int) -> ProducerConfig:
        return ProducerConfig.model_validate({
            "devices": self.world, "seed": seed, "metrics": False,
            "size": {"kind": "normal", "mean": self.size_mean, "dif": self.size_dif},
            "synthetic": {"features": self.features, "classes": self.classes,
                          "labels_per_device": self.labels_per_device, "signal": self.signal,
                          "task_seed": self.seed},
        })

    def counts(self) -> np.ndarray:
        """(steps, world) samples each device contributes to each step (zeros included)."""
        rng = np.random.default_rng([self.seed, 0xC0])
        shares = np.asarray(self.shares, dtype=np.float64)
        shares = shares / shares.sum()
        out = np.zeros((self.steps, self.world), dtype=np.int64)
        for step in range(self.steps):
            batch = int(rng.integers(self.batch_min, self.batch_max + 1))
            counts = rng.multinomial(batch, shares)
            counts[rng.random(self.world) < self.idle_probability] = 0
            out[step] = counts
        return out

    def schedule(self) -> list[list[list[Sample]]]:
        """`[step][device]` → that device's samples of the step, in stream order (deterministic)."""
        from producers.sources import SyntheticSource

        source = SyntheticSource(self._producer_config(self.seed), self.world)
        seq = [0] * self.world
        out: list[list[list[Sample]]] = []
        for row in self.counts():
            step: list[list[Sample]] = []
            for device, n in enumerate(row.tolist()):
                drafts = source.take(device, n) if n else []
                step.append([Sample.from_array(str(device), seq[device] + i, d.array, label=d.label)
                             for i, d in enumerate(drafts)])
                seq[device] += n
            out.append(step)
        return out

    def heldout_samples(self) -> list[Sample]:
        """Held-out samples from the same device streams (another seed), in proportion to `shares`."""
        from producers.sources import SyntheticSource

        source = SyntheticSource(self._producer_config(self.seed + 10_007), self.world)
        shares = np.asarray(self.shares, dtype=np.float64) / sum(self.shares)
        out: list[Sample] = []
        for device, share in enumerate(shares):
            n = max(1, round(self.heldout * share))
            out += [Sample.from_array(f"heldout-{device}", i, d.array, label=d.label)
                    for i, d in enumerate(source.take(device, n))]
        return out


# ---------------------------------------------------------------------------------------------
# Rank programs (run in processes started by torch.multiprocessing with the spawn method)


def _rank_main(rank: int, world: int, port: int, setup: ConvergenceSetup, cells: list[str], out: str,
               messages: Any) -> None:
    import torch

    from trainer.batching import collate_packed
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


# ---------------------------------------------------------------------------------------------
# Analysis


def smoothed(accuracy: list[float], window: int) -> np.ndarray:
    """Trailing mean of the held-out accuracy over `window` evaluations (one per step)."""
    a = np.asarray(accuracy, dtype=np.float64)
    sums = np.concatenate([[0.0], np.cumsum(a)])
    idx = np.arange(1, len(a) + 1)
    lo = np.maximum(idx - window, 0)
    return (sums[idx] - sums[lo]) / (idx - lo)


def analyse(setup: ConvergenceSetup, curves: dict[str, dict[str, list[float]]]) -> list[dict[str, Any]]:
    """One row per cell: samples and steps to the target, final accuracy, ratio to SGD.

    The target is judged on the trailing mean of `setup.smooth_steps` evaluations, so one lucky
    evaluation does not count as reaching it. `samples_to_stay_at_target` is where the smoothed
    accuracy reaches the target for good (it never falls below it again before the end).
    """
    rows = []
    reference: dict[str, int | None] = {}
    for name in AGGREGATIONS:
        if name not in curves:
            continue
        curve = curves[name]
        smooth = smoothed(curve["accuracy"], setup.smooth_steps)
        above = smooth >= setup.target_accuracy
        hit = int(np.argmax(above)) if above.any() else None
        below = np.nonzero(~above)[0]
        stay = (int(below[-1]) + 1 if len(below) else 0) if above[-1] else None
        samples = int(curve["samples"][hit]) if hit is not None else None
        stay_samples = int(curve["samples"][stay]) if stay is not None else None
        if name == "sgd":
            reference = {"samples_to_target": samples, "samples_to_stay_at_target": stay_samples}
        tail = curve["accuracy"][-max(1, len(curve["accuracy"]) // 10):]
        rows.append({
            "aggregation": name,
            "samples_to_target": samples,
            "steps_to_target": int(curve["step"][hit]) if hit is not None else None,
            "samples_to_stay_at_target": stay_samples,
            "final_accuracy": round(float(np.mean(tail)), 4),
            "last_accuracy": round(float(curve["accuracy"][-1]), 4),
            "best_smoothed_accuracy": round(float(smooth.max()), 4),
            "final_heldout_loss": round(float(np.mean(curve["loss"][-len(tail):])), 4),
            "samples_trained": int(curve["samples"][-1]),
        })
    for row in rows:
        for key, ratio in (("samples_to_target", "ratio_to_sgd"), ("samples_to_stay_at_target", "stay_ratio_to_sgd")):
            ref, got = reference.get(key), row[key]
            row[ratio] = round(float(got) / ref, 4) if ref and isinstance(got, int) else None
    return rows


def plot_convergence(doc: dict[str, Any], path: Path) -> Path:
    """Held-out accuracy and loss against samples trained, one line per cell, with the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"sgd": ("black", "-", 3.0), "weighted": ("tab:blue", "--", 1.6), "plain": ("tab:red", "-", 1.4)}
    fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for name, curve in doc["curves"].items():
        color, style, width = styles.get(name, ("grey", "-", 1.0))
        label = {"sgd": "single-process SGD", "weighted": "weighted (λ = samples)",
                 "plain": "plain DDP average"}.get(name, name)
        acc = smoothed(curve["accuracy"], doc["setup"]["smooth_steps"])
        acc_ax.plot(curve["samples"], acc, style, color=color, lw=width, label=label)
        loss_ax.plot(curve["samples"], curve["loss"], style, color=color, lw=width, label=label)
    target = doc["target_accuracy"]
    acc_ax.axhline(target, color="grey", lw=0.8, ls=":")
    acc_ax.text(0, target, f" target {target:.2f}", va="bottom", color="grey", fontsize=8)
    acc_ax.set(xlabel="samples trained (global)", ylabel="held-out accuracy",
               title=f"accuracy (trailing mean of {doc['setup']['smooth_steps']} steps)")
    loss_ax.set(xlabel="samples trained (global)", ylabel="held-out cross-entropy", title="loss")
    acc_ax.legend(loc="lower right", fontsize=8)
    setup = doc["setup"]
    fig.suptitle(f"convergence with uneven batches: {setup['world']} gloo ranks, shares {setup['shares']}, "
                 f"idle p={setup['idle_probability']}, non-IID ({setup['labels_per_device']} classes/device)",
                 fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _schedule_summary(setup: ConvergenceSetup) -> dict[str, Any]:
    counts = setup.counts()
    totals = counts.sum(axis=1)
    return {
        "global_batch_min": int(totals.min()), "global_batch_median": float(np.median(totals)),
        "global_batch_max": int(totals.max()),
        "per_rank_mean_batch": [round(float(c), 2) for c in counts.mean(axis=0)],
        "idle_rank_steps": int((counts == 0).sum()), "rank_steps": int(counts.size),
        "empty_steps": int((totals == 0).sum()),
    }


def run_convergence(setup: ConvergenceSetup, out: Path, progress: Progress | None = None,
                    plot: bool = True) -> dict[str, Any]:
    """Run the three cells, write `out/convergence.json` (and `convergence.png`) and return the document."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="st-convergence-") as tmp:
        work = Path(tmp)
        _spawn(1, setup, ["sgd"], work, progress)
        _spawn(setup.world, setup, ["weighted", "plain"], work, progress)
        loaded = {name: torch.load(work / f"{name}.pt", weights_only=False) for name in AGGREGATIONS}
    curves = {name: loaded[name]["curve"] for name in AGGREGATIONS}

    def max_diff(a: str, b: str) -> float:
        pa, pb = loaded[a]["params"], loaded[b]["params"]
        return max(float((pa[k].double() - pb[k].double()).abs().max()) for k in pa)

    doc: dict[str, Any] = {
        "benchmark": "convergence",
        "target_accuracy": setup.target_accuracy,
        "cells": analyse(setup, curves),
        "weighted_vs_sgd_max_param_diff": max_diff("weighted", "sgd"),
        "plain_vs_sgd_max_param_diff": max_diff("plain", "sgd"),
        "schedule": _schedule_summary(setup),
        "setup": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(setup).items()},
        "cell_seconds": {name: round(float(loaded[name]["seconds"]), 2) for name in AGGREGATIONS},
        "seconds": round(time.perf_counter() - began, 1),
        "curves": curves,
    }
    (out / "convergence.json").write_text(json.dumps(doc, indent=1) + "\n")
    if plot:
        plot_convergence(doc, out / "convergence.png")
    return doc

