"""Emulated heterogeneity for benchmarks and demos: a rank that behaves like a device `factor` times slower.

`trainer.slowdowns` names one factor per rank. A rank whose factor is above 1 wraps its step (`SlowDevice.wrap`):
after each real step it sleeps until the step's compute has taken `factor` times what it measured, and reports
the stretched compute and step times, so the coordinator, the feedback and the group's waits see a slower
device. The production step (`trainer.step`) knows nothing of it; a rank without slow-downs never installs it.

On the CPU clock the measure is the training thread's CPU time, which time-sharing the cores with other
processes (other ranks, the broker) hardly changes, so the emulated time is reproducible on a busy machine;
on the wall clock (the default with CUDA) it is the measured compute itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Literal

from streamtrain.config.trainer import TrainerConfig

from .distributed import DistContext
from .errors import TrainerSetupError
from .step import StepResult

__all__ = ["SlowDevice", "slow_device", "slowdown_for"]

logger = logging.getLogger(__name__)

StepFn = Callable[..., StepResult]


def slowdown_for(config: TrainerConfig, rank: int, world_size: int) -> float:
    """This rank's emulated slow-down factor: `trainer.slowdowns[rank]`, or 1 when none are set.

    Raises:
        TrainerSetupError: `trainer.slowdowns` names factors, but not one per rank of the group.
    """
    factors = config.slowdowns
    if not factors:
        return 1.0
    if len(factors) != world_size:
        raise TrainerSetupError(f"trainer.slowdowns names {len(factors)} factors but the group has {world_size} "
                                "ranks; give one factor per rank (e.g. [1,1,1,4])")
    return float(factors[rank])


class SlowDevice:
    """Stretches a rank's steps so that its compute takes `factor` times what it measured.

    Args:
        factor: The slow-down (>= 1).
        clock: What the factor multiplies: "cpu" (the training thread's CPU time in the step) or "wall"
            (the step's measured compute).
    """

    def __init__(self, factor: float, clock: Literal["cpu", "wall"] = "wall") -> None:
        if not factor >= 1.0:
            raise ValueError(f"slowdown factor must be >= 1, got {factor}")
        if clock not in ("cpu", "wall"):
            raise ValueError(f"slowdown clock must be 'cpu' or 'wall', got {clock!r}")
        self.factor = float(factor)
        self.clock = clock
        self.slept = 0.0
        """Seconds slept after the last step (included in its compute and step seconds)."""

    def stretched(self, compute_seconds: float, cpu_seconds: float) -> float:
        """The compute seconds this device reports for work that measured `compute_seconds` on the wall clock and
        `cpu_seconds` of the training thread: what `wrap` makes of a step, and a start-up profile of its batches."""
        measured = cpu_seconds if self.clock == "cpu" else compute_seconds
        return max(compute_seconds, self.factor * measured)

    def owed(self, result: StepResult) -> float:
        """Seconds still owed after the real step `result` for its compute to be `factor` times what it measured."""
        return self.stretched(result.compute_seconds, result.cpu_seconds) - result.compute_seconds

    def wrap(self, run_step: StepFn) -> StepFn:
        """`run_step` (a `StepRunner`'s), each step stretched by this device's factor."""

        def slowed(*args: object, **kwargs: object) -> StepResult:
            result = run_step(*args, **kwargs)
            self.slept = 0.0
            if (owed := self.owed(result)) > 0:
                began = time.perf_counter()
                time.sleep(owed)
                self.slept = time.perf_counter() - began
            return replace(result, compute_seconds=result.compute_seconds + self.slept,
                           step_seconds=result.step_seconds + self.slept)

        return slowed


def slow_device(config: TrainerConfig, ctx: DistContext) -> SlowDevice | None:
    """This rank's `SlowDevice` when `trainer.slowdowns` gives it a factor above 1, else None.

    Raises:
        TrainerSetupError: `trainer.slowdowns` does not name one factor per rank.
    """
    factor = slowdown_for(config, ctx.rank, ctx.world_size)
    if factor <= 1.0:
        return None
    clock: Literal["cpu", "wall"] = (config.slowdown_clock if config.slowdown_clock != "auto"
                                     else "wall" if ctx.device.type == "cuda" else "cpu")
    logger.info("rank %d: emulating a device %g times slower on the %s clock (trainer.slowdowns)", ctx.rank,
                factor, clock)
    return SlowDevice(factor, clock)
