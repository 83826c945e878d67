"""What `bench realdata` measures, typed: each run's figures, each policy's medians, the targets, the JSON."""

from __future__ import annotations

from pydantic import Field, JsonValue

from ..balance.results import CellFigures
from ..common import Record
from .setup import RealdataSetup

__all__ = ["AccuracyPoint", "PolicyResult", "RealdataResult", "RealdataRunSetup", "RealdataTargets", "RunResult"]


class AccuracyPoint(Record):
    """One held-out evaluation of a run."""

    step: int
    """Steps done when the model was evaluated."""
    seconds: float
    """Training time from the start of step 0 to the end of the last of those steps, earlier evaluations' pauses
    left out."""
    accuracy: float
    smoothed: float
    """The trailing mean of the accuracy over the setup's `smooth_evals` evaluations (what meets the target)."""


class RunResult(CellFigures):
    """One run of one cell: the step figures of its window (`CellFigures`) and its held-out accuracy over time."""

    policy: str
    slowdowns: tuple[float, ...]
    control: bool = False
    repeat: int = 0
    order: int = 0
    """Its place in the whole schedule."""
    wall_period_seconds_median: float | None = None
    """Median time between consecutive step completions over the window, a period holding an evaluation left out:
    the step time a trainer sees, plan round trip, data wait and all-reduce included."""
    accuracy: list[AccuracyPoint] = Field(default_factory=list)
    seconds_to_target: float | None = None
    """Training time to the first evaluation whose smoothed accuracy reaches the target (None: never)."""
    steps_to_target: int | None = None
    final_accuracy: float | None = None
    samples_trained: int | None = None
    samples_unaccounted: int | None = None
    """Produced samples neither trained, truncated, dead-lettered nor pending (0 expected)."""
    backlog_left_min: int | None = None
    """The smallest backlog any device had left when the run stopped (> 0: no device ran dry in the window)."""
    seconds: float | None = None
    """Wall time of the whole run, start-up and read-back included."""
    run_dir: str | None = None
    error: str | None = None


class PolicyResult(Record):
    """One cell over its runs: the median of each figure, and each run's time to the target."""

    policy: str
    slowdowns: tuple[float, ...]
    control: bool = False
    runs: int
    failed_runs: int = 0
    seconds_to_target: float | None = None
    """Median over runs, a run that never reached the target counted as the slowest (None when most did not)."""
    seconds_to_target_runs: list[float | None] = Field(default_factory=list)
    steps_to_target: float | None = None
    seconds_per_step_to_target: float | None = None
    """Median over the runs that reached the target of their time to it over the steps it took (step 0 and the
    first steps' settling included): the pace of the whole run up to the target, not of its steady steps."""
    wall_period_seconds_median: float | None = None
    step_seconds_median: float | None = None
    """The slowest rank's step (collate, compute, all-reduce, emulated sleep), median over runs of run medians."""
    straggler_effect_median: float | None = None
    samples_per_s: float | None = None
    final_accuracy: float | None = None
    rank_samples_median: dict[str, float | None] = Field(default_factory=dict)
    """Per device: median samples per step (the split the policy made)."""
    samples_unaccounted: int | None = None
    """Summed over runs."""
    error: str | None = None


class RealdataTargets(Record):
    """ett-stream against the other policies and the oracle."""

    target_accuracy: float | None
    target_rule: str
    best_other_policy: str | None
    best_other_seconds_to_target: float | None
    ett_stream_seconds_to_target: float | None
    no_later_than_best_met: bool | None
    """ett-stream's median time to the target <= the best other policy's."""
    speedup_vs_static: float | None
    """static's median time to the target over ett-stream's (target >= 2)."""
    speedup_met: bool | None
    control_wall_period_seconds: float | None
    oracle_step_seconds: float | None
    """control x n / sum(1 / s_i): the step time of a perfect split of the fleet."""
    ett_stream_wall_period_seconds: float | None
    over_oracle: float | None
    """ett-stream's median step time (wall period) over the oracle's (target <= 1.15)."""
    oracle_seconds_to_target: float | None = None
    """A perfect split's time to the target: the control's seconds per step to its target x n / sum(1 / s_i)
    (the oracle rule applied to the whole run up to the target, first steps included) x static's steps to it."""
    oracle_speedup_vs_static: float | None = None
    """static's median time to the target over the oracle's: the most any split of this fleet could gain over
    static in as many steps, the bound on `speedup_vs_static`."""
    ett_stream_over_oracle_to_target: float | None = None
    """ett-stream's seconds per step to the target over the oracle's (its steady steps are `over_oracle`)."""
    oracle_is_bound: bool | None = None
    """Whether the control was no slower than ett-stream on the heterogeneous fleet (else its oracle bounds
    nothing, and `oracle_met` is None)."""
    oracle_met: bool | None


class RealdataRunSetup(RealdataSetup):
    """The setup as `realdata.json` stores it: with the settings every cell ran with."""

    settings: dict[str, JsonValue] = Field(default_factory=dict)


class RealdataResult(Record):
    """What `realdata.json` holds."""

    setup: RealdataRunSetup
    seconds: float
    policies: list[PolicyResult]
    """The heterogeneous fleet's cells, then the control."""
    targets: RealdataTargets
    runs: list[RunResult]
    """Every run, in the order they ran."""

    def find(self, policy: str, control: bool = False) -> PolicyResult | None:
        """The combined cell of `policy` (on the heterogeneous fleet, or the control)."""
        return next((p for p in self.policies if p.policy == policy and p.control == control), None)
