"""A rank's start-up profile (LBB's profiling phase, Alg. 1): how long its own steps take, measured before the first.

    start_rank(rank)   # resume; then profile, report, and wait (bounded) for the step-0 plan made from the report

The rank times collate, forward and backward of its own model (the bare module: no collective and no optimizer step,
so the weights are untouched; batch-norm statistics are put back) on batches of 1/4, 1 and 2 times its equal share of
`coordinator.global_batch`, made of its first buffered samples (repeated when there are fewer): each batch once to
warm up (a kernel library that builds kernels per input shape, oneDNN on a CPU, builds them then, as a step of that
shape did before), then three times, the least kept (contention for the cores only ever adds time). Every time goes
through `SlowDevice.stretched`, as a step's compute does in `SlowDevice.wrap`, so an emulated device 4x slower
profiles 4x slower. The line T = a·size + b through the points goes to the coordinator as a `DeviceProfile` on the
feedback topic (`trainer.startup_profile`); the coordinator plans step 0 from it (`coordinator.use_profiles`), so the
rank waits for a step-0 plan created after its profile was sent (by the coordinator's clock against its own: a clock
behind only makes the rank wait the whole bound), at most `coordinator.profile_wait_seconds` +
`trainer.plan_wait_seconds`, before it runs step 0 with the newest plan it has.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch
from confluent_kafka import KafkaError, Message, Producer

from streamtrain.config import StreamtrainConfig, TrainerConfig
from streamtrain.kafka import produce
from streamtrain.wire import DeviceProfile, Sample, encode

from .consumer import RankConsumer
from .distributed import DistContext
from .emulation import SlowDevice
from .plans import PlanBook
from .profiling import fit_linear
from .step import StepRunner

__all__ = ["ProfiledRank", "fit_nonnegative", "profile_counts", "profile_runner", "start_rank"]

logger = logging.getLogger(__name__)

_SHARES = (0.25, 1.0, 2.0)
"""Profiled batches, as fractions of the rank's equal share of the global batch."""
_REPEATS = 3
"""Timed passes per batch (after one warm-up pass of it); the least is kept."""
_SEND_TIMEOUT_S = 10.0


class ProfiledRank(Protocol):
    """What a start-up profile uses of a `streamtrain.trainer.rank.TrainerRank`."""

    config: StreamtrainConfig
    trainer: TrainerConfig
    device_id: str
    ctx: DistContext
    runner: StepRunner
    slow: SlowDevice | None
    consumer: RankConsumer
    plans: PlanBook
    producer: Producer
    feedback_topic: str
    step: int

    def resume(self) -> int: ...


