"""What `streamtrain up` reports, typed: `report.json` as a `StackReport`, built from its sections.

The report is flat on disk (`report["samples_trained"]`, `report["heldout_accuracy_final"]`): readers and
tests rely on those keys, so the sections below are mixed into one model rather than nested. Each section is
filled by one part of the stack:

- `RunSettings`: how the run was set up and how it ended (`stack.runner`, `streamtrain.stack.run_report`);
- `RunFigures`: what Kafka holds about it — every record's fate, step and loss figures (`streamtrain.report.figures`);
- `BalanceFigures` and `HeldoutFigures`: who kept up, SE where it means something, held-out accuracy
  (`streamtrain.report.run_balance`);
- `ObjectiveFigures`, nested under `objective`: test-then-train and held-out figures in the terms of the
  run's objective (`streamtrain.report.objective`);
- `ModelOutFigures`, nested under `model_out`: the model versions the run published, where its final model is,
  and with `--serve` what serve answered and how fresh (`stack.serving`).

A new section (say, an objective's own figures): a `Record` of its own, added to `StackReport` as an optional
field (`my_section: MySection | None = None`, nested under its name in `report.json`), filled in
`streamtrain.stack.run_report.assemble_report`. A run without it then writes `null`, and older reports still load.
"""

from __future__ import annotations

from pydantic import Field

from streamtrain.report.record import Record

__all__ = ["BalanceFigures", "BridgeFigures", "DeviceBalanceFigures", "DeviceFates", "HeldoutFigures", "HeldoutPoint",
           "MetricFigures", "ModelOutFigures", "ObjectiveFigures", "RunFigures", "RunSettings", "SourcePartitionFates",
           "StackReport", "StaticVsMeasured",
           "StreamSetting", "TimeModel"]


class StreamSetting(Record):
    """One device's synthetic stream, as `up` was told to run it."""

    device: str
    rate: float
    """Samples per second."""
    size_mean: float
    size_dif: float
    """Standard deviation of the sample sizes."""


class DeviceFates(Record):
    """One device topic's records, each in one bin by its offset (`streamtrain.accounting.RecordFates`)."""

    device: str
    records: int
    trained: int
    truncated: int
    dead_lettered: int
    pending: int
    lost: int
    unknown: int
    unaccounted: int
    retrained: int
    written_twice: int
    undecodable: int
    dead_letter_reasons: dict[str, int] = Field(default_factory=dict)


class RunSettings(Record):
    """How the run was set up, and how it ended."""

    policy: str | None = None
    truncation: str | None = None
    plan_ahead: int | None = None
    job: str | None = None
    topic_prefix: str | None = None
    bootstrap_servers: str | None = None
    started_at: str | None = None
    """ISO 8601, with the local time zone."""
    stopped_by: str | None = None
    """What stopped the run: a signal's name, `--duration N`, `--steps N`, `step N`, or a service that exited."""
    drained: bool | None = None
    """Whether the trainers worked off everything produced before they were stopped (None: no drain was tried)."""
    backlog_per_device: int | None = None
    plan_latency_ms_median: float | None = None
    """The coordinator's own figure (its status page), not read from Kafka."""
    plan_latency_step_fraction_median: float | None = None
    streams: list[StreamSetting] = Field(default_factory=list)
    """The synthetic streams of the stack's own producers (none for an external device)."""
    external_devices: list[str] = Field(default_factory=list)
    """Devices fed from outside (`--external-devices`); their records are accounted like every other's."""
    prometheus_url: str | None = None
    num_classes: int | None = None
    dataset_samples: int | None = None
    """The samples of the dataset `--dataset` replayed in a loop (None: no dataset)."""
    heldout_chance: float | None = None
    """Accuracy of always answering the held-out set's most common class (None without evaluations)."""
    failures: list[str] = Field(default_factory=list)
    plots: list[str] = Field(default_factory=list)
    """The run's plots, relative to the report's directory."""


