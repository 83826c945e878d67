"""What `bench balance` runs: the matrix of policies x fleets x DIF, the stream, the batch, the window."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import model_validator

from streamtrain.config.coordinator import POLICY_NAMES

from ..common import Record

__all__ = ["DEFAULT_FLEETS", "FLEETS", "BalanceCell", "BalanceSetup", "backlog_for", "balanced_share", "cell_settings",
           "fleet_label", "oracle_factor"]

#: Named fleets, one slow-down factor per rank (rank r computes factor_r times slower). `--fleet NAME` runs one;
#: a new pattern is one line here.
FLEETS: dict[str, tuple[float, ...]] = {
    "one-slow": (1.0, 1.0, 1.0, 4.0),  # three devices and one four times slower (LBB Table 2, CHRONICA Table IV)
    "two-slow": (1.0, 1.0, 4.0, 4.0),  # half the fleet slow: the fast pair carries 80% of the batch
    "graded": (1.0, 2.0, 3.0, 4.0),  # every device its own speed: no two shares alike
}
#: The fleets a run measures unless told otherwise.
DEFAULT_FLEETS: tuple[str, ...] = ("one-slow", "two-slow")

#: The backlog holds this many times the hungriest device's balanced share (a plan fitted on noisy models, or one
#: that picks small samples first, may ask a device for more than its speed's share for a while).
_SHARE_MARGIN = 1.35
#: Steps the ranks may run past `until_step` before they stop (the stack polls twice a second).
_OVERSHOOT_STEPS = 12


def backlog_for(global_batch: int, until_step: int, fleets: Sequence[Sequence[float]]) -> int:
    """Samples to pre-produce per device so that no device's backlog drains before `until_step` (nor in the steps
    the ranks may run past it), whichever policy splits `global_batch` samples per step on any of `fleets`: the
    hungriest device's balanced share, with a margin for a policy that gives it more."""
    share = min(1.0, _SHARE_MARGIN * max((balanced_share(f) for f in fleets if f and min(f) > 0), default=1.0))
    return math.ceil(share * global_batch * (until_step + _OVERSHOOT_STEPS))


def fleet_label(slowdowns: tuple[float, ...], sep: str = ",") -> str:
    """`1,1,1,4`: a fleet as its factors."""
    return sep.join(f"{f:g}" for f in slowdowns)


def oracle_factor(slowdowns: Sequence[float]) -> float:
    """n / sum(1 / s_i): how much longer than an equal fleet's step a perfect split of the same global batch takes
    (each device trains in proportion to its speed, so all finish together)."""
    return len(slowdowns) / sum(1.0 / f for f in slowdowns)


def balanced_share(slowdowns: Sequence[float]) -> float:
    """The fastest device's share of the global batch under a perfect split: (1 / s_min) / sum(1 / s_i)."""
    return (1.0 / min(slowdowns)) / sum(1.0 / f for f in slowdowns)


@dataclass(frozen=True)
class BalanceCell:
    """One run of the matrix."""

    policy: str
    slowdowns: tuple[float, ...]
    dif: float

    @property
    def label(self) -> str:
        return f"{self.policy} slow-downs {fleet_label(self.slowdowns)} DIF {self.dif:g}"


