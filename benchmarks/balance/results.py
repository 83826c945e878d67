"""What the balance benchmark measures, typed: each run's window (`CellFigures`), then per workload its cells,
the targets, and the JSON (`balance.json`: `BalanceResult`; `realdata.json`: `RealdataResult`)."""

from __future__ import annotations

from pydantic import Field

from ..common import Record, Result
from .setup import BalanceRunSetup, RealdataRunSetup

__all__ = ["AccuracyPoint", "BalanceResult", "BalanceTargets", "CellComparison", "CellFigures", "CellResult",
           "PolicyResult", "RealdataResult", "RealdataTargets", "RunResult", "RunSummary"]


class CellFigures(Record):
    """What one run of a cell's feedback records give, over its measured window."""

    steps_measured: int = 0
    """Steps of the window every rank reported."""
    step_seconds_median: float | None = None
    """The slowest rank's step (collate, compute, all-reduce, emulated sleep): LBB Table 2's iteration time."""
    wall_step_seconds_median: float | None = None
    """Time between consecutive step completions, plan round trip and data waits included."""
    straggler_effect_median: float | None = None
    """LBB Eq. 4 on the ranks' compute seconds, per step."""
    samples_per_s: float | None = None
    size_per_s: float | None = None
    """Work: sample size trained per second."""
    global_batch_median: float | None = None
    step_size_median: float | None = None
    trained_size_mean: float | None = None
    """Mean size of the samples trained (a policy that picks small samples first trains less per sample)."""
    rank_compute_seconds_median: dict[str, float | None] = Field(default_factory=dict)
    rank_samples_median: dict[str, float | None] = Field(default_factory=dict)
    local_plan_rank_steps: int = 0
    """Rank-steps trained on a local fallback plan (no plan from the coordinator in time)."""
    plan_wait_seconds_median: float | None = None
    """Median over the window of the critical-path rank's wait for its plan (0 when plans are made ahead in time)."""
    step_period_split_median: dict[str, float] | None = None
    """Median seconds over the window of each part of a step's wall period (compute, communication, plan_wait,
    data_wait, hold, other), each read from the critical-path rank."""
    backlog_held: bool | None = None
    """Whether every device still had samples waiting (buffer depth > 0 after its step) at every measured step:
    False flags a window in which some device ran out of work, whose steps say nothing about balance."""
    backlog_drained_steps: list[int] | None = None
    """The measured steps at which some device reported an empty buffer (empty when the backlog held)."""
    buffer_depth_min: dict[str, int] | None = None
    """Each device's smallest buffer depth over the window (the margin the backlog left)."""
    final_loss: float | None = None
    loss_curve: list[tuple[float, float]] | None = None
    """[seconds since step 0 began, trailing-mean loss] per step up to the window's end (kept in single runs)."""


class RunSummary(Record):
    """One run of a repeated cell, as the cell lists it."""

    repeat: int | None = None
    step_seconds_median: float | None = None
    straggler_effect_median: float | None = None
    size_per_s: float | None = None
    seconds_to_target_loss: float | None = None
    run_dir: str | None = None
    error: str | None = None


class CellResult(CellFigures):
    """One cell of the matrix: a single run, or (`runs` set) the median over its repeated runs."""

    policy: str
    slowdowns: tuple[float, ...]
    dif: float
    size_kind: str | None = None
    repeat: int | None = None
    """Which run of the matrix this is (single runs)."""
    repeats: int | None = None
    """Runs combined (combined cells)."""
    seconds: float | None = None
    steps: int | None = None
    samples_trained: int | None = None
    samples_pending: int | None = None
    samples_unaccounted: int | None = None
    samples_lost: int | None = None
    """Samples neither trained nor left pending (a lost sample; 0 expected)."""
    size_mean_measured: float | None = None
    size_dif_measured: float | None = None
    plan_latency_ms_median: float | None = None
    backlog_seconds: float | None = None
    run_dir: str | None = None
    straggler_effect_of_medians: float | None = None
    """LBB Eq. 4 on the ranks' median compute over the window."""
    target_loss: float | None = None
    seconds_to_target_loss: float | None = None
    """From the start of step 0 to the first step whose trailing-mean loss reaches its DIF's target."""
    runs: list[RunSummary] | None = None
    failed_runs: int | None = None
    error: str | None = None

    def summary(self) -> RunSummary:
        return RunSummary(repeat=self.repeat, step_seconds_median=self.step_seconds_median,
                          straggler_effect_median=self.straggler_effect_median, size_per_s=self.size_per_s,
                          seconds_to_target_loss=self.seconds_to_target_loss, run_dir=self.run_dir, error=self.error)