class RunFigures(Record):
    """What Kafka holds about the run: every record's fate, and the steps' figures
    (`streamtrain.report.figures.build_report`)."""

    devices: int = 0
    steps: int = 0
    steps_idle: int = 0
    """Steps that trained nothing (a paused or drained stream); the step figures leave them out."""
    samples_produced: int = 0
    samples_trained: int = 0
    samples_truncated: int = 0
    samples_dead_lettered: int = 0
    samples_pending: int = 0
    """Not processed when the run stopped: still in Kafka, resumed from the committed offsets (not lost)."""
    samples_lost: int = 0
    samples_duplicated: int = 0
    samples_unaccounted: int = 0
    """Processed past with no record of being trained, truncated or dead-lettered (0 expected)."""
    records_written_twice: int = 0
    dead_letter_reasons: dict[str, int] = Field(default_factory=dict)
    straggler_effect_median: float | None = None
    step_seconds_median: float | None = None
    step_period_seconds_median: float | None = None
    step_period_split_median: dict[str, float | None] = Field(default_factory=dict)
    """Median seconds of each part of a step's wall period (compute, communication, plan_wait, ...)."""
    plan_wait_seconds_median: float | None = None
    plan_wait_step_fraction_median: float | None = None
    sample_delay_seconds_median: float | None = None
    """From a sample's append to the report of the step that processed it."""
    sample_delay_seconds_p99: float | None = None
    throughput_samples_per_s: float | None = None
    training_seconds: float = 0.0
    initial_loss: float | None = None
    final_loss: float | None = None
    rank_steps_on_local_plan: int = 0
    plans_published: int = 0
    unreadable_records: int = 0
    per_device: dict[str, DeviceFates] = Field(default_factory=dict)


class DeviceBalanceFigures(Record):
    """One device over the run: does it keep up, and how much room does it have
    (`streamtrain.report.run_balance.DeviceBalance`)."""

    arrival_rate: float | None
    lag_trend_per_s: float | None
    lag_max: int
    busy_ratio: float | None
    headroom: float | None
    keeps_up: bool | None


class TimeModel(Record):
    """A device's fitted compute time `a·size + b`, and its mean sample size."""

    a: float
    b: float
    mean_size: float


class StaticVsMeasured(Record):
    """The slowest device's compute per step: estimated under static per-device batches vs measured."""

    steps: int
    static_seconds_median: float
    measured_seconds_median: float
    speedup: float | None
    models: dict[str, TimeModel]
    over: str = ""
    """Which steps the medians are over."""


class BalanceFigures(Record):
    """What balance means in a streaming run (`streamtrain.report.run_balance.balance_figures`)."""

    steps_every_device_waiting: int = 0
    straggler_effect_waiting_median: float | None = None
    """SE over the steps where every device had work waiting: the only steps where it says something."""
    devices_keeping_up: int = 0
    balance_per_device: dict[str, DeviceBalanceFigures] = Field(default_factory=dict)
    static_vs_measured: StaticVsMeasured | None = None


class HeldoutPoint(Record):
    """One held-out evaluation."""

    step: int
    t: float
    """Seconds since the run's first record or step."""
    accuracy: float | None
    """Classification's accuracy (None for other objectives: their metrics are in the report's `objective`)."""
    loss: float
    seconds: float


class HeldoutFigures(Record):
    """Held-out accuracy over the run (all None, and `heldout` empty, when the trainers evaluated nothing)."""

    heldout_dataset: str | None = None
    heldout_samples: int | None = None
    heldout_evaluations: int | None = None
    heldout_accuracy_first: float | None = None
    heldout_accuracy_final: float | None = None
    heldout_accuracy_best: float | None = None
    heldout_loss_final: float | None = None
    heldout_seconds_median: float | None = None
    heldout_seconds_max: float | None = None
    heldout: list[HeldoutPoint] = Field(default_factory=list)


class MetricFigures(Record):
    """An objective's metrics of some samples, test-then-train: over the whole run and over the last steps."""

    running: dict[str, float] = Field(default_factory=dict)
    recent: dict[str, float] = Field(default_factory=dict)
    """Over the last `window_steps` steps that trained."""
    samples: int = 0
    """Samples scored over the run."""