class BalanceSetup(Record):
    """The balance experiment: the matrix, the stream, the batch and the measured window."""

    policies: tuple[str, ...] = POLICY_NAMES
    slowdowns: tuple[tuple[float, ...], ...] = tuple(FLEETS[name] for name in DEFAULT_FLEETS)
    """The fleets: one list of per-rank slow-down factors each, all of the same length."""
    difs: tuple[float, ...] = (0.0, 16.0, 64.0)
    size_mean: float = 45.0
    global_batch: int = 512
    """Samples per step over all ranks (coordinator.global_batch)."""
    time_scale: float = 4.0
    """Every rank computes this many times slower than its CPU time on this machine (the slow-down factors
    multiply on top, on the CPU clock: `trainer.slowdown_clock=cpu`). With 4 ranks time-sharing 2 cores, a rank
    timed by the wall clock is as slow as its neighbours are busy; a rank that needs only a third of a core
    for its emulated speed is not, so the cell's balance is the plan's, not the scheduler's."""
    warmup_steps: int = 10
    """Steps left out of every figure but the time to the target loss."""
    steps: int = 30
    """Measured steps after the warm-up."""
    smooth_steps: int = 5
    """Trailing steps the loss is averaged over before it is compared with the target."""
    model_window: int = 8
    """coordinator.model_window: feedback records each device's time model is fitted on (every policy
    that uses the models gets the same)."""
    seed: int = 0
    repeats: int = 1
    """Runs of the whole matrix, one after another (each cell's figures are the median over its runs, so slow
    drift of the machine falls on every policy alike)."""
    start_timeout_s: float = 240.0
    extra_sets: tuple[str, ...] = ()
    """Further `KEY=VALUE` settings for every cell, as `--set` takes them (after the benchmark's own)."""
    devices: int = 0
    """Ranks (the length of each fleet); filled in from `slowdowns`."""
    backlog_per_device: int = 0
    """Samples pre-produced per device: the hungriest device's balanced share of every step until the ranks stop,
    with margin, for the hungriest fleet; filled in. Sized, not assumed: the analysis checks from the feedback
    that every device still had samples waiting at every measured step (`CellFigures.backlog_held`)."""
    quick: bool = False
    """Whether `--quick` chose the matrix and the window (a note for the reader of the JSON)."""

    @model_validator(mode="before")
    @classmethod
    def _derived(cls, data: Any) -> Any:
        # Stored with the setup (a result says what it ran with), computed when not given.
        if isinstance(data, dict):
            defaults = cls.model_fields
            slowdowns = data.get("slowdowns", defaults["slowdowns"].default)
            until = data.get("warmup_steps", defaults["warmup_steps"].default) + data.get(
                "steps", defaults["steps"].default)
            batch = data.get("global_batch", defaults["global_batch"].default)
            data = {"devices": len(slowdowns[0]) if slowdowns else 0,
                    "backlog_per_device": backlog_for(batch, until, slowdowns), **data}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> BalanceSetup:
        unknown = sorted(set(self.policies) - set(POLICY_NAMES))
        if unknown:
            raise ValueError(f"unknown policies {unknown}; known: {', '.join(POLICY_NAMES)}")
        if not self.slowdowns or len({len(s) for s in self.slowdowns}) != 1:
            raise ValueError("slowdowns: give one or more factor lists, all of the same length (one per rank)")
        if any(f <= 0 for s in self.slowdowns for f in s):
            raise ValueError(f"slowdowns: every factor must be positive (got {self.slowdowns})")
        if self.devices != len(self.slowdowns[0]):
            raise ValueError(f"devices {self.devices} differs from the {len(self.slowdowns[0])} factors per fleet")
        if self.global_batch < self.devices:
            raise ValueError(f"global_batch {self.global_batch} is below the {self.devices} devices")
        if not self.time_scale >= 1.0:
            raise ValueError(f"time_scale must be >= 1 (got {self.time_scale})")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1 (got {self.repeats})")
        if self.steps < 1 or self.warmup_steps < 0:
            raise ValueError("steps >= 1 and warmup_steps >= 0 are required")
        return self

    @property
    def until_step(self) -> int:
        return self.warmup_steps + self.steps

    def cells(self) -> list[BalanceCell]:
        """The matrix, slow-downs outermost, then DIF, then policy (so one DIF's policies run back to back)."""
        return [BalanceCell(p, s, d) for s in self.slowdowns for d in self.difs for p in self.policies]


def cell_settings(setup: BalanceSetup, cell: BalanceCell) -> dict[str, object]:
    """The settings a cell runs with, besides its broker, topic prefix and job (and the command's own --set)."""
    sets: dict[str, object] = {
        "coordinator.global_batch": setup.global_batch,
        "coordinator.seed": setup.seed,
        # The fit forgets the warm-up: its first steps (warm-start plans, DDP start-up) are slow, large batches
        # whose leverage would bias the models for most of the window with the default 64 records.
        "coordinator.model_window": setup.model_window,
        "trainer.slowdowns": ",".join(f"{setup.time_scale * f:g}" for f in cell.slowdowns),
        "trainer.slowdown_clock": "cpu",
        "trainer.seed": setup.seed,
        "trainer.base_batch": setup.global_batch,  # lr is trainer.lr at the benchmark's global batch
        "trainer.checkpoint_every": 100_000,  # no checkpoint pauses inside the window (one when it stops)
        "trainer.log_every": 50,
        "trainer.device": "cpu",
        "trainer.backend": "gloo",
        "producer.synthetic.task_seed": setup.seed,
    }
    if cell.policy == "scadles":
        sets["coordinator.b_min"] = setup.global_batch // setup.devices  # equal streams, equal rates
    return sets
