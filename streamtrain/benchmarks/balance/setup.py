"""What the balance benchmark runs: a `FleetSetup`'s plan of `Run`s (once run, also what each measured), for synthetic
streams over fleets x DIF (`BalanceSetup`) or a packaged dataset on one fleet and its control (`RealdataSetup`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import Field, JsonValue, model_validator

from streamtrain.config.coordinator import POLICY_NAMES

from ..common import Record

if TYPE_CHECKING:
    from streamtrain.stack.services import DeviceStream

__all__ = ["DEFAULT_FLEETS", "FLEETS", "REALDATA_POLICIES", "AccuracyPoint", "BalanceSetup", "FleetSetup",
           "RealdataSetup", "Run", "balanced_share", "fleet_label", "oracle_factor", "parse_fleet"]

#: Named fleets, one slow-down factor per rank (rank r computes factor_r times slower).
FLEETS: dict[str, tuple[float, ...]] = {
    "one-slow": (1.0, 1.0, 1.0, 4.0),  # three devices and one four times slower (LBB Table 2, CHRONICA Table IV)
    "two-slow": (1.0, 1.0, 4.0, 4.0),  # half the fleet slow: the fast pair carries 80% of the batch
    "graded": (1.0, 2.0, 3.0, 4.0),  # every device its own speed: no two shares alike
}
DEFAULT_FLEETS: tuple[str, ...] = ("one-slow", "two-slow")
#: The policies `bench realdata` compares (scadles sizes batches by stream rate, which a backlog does not have).
REALDATA_POLICIES: tuple[str, ...] = ("static", "lbbsp", "lbb", "chronica", "ett-stream")
#: The PLAID demo's sequence model (its compute grows with a batch's total length).
_MODEL: dict[str, object] = {
    "trainer.model": "seq", "trainer.num_features": 1, "trainer.num_classes": 11, "trainer.hidden_size": 32,
    "trainer.num_layers": 4, "trainer.optimizer": "adamw", "trainer.lr": 0.003, "trainer.lr_scaling": False}
_REGRESSION = {**{k: v for k, v in _MODEL.items() if k != "trainer.num_classes"}, "producer.dataset.sharding": "random"}
#: Each packaged dataset `bench realdata` replays: the held-out metric its runs are timed to, and its settings.
DATASETS: dict[str, tuple[str, dict[str, object]]] = {
    "plaid": ("accuracy", {**_MODEL, "producer.dataset.sharding": "stratified"}),
    "tecator": ("rmse", _REGRESSION), "covid3month": ("rmse", _REGRESSION)}

#: The backlog holds this many times the hungriest device's balanced share, for the window and the overshoot steps the
#: ranks may run past `until_step` before they stop.
_SHARE_MARGIN = 1.35
_OVERSHOOT_STEPS = 12


def fleet_label(slowdowns: tuple[float, ...], sep: str = ",") -> str:
    """`1,1,1,4`: a fleet as its factors."""
    return sep.join(f"{f:g}" for f in slowdowns)


def parse_fleet(text: str) -> tuple[float, ...]:
    """`1,1,1,4` → its factors."""
    try:
        return tuple(float(v) for v in text.replace(" ", "").split(",") if v)
    except ValueError:
        raise ValueError(f"--slowdowns {text!r}: expected comma-separated factors, e.g. 1,1,1,4") from None


def oracle_factor(slowdowns: Sequence[float]) -> float:
    """n / sum(1 / s_i): a perfect split's step over an equal fleet's."""
    return len(slowdowns) / sum(1.0 / f for f in slowdowns)


def balanced_share(slowdowns: Sequence[float]) -> float:
    """The fastest device's share of the global batch under a perfect split."""
    return (1.0 / min(slowdowns)) / sum(1.0 / f for f in slowdowns)


class AccuracyPoint(Record):
    """A held-out evaluation after `step` steps, at `seconds` of training (pauses left out): value, trailing mean."""

    step: int
    seconds: float
    accuracy: float
    smoothed: float