class CellComparison(Record):
    """ett-stream in one (fleet, DIF) cell: against the best policy by work rate, the oracle, static and chronica."""

    slowdowns: tuple[float, ...]
    dif: float
    best_policy: str
    best_size_per_s: float
    ett_stream_size_per_s: float
    best_over_ett_stream: float
    within_5_percent: bool
    ett_stream_wall_seconds: float | None = None
    """ett-stream's median wall step period."""
    oracle_wall_seconds: float | None = None
    """The control's wall period x n / sum(1 / s_i): a perfect split of the same batch on this fleet."""
    over_oracle: float | None = None
    """ett-stream's wall period over the oracle's (1.0 = perfect)."""
    over_oracle_runs: list[float] | None = None
    """With repeats: each run's ett-stream wall period over its own repeat's oracle (the spread behind the median)."""
    oracle_tolerance: float | None = None
    """The allowed excess over the oracle: 5% at DIF 0, 10% with varying sizes."""
    within_oracle: bool | None = None
    wall_speedup_vs_static: float | None = None
    """static's median wall period over ett-stream's."""
    ett_stream_seconds_to_target: float | None = None
    chronica_seconds_to_target: float | None = None
    target_no_later_than_chronica: bool | None = None
    """Whether ett-stream reached the target loss no later than chronica (None without both figures)."""
    backlog_held: bool | None = None
    """Whether every policy's window in this cell ended before any device's backlog drained."""


class BalanceTargets(Record):
    """The targets, judged at the first heterogeneous fleet and the largest DIF."""

    slowdowns: tuple[float, ...]
    dif: float
    speedup_vs_static: float | None
    """static's median step time (the slowest rank's step, LBB's iteration time) over ett-stream's."""
    speedup_met: bool | None
    """Whether static's wall period is >= 2.5x ett-stream's (the step time's ratio when no wall period is known)."""
    work_ratio: float | None
    """ett-stream's median step size over static's (what a step holds)."""
    straggler_effect_median: float | None
    straggler_effect_met: bool | None
    straggler_effect_of_medians: float | None
    per_cell: list[CellComparison]
    best_or_within_5_percent_met: bool | None
    wall_speedup_vs_static: float | None = None
    """static's median wall period over ett-stream's (the target's measure: what a user waits per step)."""
    control_wall_seconds: float | None = None
    """The homogeneous control's median wall period (static, every factor 1, smallest DIF): the oracle's base."""
    oracle_met: bool | None = None
    """ett-stream within its tolerance of the oracle in every cell."""
    plan_wait_max_seconds: float | None = None
    """The largest median plan wait of any measured cell."""
    plan_wait_met: bool | None = None
    """Median plan wait on the critical path <= 2 ms in every measured cell."""
    target_loss_met: bool | None = None
    """ett-stream reached the target loss no later than chronica in every cell with both."""
    backlog_held: bool | None = None
    """No cell's window saw a device run out of work."""


class BalanceResult(Result):
    """What `balance.json` holds."""

    setup: BalanceRunSetup
    target_loss: dict[str, float]
    """Per DIF (as `f"{dif:g}"`): the loss a policy must reach (see `target_loss_rule`)."""
    target_loss_rule: str
    seconds: float
    cells: list[CellResult]
    targets: BalanceTargets
    runs: list[CellResult] | None = None
    """With repeats: every run of every cell (without loss curves); `cells` are their medians."""

    def find(self, policy: str, slowdowns: tuple[float, ...], dif: float) -> CellResult | None:
        """The cell of `policy` at this fleet and DIF."""
        return next((c for c in self.cells if (c.policy, c.slowdowns, c.dif) == (policy, slowdowns, dif)), None)


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


class RealdataResult(Result):
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
