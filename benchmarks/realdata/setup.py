"""What `bench realdata` runs: the policies, the fleet and its control, the window, the model and its evaluation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field, model_validator

from streamtrain.config.coordinator import POLICY_NAMES

from ..balance.setup import FLEETS, backlog_for, fleet_label
from ..common import Record

__all__ = ["DEFAULT_POLICIES", "MODEL_SETTINGS", "RealdataCell", "RealdataSetup", "cell_settings",
           "oracle_step_seconds", "schedule"]

#: The policies compared (scadles sizes batches by stream rate, which a backlog does not have).
DEFAULT_POLICIES: tuple[str, ...] = ("static", "lbbsp", "lbb", "chronica", "ett-stream")

#: The sequence model every cell trains on PLAID (the settings of the PLAID demo): per-series normalisation and
#: dilated masked convolutions whose compute grows with a batch's total length, Adam-style steps (the batch per
#: device changes every step), and the learning rate not scaled with the global batch.
MODEL_SETTINGS: dict[str, object] = {
    "trainer.model": "seq", "trainer.num_features": 1, "trainer.num_classes": 11, "trainer.hidden_size": 32,
    "trainer.num_layers": 4, "trainer.optimizer": "adamw", "trainer.lr": 0.003, "trainer.lr_scaling": False,
    "producer.dataset.sharding": "stratified",  # every device sees every appliance class in PLAID's proportions
}


@dataclass(frozen=True)
class RealdataCell:
    """One run: a policy on a fleet (the control is ett-stream on equal ranks)."""

    policy: str
    slowdowns: tuple[float, ...]

    @property
    def control(self) -> bool:
        return len(set(self.slowdowns)) == 1

    @property
    def label(self) -> str:
        return f"{self.policy} slow-downs {fleet_label(self.slowdowns)}" + (" (control)" if self.control else "")


class RealdataSetup(Record):
    """The realdata experiment: PLAID from a backlog on emulated heterogeneous ranks, time to a held-out accuracy."""

    dataset: str = "plaid"
    """The packaged dataset replayed (its train split into the device topics, its test split held out)."""
    policies: tuple[str, ...] = DEFAULT_POLICIES
    slowdowns: tuple[float, ...] = FLEETS["one-slow"]
    """The heterogeneous fleet: one slow-down factor per rank."""
    control: bool = True
    """Also run ett-stream with every factor 1 (the homogeneous control behind the oracle step time)."""
    global_batch: int = 64
    """Samples per step over all ranks (coordinator.global_batch; ett-stream's equal-time target)."""
    time_scale: float = 4.0
    """Every rank computes this many times its training thread's CPU time (slow-downs multiply on top, on the CPU
    clock). Four ranks time-share two cores here; timed by the wall clock a rank is as slow as its neighbours are
    busy, timed by its own CPU time it is as slow as its plan."""
    warmup_steps: int = 5
    """Steps left out of the step-time figures (the time to the target counts from the start of step 0)."""
    steps: int = 40
    """Measured steps after the warm-up."""
    eval_every: int = 3
    """trainer.eval_every: steps between held-out evaluations (the time to the target is read at them)."""
    smooth_evals: int = 2
    """Trailing evaluations averaged before the accuracy is compared with the target."""
    target_accuracy: float | None = Field(default=None, gt=0.0, le=1.0)
    """A fixed target; None: the rule (static's smoothed accuracy at mid-window, median over its runs)."""
    model_window: int = 8
    """coordinator.model_window: feedback records each device's time model is fitted on."""
    repeats: int = 3
    """Rounds of every cell; each round runs the cells in an order rotated by one, so no policy always runs first."""
    seed: int = 0
    start_timeout_s: float = 240.0
    extra_sets: tuple[str, ...] = ()
    """Further `KEY=VALUE` settings for every cell (after the benchmark's own)."""
    backlog_per_device: int = 0
    """Samples pre-produced per device (the shard replayed in passes): none drains inside the window; filled in."""
    quick: bool = False

    @model_validator(mode="before")
    @classmethod
    def _derived(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("backlog_per_device"):
            defaults = cls.model_fields
            until = data.get("warmup_steps", defaults["warmup_steps"].default) + data.get(
                "steps", defaults["steps"].default)
            batch = data.get("global_batch", defaults["global_batch"].default)
            slowdowns = data.get("slowdowns", defaults["slowdowns"].default)
            data = {**data, "backlog_per_device": backlog_for(batch, until, [slowdowns])}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> RealdataSetup:
        unknown = sorted(set(self.policies) - set(POLICY_NAMES))
        if unknown:
            raise ValueError(f"unknown policies {unknown}; known: {', '.join(POLICY_NAMES)}")
        if "static" not in self.policies and self.target_accuracy is None:
            raise ValueError("the target accuracy is static's: run static too, or give --target-accuracy")
        if len(self.slowdowns) < 2 or min(self.slowdowns) < 1.0:
            raise ValueError(f"slowdowns {fleet_label(self.slowdowns)}: give two or more factors >= 1, one per rank")
        if self.global_batch < self.devices:
            raise ValueError(f"global_batch {self.global_batch} is below the {self.devices} devices")
        if self.time_scale < 1.0 or self.repeats < 1 or self.steps < 2 or self.warmup_steps < 0:
            raise ValueError("time_scale >= 1, repeats >= 1, steps >= 2 and warmup_steps >= 0 are required")
        if self.eval_every < 1 or self.smooth_evals < 1:
            raise ValueError("eval_every and smooth_evals must be >= 1")
        return self

    @property
    def devices(self) -> int:
        return len(self.slowdowns)

    @property
    def until_step(self) -> int:
        return self.warmup_steps + self.steps

    @property
    def target_step(self) -> int:
        """The step whose static accuracy is the target (the middle of the measured window)."""
        return self.warmup_steps + self.steps // 2

    def cells(self) -> list[RealdataCell]:
        """One round: each policy on the fleet, then the control."""
        cells = [RealdataCell(p, self.slowdowns) for p in self.policies]
        return cells + ([RealdataCell("ett-stream", (1.0,) * self.devices)] if self.control else [])


def schedule(setup: RealdataSetup) -> list[tuple[int, RealdataCell]]:
    """(round, cell) in running order: round r runs the cells rotated by r, so that across rounds each policy runs
    early and late alike and slow drift of the shared machine falls on every policy."""
    cells = setup.cells()
    return [(rep, cells[(rep + i) % len(cells)]) for rep in range(setup.repeats) for i in range(len(cells))]


def oracle_step_seconds(control_step_seconds: float, slowdowns: tuple[float, ...]) -> float:
    """The step time of a perfect split on the fleet: the control's (equal ranks) x n / sum(1 / s_i) — each rank
    gets work in proportion to its speed, so every rank finishes together."""
    return control_step_seconds * len(slowdowns) / sum(1.0 / s for s in slowdowns)


def cell_settings(setup: RealdataSetup, cell: RealdataCell) -> dict[str, object]:
    """The settings a cell runs with, besides its broker, topic prefix, job and the dataset's own."""
    return {
        **MODEL_SETTINGS,
        "coordinator.global_batch": setup.global_batch,
        "coordinator.seed": setup.seed,
        "coordinator.model_window": setup.model_window,  # the fit forgets the warm-up's slow first steps
        "trainer.slowdowns": ",".join(f"{setup.time_scale * f:g}" for f in cell.slowdowns),
        "trainer.slowdown_clock": "cpu",
        "trainer.seed": setup.seed,
        "trainer.base_batch": setup.global_batch,
        "trainer.eval_every": setup.eval_every,
        "trainer.checkpoint_every": 100_000,  # no checkpoint pauses inside the window (one when it stops)
        "trainer.log_every": 50,
        "trainer.device": "cpu",
        "trainer.backend": "gloo",
        "producer.seed": setup.seed,
    }
