"""Measured step time against batch size: T = a·size + b, the per-device model of CHRONICA and LBB.

Times forward + backward of a model over packed batches of several total sizes (each made of
samples of random, very different lengths) and fits a line by least squares, with R². Every timing is
of a batch not seen before, as in training on a stream: a kernel library that builds kernels per input
shape (oneDNN on a CPU) pays for it here as it does there. Run:

    .venv/bin/python -m streamtrain.trainer.profiling --threads 1                  # as a CPU rank runs
    .venv/bin/python -m streamtrain.trainer.profiling --threads 1 --system-malloc  # glibc's defaults, for comparison
    .venv/bin/python -m streamtrain.trainer.profiling --threads 1 --model seq --features 1 --classes 11 --hidden 32 \
        --layers 4 --lengths 100 1344                                   # the real-series model, PLAID's lengths
    ... --length-buckets 0                                              # the same, its lengths not bucketed
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from streamtrain.config.trainer import TrainerConfig
from streamtrain.models.plugins import build_collate, build_model
from streamtrain.synthetic import synthetic_samples

from .distributed import keep_freed_memory, malloc_in_use, reserve_memory

__all__ = ["SizeTimeFit", "fit_linear", "profile_size_time", "sizes_summing_to", "time_forward_backward"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SizeTimeFit:
    """Least-squares line through (total size, seconds) points."""

    slope: float
    """a: seconds per unit of size."""
    intercept: float
    """b: fixed seconds per step."""
    r2: float
    """Coefficient of determination of the fit."""
    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def predict(self, size: float) -> float:
        """Predicted seconds for a batch of total `size`."""
        return self.slope * size + self.intercept


def fit_linear(sizes: Sequence[float], seconds: Sequence[float]) -> SizeTimeFit:
    """Fit seconds = a·size + b by least squares.

    Raises:
        ValueError: Fewer than two distinct sizes.
    """
    x = np.asarray(sizes, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    if x.shape != y.shape or len(np.unique(x)) < 2:
        raise ValueError("a linear fit needs at least two distinct sizes, one time each")
    slope, intercept = np.polyfit(x, y, 1)
    residual = float(np.sum((y - (slope * x + intercept)) ** 2))
    spread = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - residual / spread if spread > 0 else 1.0
    return SizeTimeFit(float(slope), float(intercept), r2, tuple(int(s) for s in x), tuple(float(t) for t in y))


def sizes_summing_to(total: int, low: int, high: int, rng: np.random.Generator) -> list[int]:
    """Random sample lengths in [low, high] adding up to exactly `total` (the last one is cut)."""
    sizes: list[int] = []
    remaining = total
    while remaining > 0:
        size = min(int(rng.integers(low, high + 1)), remaining)
        sizes.append(size)
        remaining -= size
    return sizes


def _time_once(model: nn.Module, batch: object, labels: torch.Tensor) -> float:
    """Seconds of one forward + cross-entropy + backward of `model` on `batch`."""
    device = labels.device
    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    F.cross_entropy(model(batch), labels).backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # kernels are async: time them, not their launch
    return time.perf_counter() - started


def time_forward_backward(model: nn.Module, batch: object, labels: torch.Tensor, repeats: int = 3) -> float:
    """Median seconds of forward + cross-entropy + backward of `model` on the same `batch` (after one warm-up)."""
    _time_once(model, batch, labels)  # the first run pays allocator and kernel-selection warm-up
    return statistics.median(_time_once(model, batch, labels) for _ in range(repeats))


def profile_size_time(
    config: TrainerConfig,
    total_sizes: Sequence[int],
    *,
    sample_sizes: tuple[int, int] = (4, 256),
    repeats: int = 3,
    device: torch.device | None = None,
    seed: int = 0,
) -> SizeTimeFit:
    """Time forward + backward of `config`'s model and collate over batches of given total sizes.

    Args:
        config: Model, collate and precision to profile.
        total_sizes: Total frames per batch, one timing each.
        sample_sizes: Range of individual sample lengths mixed into each batch.
        repeats: Timed batches per total size, each a new draw of sample lengths (the median is kept).
        device: Where to run (default CPU).
        seed: Seed of the sample lengths and payloads.

    Returns:
        The fit of seconds against total size.
    """
    device = device or torch.device("cpu")
    model = build_model(config).to(device)
    collate = build_collate(config)
    rng = np.random.default_rng(seed)

    def fresh_batch(total: int, draw: int) -> Any:
        lengths = sizes_summing_to(total, *sample_sizes, rng)
        samples = synthetic_samples(lengths, config.num_features, config.num_classes, seed=draw)
        return collate(samples, config).to(device)

    warm = fresh_batch(total_sizes[0], seed + len(total_sizes) * repeats)
    _time_once(model, warm, warm.labels)  # the process's first step: allocator and thread-pool start-up
    seconds: list[float] = []
    for i, total in enumerate(total_sizes):
        times = []
        for r in range(repeats):
            batch = fresh_batch(total, seed + i * repeats + r)
            times.append(_time_once(model, batch, batch.labels))
        seconds.append(statistics.median(times))
        logger.debug("total size %d: %.4f s (median of %d new batches)", total, seconds[-1], repeats)
    return fit_linear(total_sizes, seconds)


def main(argv: Sequence[str] | None = None) -> None:
    """Print the measured time-vs-size fit of a model (CLI output)."""
    parser = argparse.ArgumentParser(prog="python -m streamtrain.trainer.profiling",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 12288, 16384])
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--model", default="conv", help="trainer.model: a built-in name or a dotted path")
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lengths", type=int, nargs=2, default=[4, 256], metavar=("LOW", "HIGH"),
                        help="range of the sample lengths mixed into each batch")
    parser.add_argument("--length-buckets", type=int, default=TrainerConfig().length_buckets,
                        help="trainer.length_buckets (seq): lengths per power of two its time axis is padded to "
                             "(0: none)")
    parser.add_argument("--system-malloc", action="store_true",
                        help="leave glibc's defaults (no kept memory, no reserve) instead of a CPU rank's set-up")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = TrainerConfig(hidden_size=args.hidden, model=args.model, num_features=args.features,
                           num_classes=args.classes, num_layers=args.layers, length_buckets=args.length_buckets)
    if device.type == "cpu" and not args.system_malloc:
        # As a CPU rank starts (build_step_runner): memory kept for reuse and a reserve mapped in.
        if malloc_in_use() == "system":
            keep_freed_memory()
        reserve_memory(config.memory_reserve_mb)
    fit = profile_size_time(config, args.sizes, sample_sizes=(args.lengths[0], args.lengths[1]), repeats=args.repeats,
                            device=device)
    for size, secs in zip(fit.sizes, fit.seconds, strict=True):
        print(f"size {size:>7d}  {secs * 1e3:9.3f} ms  (fit {fit.predict(size) * 1e3:9.3f} ms)")
    print(f"T = {fit.slope * 1e6:.4f} us * size + {fit.intercept * 1e3:.3f} ms   R^2 = {fit.r2:.4f}  on {device}")


if __name__ == "__main__":
    main()