class Run(Record):
    """One run of a cell (a policy on a fleet, at a DIF; None: the dataset) in round `repeat`: planned, then read
    back from Kafka with its measured window and its time to the target."""

    policy: str
    slowdowns: tuple[float, ...]
    dif: float | None = None
    repeat: int = 0
    seconds: float | None = None
    run_dir: str | None = None
    error: str | None = None
    steps_measured: int = 0
    step_seconds_median: float | None = None
    """The slowest rank's step (collate, compute, all-reduce, emulated sleep): LBB Table 2's iteration time."""
    wall_step_seconds_median: float | None = None
    """Time between step completions (without the periods that held an evaluation)."""
    straggler_effect_median: float | None = None
    """LBB Eq. 4 on the ranks' compute seconds, per step."""
    samples_per_s: float | None = None
    size_per_s: float | None = None
    step_size_median: float | None = None
    trained_size_mean: float | None = None
    rank_compute_seconds_median: dict[str, float | None] = Field(default_factory=dict)
    rank_samples_median: dict[str, float | None] = Field(default_factory=dict)
    plan_wait_seconds_median: float | None = None
    step_period_split_median: dict[str, float] | None = None
    """Seconds of each of `WALL_PARTS`, read from the critical-path rank."""
    backlog_held: bool | None = None
    """Every device still had samples waiting after every measured step."""
    backlog_drained_steps: list[int] = Field(default_factory=list)
    samples_unaccounted: int | None = None
    """Produced samples neither trained, truncated, dead-lettered nor pending (0 expected)."""
    size_dif_measured: float | None = None
    accuracy: list[AccuracyPoint] = Field(default_factory=list)
    seconds_to_target: float | None = None
    """From the start of step 0 to the target loss or held-out value; None: never."""
    steps_to_target: int | float | None = None

    @property
    def control(self) -> bool:
        """Run on a fleet of equal ranks: the homogeneous control."""
        return len(set(self.slowdowns)) == 1

    @property
    def label(self) -> str:
        return (f"{self.policy} slow-downs {fleet_label(self.slowdowns)}"
                + (f" DIF {self.dif:g}" if self.dif is not None else "") + (" (control)" if self.control else ""))


