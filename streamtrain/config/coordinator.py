"""Coordinator settings (`[coordinator]` in the TOML file, STREAMTRAIN_COORDINATOR__* in the environment)."""

from __future__ import annotations

from typing import ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..wire.topics import validate_name_part
from .renames import Renamed

__all__ = ["POLICY_NAMES", "CoordinatorConfig", "PolicyName", "TruncationName"]

PolicyName = Literal["static", "lbbsp", "lbb", "scadles", "chronica", "ett-stream"]
TruncationName = Literal["persist", "truncate", "bounded"]

#: Every planning policy the coordinator knows, in the order benchmarks list them.
POLICY_NAMES: tuple[str, ...] = ("static", "lbbsp", "lbb", "scadles", "chronica", "ett-stream")


class CoordinatorConfig(BaseModel):
    """How the coordinator models devices, plans each step and truncates backlog."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
    # Said what it waits for: trainer.plan_wait_seconds is the rank's wait for a plan.
    renamed_settings: ClassVar[dict[str, Renamed]] = {"plan_wait_seconds": Renamed("feedback_wait_seconds")}

    policy: PolicyName = "ett-stream"
    """Planning policy: static, lbbsp, lbb, scadles, chronica or ett-stream (equal ETT at line rate)."""

    global_batch: int = Field(default=256, ge=1)
    """Samples per step for fixed-global-batch policies (static, lbbsp, lbb, chronica); the base batch
    B of the linear learning-rate scaling rule for every policy."""

    b_min: int = Field(default=1, ge=0)
    """Fewest samples a device is given per step while it has that many pending (ScaDLES b_min)."""

    b_max: int = Field(default=4096, ge=1)
    """Most samples a device is given per step (ScaDLES b_max)."""

    weight_by: Literal["samples", "size"] = "samples"
    """What an ett-stream rank's aggregation weight counts: samples trained, or their total size
    (CHRONICA Eq. 7). chronica always weighs by size, lbbsp/lbb by samples, scadles by stream rate."""

    memory_headroom: float = Field(default=0.95, gt=0.0, le=1.0)
    """Fraction of a device's memory-derived size limit a plan may fill (LB-BSP's 95% guard)."""

    target_step_seconds: float | None = Field(default=None, gt=0.0)
    """ett-stream: a fixed step-time target; unset lets it choose the shortest step that trains at line rate."""

    min_step_seconds: float = Field(default=0.01, gt=0.0)
    """ett-stream: shortest step-time target it will choose."""

    max_step_seconds: float = Field(default=60.0, gt=0.0)
    """ett-stream: longest step-time target it will choose."""

    line_rate_headroom: float = Field(default=0.1, ge=0.0, le=1.0)
    """ett-stream: spare capacity kept above a device's arrival rate so its backlog drains (0.1 = 10%)."""

    max_overhead_fraction: float = Field(default=0.2, gt=0.0, le=1.0)
    """ett-stream, while streams are keeping up: a step is at least long enough that each device's fixed
    per-step cost b is at most this fraction of it (short steps waste time on overhead). With only
    backlog (no stream a device keeps up with), T is instead the time the fleet needs for global_batch."""

    sit_out_every: int = Field(default=8, ge=0)
    """ett-stream: a measured device whose step of even b_min samples would take more than (1 + `sit_out_slack`)
    times the step-time target the rest of the fleet sets (its fixed per-step cost alone exceeds it) trains no
    samples, except one step in this many (staggered by device): it neither sets every step's period nor starves.
    The other devices share the global batch meanwhile. 0 or 1: every device trains b_min each step."""

    sit_out_slack: float = Field(default=0.1, ge=0.0)
    """ett-stream: how far past the rest of the fleet's step-time target a device's b_min step may run before it
    sits out (`sit_out_every`)."""

    best_fit_rounds: int = Field(default=4, ge=0, le=64)
    """ett-stream: samples added by best fit after the oldest-first prefix, to close the gap to the target."""

    best_fit_lookahead: int | None = Field(default=1024, ge=1)
    """ett-stream: how many of a device's pending samples just past its oldest-first prefix best fit chooses
    from (None: its whole backlog). Keeps planning time independent of the backlog's length, and what best fit
    picks close to the front of the stream."""

    max_batch_growth: float | None = Field(default=2.0, ge=1.0)
    """ett-stream: a measured device's batch is at most this many times the largest batch (total size) among the
    observations its time model was fitted on (None: no bound). The model is a line through the sizes seen; far
    beyond them a fit that is flat there (fixed costs dominate) promises a huge batch in the same time. A batch
    growing into new sizes at most doubles per step by default."""

    warm_start_a: float = Field(default=1e-3, gt=0.0)
    """Seconds per unit of sample size assumed for a device before it has reported enough feedback."""

    warm_start_b: float = Field(default=0.05, ge=0.0)
    """Fixed seconds per step assumed for a device before it has reported enough feedback."""

    use_profiles: bool = True
    """Plan step 0 from the trainers' start-up profiles (`trainer.startup_profile`, LBB's profiling phase): a device
    that sent one starts from its profile's line T = a·size + b and mean sample size instead of the warm start, so
    step 0 is balanced like the steps after it. A device without a profile keeps the warm start. Off: profiles are
    ignored and step 0 is planned from the warm start, as the steps' feedback takes over from step 1 either way."""

    profile_wait_seconds: float = Field(default=3.0, gt=0.0, le=60.0)
    """`use_profiles`: after the first device's profile arrives, the longest wait (3 s by default) for the others'
    before step 0 is planned (again) with the profiles there are; it is planned at once when every device's is in.
    Ranks wait at most this plus `trainer.plan_wait_seconds` for that plan, and at most this for a first sample to
    profile with."""

    warm_fixed_fraction: float = Field(default=0.25, ge=0.0, lt=1.0)
    """Before a device's model is fitted, the least share of its measured compute time taken as fixed cost. One
    batch size cannot tell fixed from per-size cost; a scaled warm start whose fixed part is small predicts a
    smaller batch almost proportionally cheaper, which every step's fixed costs (launch, optimizer, the collate)
    make too optimistic. 0 keeps the warm start's own split."""

    min_observations: int = Field(default=3, ge=2)
    """Feedback records needed before a device's model is fitted rather than scaled from the warm start."""

    model_window: int = Field(default=64, ge=4, le=4096)
    """Feedback records kept per device for the fit."""

    recency_halflife_steps: float = Field(default=20.0, gt=0.0)
    """Age in steps at which a feedback record weighs half as much in the fit."""

    huber_delta: float = Field(default=1.345, gt=0.0)
    """Huber threshold in robust standard deviations: larger residuals are down-weighted as outliers."""

    change_points: int = Field(default=2, ge=1, le=16)
    """Consecutive same-sign large residuals that mean the device changed (not an outlier): older
    feedback is then dropped and the model rescaled at once."""

    change_threshold: float = Field(default=0.05, gt=0.0)
    """Relative residual above which a record counts towards a change (0.05 = 5% off the model); raised
    to three robust standard deviations of the device's own relative residuals when it is noisier."""

    error_ewma_alpha: float = Field(default=0.1, gt=0.0, le=1.0)
    """Smoothing of the exported relative prediction error (weight of the newest step)."""

    lbb_rapid_threshold: float = Field(default=0.3, gt=0.0)
    """lbb: straggler effect above which batch sizes are re-solved from a fresh linear model."""

    lbb_fine_threshold: float = Field(default=0.05, ge=0.0)
    """lbb: straggler effect below which batch sizes are left alone; between the two, fine-tune."""

    lbb_fine_step: int = Field(default=1, ge=1)
    """lbb: samples moved from the straggler to the leader per fine-tuning step (LBB: usually 1)."""

    lbb_observation_window: int = Field(default=5, ge=0)
    """lbb: steps after a rapid re-solve during which only fine-tuning is allowed (stops oscillation)."""

    scadles_window_seconds: float = Field(default=1.0, gt=0.0)
    """scadles: a device's batch is its arrivals over this many seconds (b_i = S_i), within [b_min, b_max]."""

    truncation: TruncationName = "persist"
    """What happens to backlog: persist (keep all), truncate (keep about one step's worth of the newest
    samples, ScaDLES) or bounded (keep at most max_lag_*; drop oldest first)."""

    truncate_keep_steps: float = Field(default=1.0, gt=0.0)
    """truncate: steps' worth of arrivals kept."""

    max_lag_samples: int | None = Field(default=None, ge=0)
    """bounded: most pending samples kept per device."""

    max_lag_seconds: float | None = Field(default=None, ge=0.0)
    """bounded: oldest pending sample age kept, in seconds."""

    max_lag_size: int | None = Field(default=None, ge=0)
    """bounded: most pending total size kept per device, in sample size units (bytes when sizes are bytes)."""

    delete_records: bool = False
    """Also delete truncated records on the broker (DeleteRecords) so retained storage stays bounded."""

    delete_trained: bool = False
    """With delete_records: delete every record the trainers committed past (trained ones too), so a
    device topic retains about its lag, even when its trainer keeps up and nothing is truncated.
    Off by default: trained records are then left to the topic's own retention (replay, audits)."""

    seed: int = 0
    """Seed for the few random choices a policy makes (ties), so a plan is reproducible."""

    devices: tuple[str, ...] = ()
    """Devices the service plans for, in rank order; empty plans for every device that has sent feedback
    (ordered by rank) and waits for exactly those before planning the next step."""

    plan_ahead: int = Field(default=1, ge=0, le=1)
    """Steps ahead a plan is made (true/false mean 1/0). 1: the plan for step s+1 is made while step s runs,
    as soon as step s-1's feedback is in, from the state that feedback and plan s predict (plan s's samples
    taken, models through s-1), so ranks find it there when step s ends and the correction for step s's
    results goes into plan s+2. 0: plan s+1 waits for step s's feedback, and every step boundary waits for
    that round trip through Kafka."""

    feedback_wait_seconds: float = Field(default=1.0, gt=0.0, le=600.0)
    """Service: longest wait, after the first feedback of a step, for the other devices' feedback; the
    plan for the next step is then published with what has arrived (trainers never block on it)."""

    absent_after_seconds: float = Field(default=30.0, ge=0.0)
    """Service: a device with no feedback for this long, while plans went on without it (its trainer node left
    the group), is absent: plans and the wait for a step's feedback leave it out until it reports again; its
    stream waits in Kafka, its lag still exported. 0: never leave a device out."""

    poll_interval_seconds: float = Field(default=1.0, gt=0.0, le=60.0)
    """Service: how often watermarks, committed offsets (lag) and arrival rates are polled."""

    rate_halflife_seconds: float = Field(default=5.0, gt=0.0)
    """Service: age at which a watermark-growth observation weighs half in the arrival-rate EWMA."""

    recovery_records: int = Field(default=10_000, ge=0)
    """Service: feedback and assignment records re-read per partition on start to rebuild state."""

    max_feedback_seconds: float = Field(default=3600.0, gt=0.0)
    """Service: the longest timing a feedback record may report (compute, wait, communication, whole step).
    Longer is not a streaming step but a forged or broken record: it is dead-lettered (feedback-impossible)
    instead of stretching the step period the truncation policy keeps."""

    feedback_window_steps: int = Field(default=1000, ge=1)
    """Service: feedback for a step more than this many steps ahead of the one the coordinator plans next is
    dead-lettered (feedback-step-window): the ranks run the steps the coordinator plans, one at a time."""

    kafka_timeout_seconds: float = Field(default=10.0, gt=0.0)
    """Service: timeout of each admin request (offsets, lag, DeleteRecords) and of start-up reads."""

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.b_min > self.b_max:
            raise ValueError(f"b_min ({self.b_min}) must not exceed b_max ({self.b_max})")
        if self.min_step_seconds > self.max_step_seconds:
            raise ValueError(
                f"min_step_seconds ({self.min_step_seconds}) must not exceed max_step_seconds "
                f"({self.max_step_seconds})"
            )
        if self.lbb_fine_threshold >= self.lbb_rapid_threshold:
            raise ValueError(
                f"lbb_fine_threshold ({self.lbb_fine_threshold}) must be below lbb_rapid_threshold "
                f"({self.lbb_rapid_threshold})"
            )
        if len(set(self.devices)) != len(self.devices):
            raise ValueError(f"devices {list(self.devices)} name a device more than once")
        for device in self.devices:
            validate_name_part("device id", device)
        if self.truncation == "bounded" and (
            self.max_lag_samples is None and self.max_lag_seconds is None and self.max_lag_size is None
        ):
            raise ValueError("truncation 'bounded' needs max_lag_samples, max_lag_seconds or max_lag_size")
        return self