def profile_counts(global_batch: int, world_size: int) -> list[int]:
    """Samples per profiled batch: 1/4, 1 and 2 times the equal share of `global_batch` (distinct, at least 1)."""
    share = max(-(-global_batch // max(world_size, 1)), 1)
    return sorted({max(1, round(share * f)) for f in _SHARES})


def fit_nonnegative(sizes: Sequence[int], seconds: Sequence[float]) -> tuple[float, float]:
    """(a, b) of T = a·size + b by least squares, with a > 0 and b >= 0.

    A negative intercept puts the line through the origin; a slope <= 0 (noise: a larger batch never trains faster)
    keeps the median time as fixed cost and a slope a thousandth of it per largest batch, so that a planner does not
    read unlimited capacity into it.
    """
    x = np.asarray(sizes, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    if len(np.unique(x)) >= 2:
        fit = fit_linear(x.tolist(), y.tolist())
        a, b = fit.slope, fit.intercept
    else:
        a, b = 0.0, 0.0
    if a <= 0:
        b = float(np.median(y))
        return 1e-3 * b / float(x.max()), b
    if b < 0:
        return float((x * y).sum() / (x * x).sum()), 0.0
    return float(a), float(b)


def _time_batch(runner: StepRunner, samples: Sequence[Sample], slow: SlowDevice | None) -> float:
    """Compute seconds of collate, forward and backward of the bare model on `samples`, as a step reports them."""
    module = runner.model.module
    started, cpu_started = time.perf_counter(), time.thread_time()
    batch = runner.collate(samples, runner.config)
    if runner.device.type != "cpu":
        batch = batch.to(runner.device)
    runner.objective.losses(module(batch), batch).mean().backward()
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)  # kernels are async: time them, not their launch
    wall, cpu = time.perf_counter() - started, time.thread_time() - cpu_started
    module.zero_grad(set_to_none=True)
    return slow.stretched(wall, cpu) if slow is not None else wall


def profile_runner(runner: StepRunner, samples: Sequence[Sample], counts: Sequence[int],
                   slow: SlowDevice | None = None) -> tuple[list[int], list[float]]:
    """Total size and compute seconds of a batch of each of `counts` samples (drawn from `samples` in turn).

    Args:
        runner: The rank's step runner (its bare module, collate and objective are used; the weights are not changed).
        samples: At least one sample to build the batches of.
        counts: Samples per profiled batch.
        slow: The rank's emulated slow-down, if any: each time is stretched as its steps' are.
    """
    if not samples:
        raise ValueError("a profile needs at least one sample")
    module = runner.model.module
    buffers = [b for b in module.buffers() if b.is_floating_point()]
    saved = [b.detach().clone() for b in buffers]
    batches = [[samples[i % len(samples)] for i in range(count)] for count in counts]
    seconds = []
    try:
        for batch in batches:
            _time_batch(runner, batch, slow)  # the first pass of a shape pays allocator and kernel-building warm-up
            seconds.append(min(_time_batch(runner, batch, slow) for _ in range(_REPEATS)))
    finally:
        with torch.no_grad():
            for buffer, before in zip(buffers, saved, strict=True):
                buffer.copy_(before)
        module.zero_grad(set_to_none=True)
    return [sum(s.size for s in batch) for batch in batches], seconds


def start_rank(rank: ProfiledRank) -> None:
    """Resume `rank`; then, on a fresh start with `trainer.startup_profile`, profile it and report the profile."""
    if not rank.trainer.startup_profile:
        rank.resume()
        return
    counts = profile_counts(rank.config.coordinator.global_batch, rank.ctx.world_size)
    rank.consumer.keep_first = max(counts)  # its first samples are what it profiles with
    rank.resume()
    try:
        if rank.step == 0:  # not when resumed from a checkpoint: the coordinator's models have its feedback
            _profile_and_report(rank, counts)
    finally:
        rank.consumer.keep_first, rank.consumer.first_samples = 0, []


def _profile_and_report(rank: ProfiledRank, counts: list[int]) -> None:
    ccfg, consumer = rank.config.coordinator, rank.consumer
    end = consumer.high_watermark(fresh=True)  # enough samples, or every one there was at start-up (a short backlog)
    consumer.wait_until(lambda: len(consumer.first_samples) >= max(counts)
                        or (bool(consumer.first_samples) and consumer.buffer.position >= end),
                        time.perf_counter() + ccfg.profile_wait_seconds)
    samples = list(consumer.first_samples)
    if not samples:
        logger.info("rank %d (%s): no sample within %.1f s to profile with: step 0 is planned from the warm start",
                    rank.ctx.rank, rank.device_id, ccfg.profile_wait_seconds)
        return
    started = time.perf_counter()
    try:
        sizes, seconds = profile_runner(rank.runner, samples, counts, rank.slow)
    except (RuntimeError, ValueError) as exc:  # out of memory at the largest batch, a plug-in that fails on it ...
        logger.warning("rank %d (%s): start-up profile failed, step 0 is planned from the warm start: %s",
                       rank.ctx.rank, rank.device_id, exc)
        return
    a, b = fit_nonnegative(sizes, seconds)
    took = time.perf_counter() - started
    profile = DeviceProfile(job=rank.config.job, device_id=rank.device_id, rank=rank.ctx.rank, sizes=tuple(sizes),
                            seconds=tuple(seconds), slope=a, intercept=b,
                            mean_sample_size=float(np.mean([s.size for s in samples])), profile_seconds=took)
    logger.info("rank %d (%s): start-up profile in %.2f s: T = %.4g s x size + %.4g s (batches of %s samples, total "
                "sizes %s: %s ms; mean sample size %.1f)", rank.ctx.rank, rank.device_id, took, a, b, counts, sizes,
                ", ".join(f"{t * 1e3:.1f}" for t in seconds), profile.mean_sample_size)
    value, headers = encode(profile)
    produce(rank.producer, rank.feedback_topic, value, headers, _delivered, rank.device_id.encode())
    rank.producer.flush(_SEND_TIMEOUT_S)
    if not ccfg.use_profiles:
        return
    wait = ccfg.profile_wait_seconds + rank.trainer.plan_wait_seconds
    if not consumer.wait_until(lambda: (plan := rank.plans.get(0)) is not None and plan.created_at >= profile.sent_at,
                               time.perf_counter() + wait):
        logger.info("rank %d (%s): no step-0 plan after the profile within %.1f s; step 0 runs on the plan there is",
                    rank.ctx.rank, rank.device_id, wait)


def _delivered(err: KafkaError | None, _msg: Message) -> None:
    if err is not None:
        logger.error("the start-up profile could not be delivered (step 0 is planned from the warm start): %s", err)