class FleetSetup(Record):
    """What both workloads share: policies on emulated fleets, one global batch, a window after a warm-up."""

    policies: tuple[str, ...] = POLICY_NAMES
    global_batch: int = 512
    time_scale: float = Field(default=4.0, ge=1.0)
    """Every rank computes this x its training thread's CPU time x its slow-down factor."""
    warmup_steps: int = Field(default=10, ge=0)
    steps: int = Field(default=30, ge=1)
    model_window: int = 8
    seed: int = 0
    repeats: int = Field(default=1, ge=1)
    start_timeout_s: float = 240.0
    extra_sets: tuple[str, ...] = ()
    backlog_per_device: int = 0
    """Samples pre-produced per device (filled in)."""
    quick: bool = False
    settings: dict[str, JsonValue] = Field(default_factory=dict)
    """The settings every cell ran with (filled in by the run)."""

    @model_validator(mode="before")
    @classmethod
    def _derived(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        given = {**{name: field.default for name, field in cls.model_fields.items()}, **data}
        fleets = given["slowdowns"]
        fleets = fleets if fleets and isinstance(fleets[0], list | tuple) else [fleets]
        if "devices" in cls.model_fields:
            data = {**data, "devices": len(fleets[0])}
        if not data.get("backlog_per_device"):
            share = min(1.0, _SHARE_MARGIN * max((balanced_share(f) for f in fleets if f and min(f) > 0), default=1))
            until = given["warmup_steps"] + given["steps"] + _OVERSHOOT_STEPS
            data = {**data, "backlog_per_device": math.ceil(share * given["global_batch"] * until)}
        return data

    def _check(self, devices: int) -> None:
        if unknown := sorted(set(self.policies) - set(POLICY_NAMES)):
            raise ValueError(f"unknown policies {unknown}; known: {', '.join(POLICY_NAMES)}")
        if self.global_batch < devices:
            raise ValueError(f"global_batch {self.global_batch} is below the {devices} devices")

    @property
    def until_step(self) -> int:
        return self.warmup_steps + self.steps

    def cell_settings(self, slowdowns: tuple[float, ...]) -> dict[str, object]:
        """The settings a cell on `slowdowns` runs with, besides its broker, topic prefix and job."""
        return {"coordinator.global_batch": self.global_batch, "coordinator.seed": self.seed,
                "coordinator.model_window": self.model_window,
                "trainer.slowdowns": ",".join(f"{self.time_scale * f:g}" for f in slowdowns),
                "trainer.slowdown_clock": "cpu", "trainer.seed": self.seed, "trainer.base_batch": self.global_batch,
                "trainer.checkpoint_every": 100_000,  # no checkpoint pauses inside the window
                "trainer.log_every": 50, "trainer.device": "cpu", "trainer.backend": "gloo"}


class BalanceSetup(FleetSetup):
    """The synthetic workload: policies x fleets x DIF, sizes of mean `size_mean` and std DIF."""

    slowdowns: tuple[tuple[float, ...], ...] = tuple(FLEETS[name] for name in DEFAULT_FLEETS)
    difs: tuple[float, ...] = (0.0, 16.0, 64.0)
    size_mean: float = 45.0
    smooth_steps: int = 5
    """Trailing steps the loss is averaged over before it is compared with the target."""
    devices: int = 0
    """Ranks per fleet (filled in)."""

    @model_validator(mode="after")
    def _consistent(self) -> BalanceSetup:
        if not self.slowdowns or len({len(s) for s in self.slowdowns}) != 1:
            raise ValueError("slowdowns: give one or more factor lists, all of the same length (one per rank)")
        if any(f <= 0 for s in self.slowdowns for f in s):
            raise ValueError(f"slowdowns: every factor must be positive (got {self.slowdowns})")
        self._check(self.devices)
        return self

    def cells(self) -> list[Run]:
        """Fleets x DIF x policies; on the control's equal ranks only static at the smallest DIF."""
        return [Run(policy=p, slowdowns=s, dif=d) for s in self.slowdowns for d in self.difs for p in self.policies
                if len(set(s)) > 1 or (p == "static" and d == min(self.difs))]

    def plan(self) -> list[Run]:
        """The runs in running order: the whole matrix, `repeats` times."""
        return [cell.model_copy(update={"repeat": rep}) for rep in range(self.repeats) for cell in self.cells()]

    def streams(self, cell: Run) -> list[DeviceStream]:
        """Each device's stream: sizes of mean `size_mean` and std the cell's DIF."""
        from streamtrain.stack.services import DeviceStream, size_kind_for

        dif = cell.dif or 0.0
        kind = size_kind_for(self.size_mean, dif)
        return [DeviceStream(str(d), 1.0, self.size_mean, dif, kind) for d in range(self.devices)]

    def settings_of(self, cell: Run) -> dict[str, object]:
        """A cell's settings (scadles: b_min = an equal share, as ScaDLES gives equal streams)."""
        sets = {**self.cell_settings(cell.slowdowns), "producer.synthetic.task_seed": self.seed}
        if cell.policy == "scadles":
            sets["coordinator.b_min"] = self.global_batch // self.devices
        return sets


class RealdataSetup(FleetSetup):
    """The dataset workload: a packaged dataset of `DATASETS` replayed on one fleet, timed to a held-out metric."""

    dataset: str = "plaid"
    policies: tuple[str, ...] = REALDATA_POLICIES
    slowdowns: tuple[float, ...] = FLEETS["one-slow"]
    control: bool = True
    """Also run ett-stream with every factor 1: the homogeneous control."""
    global_batch: int = 64
    warmup_steps: int = Field(default=5, ge=0)
    steps: int = Field(default=40, ge=2)
    eval_every: int = Field(default=3, ge=1)
    smooth_evals: int = Field(default=2, ge=1)
    target_accuracy: float | None = Field(default=None, gt=0.0)
    """A fixed target of the held-out metric; None: static's at mid-window."""
    repeats: int = Field(default=3, ge=1)

    @property
    def held_out_metric(self) -> str:
        """accuracy, or rmse (a falling one)."""
        return DATASETS[self.dataset][0]

    @property
    def lower_is_better(self) -> bool:
        return self.held_out_metric != "accuracy"

    @model_validator(mode="after")
    def _consistent(self) -> RealdataSetup:
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset {self.dataset!r}: bench realdata replays {', '.join(DATASETS)}")
        if self.target_accuracy is not None and not self.lower_is_better and self.target_accuracy > 1.0:
            raise ValueError(f"target {self.target_accuracy} of {self.held_out_metric} is above 1")
        if len(self.slowdowns) < 2 or min(self.slowdowns) < 1.0:
            raise ValueError(f"slowdowns {fleet_label(self.slowdowns)}: give two or more factors >= 1, one per rank")
        self._check(self.devices)
        if "static" not in self.policies and self.target_accuracy is None:
            raise ValueError("the target accuracy is static's: run static too, or give --target-accuracy")
        return self

    @property
    def devices(self) -> int:
        return len(self.slowdowns)

    @property
    def target_step(self) -> int:
        """Mid-window: the step of static's value that is the target."""
        return self.warmup_steps + self.steps // 2

    def cells(self) -> list[Run]:
        """One round: each policy on the fleet, then the control."""
        return ([Run(policy=p, slowdowns=self.slowdowns) for p in self.policies]
                + ([Run(policy="ett-stream", slowdowns=(1.0,) * self.devices)] if self.control else []))

    def plan(self) -> list[Run]:
        """The runs in running order, round r's cells rotated by r."""
        cells = self.cells()
        return [cells[(rep + i) % len(cells)].model_copy(update={"repeat": rep})
                for rep in range(self.repeats) for i in range(len(cells))]

    def streams(self, cell: Run) -> list[DeviceStream]:
        """Replayed: a stream's rate and sizes do not apply."""
        from streamtrain.stack.services import DeviceStream

        return [DeviceStream(str(d), 1.0, 1.0, 0.0) for d in range(self.devices)]

    def settings_of(self, cell: Run) -> dict[str, object]:
        """A cell's settings, besides the dataset's own."""
        return {**DATASETS[self.dataset][1], **self.cell_settings(cell.slowdowns),
                "trainer.eval_every": self.eval_every, "producer.seed": self.seed}