class ObjectiveFigures(Record):
    """The run in its objective's terms: every trained sample scored by the model before the step that trained it
    (test-then-train), for the fleet and each device, and the held-out metrics (`streamtrain.report.objective`)."""

    name: str
    """`trainer.objective`'s objective (classification, regression, multilabel, forecast, or yours)."""
    headline: str
    """The metric its figures lead with (accuracy, rmse, f1_mean, mae, ...)."""
    baseline: str | None = None
    """Its baseline's counterpart (baseline_accuracy, baseline_rmse, ...)."""
    baseline_note: str = ""
    higher_is_better: bool = False
    window_steps: int = 0
    prequential: MetricFigures = Field(default_factory=MetricFigures)
    """The fleet's: the summed sums of every rank's steps."""
    prequential_per_device: dict[str, MetricFigures] = Field(default_factory=dict)
    heldout_first: dict[str, float] = Field(default_factory=dict)
    """The held-out metrics (and the baseline's) at the first evaluation; empty without evaluations."""
    heldout_final: dict[str, float] = Field(default_factory=dict)


class ModelOutFigures(Record):
    """The model out of the run (`stack.serving.model_out_figures`); the serving figures only with `--serve`."""

    model_dir: str | None = None
    """Where the run's final version was kept (None: it published none)."""
    versions_published: int = 0
    versions_served: int | None = None
    """Versions serve answered at least one request with."""
    requests_answered: int | None = None
    requests_errors: int | None = None
    """Requests answered with an error reason (bad input) instead of an output."""
    request_latency_seconds_median: float | None = None
    freshness_samples: int | None = None
    """Trained samples whose freshness was measured."""
    freshness_seconds_median: float | None = None
    """From a sample's produced_at to serve's first answer by a version that trained it (`streamtrain.versions.
    freshness`)."""
    freshness_seconds_p99: float | None = None
    freshness_published_seconds_median: float | None = None
    """Its training side: from produced_at to the announcement of the version that first trained the sample."""
    freshness_unserved_samples: int | None = None
    """Trained by versions after the last one serve answered with: not measured."""
    freshness_line_rate_samples: int | None = None
    """Of the measured samples, those produced while their device had no backlog (`stack.serving.BACKLOG_SECONDS`
    of its stream waiting untrained)..."""
    freshness_line_rate_seconds_median: float | None = None
    """...and their freshness: what a stream that keeps up gets."""
    freshness_line_rate_seconds_p99: float | None = None
    freshness_backlog_samples: int | None = None
    """Those produced while their device had a backlog (a burst): they wait their turn to be trained..."""
    freshness_backlog_seconds_median: float | None = None
    """...which dominates their freshness."""
    freshness_backlog_seconds_p99: float | None = None


class SourcePartitionFates(Record):
    """One source partition of the bridge: each record in one bin by its offset (`streamtrain.source_accounting`)."""

    topic: str
    partition: int
    records: int
    bridged: int
    rejected: int
    skipped: int
    pending: int
    lost: int
    unknown: int
    duplicated: int
    reasons: dict[str, int] = Field(default_factory=dict)
    """Dead letters by reason (skipped included)."""


class BridgeFigures(Record):
    """A run with the bridge (`up --bridge`): what became of every record of its source topics."""

    group: str
    sources: list[str]
    source_records: int
    source_bridged: int
    source_rejected: int
    source_skipped: int
    source_pending: int
    """Not bridged when the run stopped: still in the source topics, bridged from the group's committed offsets by
    the next start (not lost)."""
    source_lost: int
    source_unknown: int
    source_duplicated: int
    """Source records written more than once (to a device topic or as a dead letter); 0 is exactly once."""
    partitions: list[SourcePartitionFates] = Field(default_factory=list)

    @property
    def unaccounted(self) -> int:
        """Source records lost, claimed though never there, or written twice (0 expected)."""
        return self.source_lost + self.source_unknown + self.source_duplicated


class StackReport(HeldoutFigures, BalanceFigures, RunFigures, RunSettings):
    """`report.json`: the run's settings and every figure, flat (see the module docstring for a new section)."""

    objective: ObjectiveFigures | None = None
    model_out: ModelOutFigures | None = None
    bridge: BridgeFigures | None = None
    """The bridge's sources, accounted (None: the run had no bridge)."""
