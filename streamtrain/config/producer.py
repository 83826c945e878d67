"""Producer settings (`[producer]` in the TOML file, STREAMTRAIN_PRODUCER__* in the environment)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..datasets.packaged import check_packaged_name
from .parsing import text_as_tuple
from .renames import Renamed, seconds_renamed

__all__ = [
    "RATE_PRESETS",
    "BurstConfig",
    "DatasetConfig",
    "InjectionConfig",
    "ProducerConfig",
    "RateChange",
    "RateConfig",
    "SizeConfig",
    "SyntheticConfig",
]

#: ScaDLES Table I: stream-rate sets as (distribution, mean, std) in samples/s.
RATE_PRESETS: dict[str, tuple[Literal["uniform", "normal"], float, float]] = {
    "S1": ("uniform", 38.0, 24.0),
    "S2": ("uniform", 300.0, 112.0),
    "S1'": ("normal", 64.0, 24.0),
    "S2'": ("normal", 256.0, 28.0),
}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class RateChange(_Model):
    """One step of a rate schedule: from `at_seconds` on, every device runs at `factor` x its base rate."""

    renamed_settings: ClassVar[dict[str, Renamed]] = seconds_renamed("at_s")

    at_seconds: float = Field(ge=0)
    """Seconds since the start of the run at which this factor takes effect."""

    factor: float = Field(ge=0)
    """Multiplier of each device's base rate (0 pauses the stream)."""


class BurstConfig(_Model):
    """Periodic bursts: every `every_seconds` seconds the rate is multiplied by `factor` for `duration_seconds`."""

    renamed_settings: ClassVar[dict[str, Renamed]] = seconds_renamed("every_s", "duration_s")

    every_seconds: float = Field(gt=0)
    """Period of the bursts in seconds."""

    duration_seconds: float = Field(gt=0)
    """Length of each burst in seconds (shorter than `every_seconds`)."""

    factor: float = Field(default=4.0, ge=0)
    """Rate multiplier during a burst."""

    stagger: bool = True
    """Shift each device's bursts by a share of the period so the devices do not all burst at once."""

    @model_validator(mode="after")
    def _burst_fits_period(self) -> BurstConfig:
        if self.duration_seconds >= self.every_seconds:
            raise ValueError(f"duration_seconds ({self.duration_seconds}) must be shorter than every_seconds "
                             f"({self.every_seconds})")
        return self


class RateConfig(_Model):
    """How many samples per second each device publishes, and how that changes over time."""

    renamed_settings: ClassVar[dict[str, Renamed]] = seconds_renamed("schedule_period_s", "trace_step_s", "catch_up_s")

    kind: Literal["constant", "uniform", "normal", "unlimited"] = "constant"
    """constant: every device at `mean`; uniform / normal: each device's base rate drawn once from
    that distribution with `mean` and `std`; unlimited: as fast as the broker takes them (benchmarks)."""

    preset: Literal["S1", "S2", "S1'", "S2'"] | None = None
    """A ScaDLES stream-rate set (Table I) that sets kind, mean and std: S1 uniform 38/24,
    S2 uniform 300/112, S1' normal 64/24, S2' normal 256/28 ("S1p"/"S2p" also accepted)."""

    mean: float = Field(default=100.0, gt=0, le=1_000_000)
    """Mean base rate in samples/s."""

    std: float = Field(default=0.0, ge=0)
    """Standard deviation of the per-device base rates in samples/s (uniform and normal)."""

    min_rate: float = Field(default=1.0, gt=0)
    """Floor of a sampled base rate in samples/s: uniform and normal draws can fall to or below 0."""

    rates: list[float] | None = None
    """Explicit per-device base rates in samples/s, one per device; overrides kind/mean/std."""

    schedule: list[RateChange] = Field(default_factory=list)
    """Step changes of every device's rate over time, as factors of its base rate, ordered by at_seconds."""

    schedule_period_seconds: float | None = Field(default=None, gt=0)
    """Repeat the schedule with this period in seconds (default: hold the last factor)."""

    bursts: BurstConfig | None = None
    """Periodic bursts on top of the base rate and the schedule."""

    trace: Path | None = None
    """A rate trace to replay: a text/CSV file with one factor per line (or `seconds,factor`), applied
    to each device's base rate and looped. Use kind=constant, mean=1 to replay absolute rates."""

    trace_step_seconds: float = Field(default=1.0, gt=0)
    """Seconds each line of a one-column trace lasts."""

    catch_up_seconds: float = Field(default=1.0, ge=0)
    """After a stall (full queue, paused process), a device may burst to catch up at most this many
    seconds of its stream; older deficit is given up, so the rate never spikes without bound."""

    @field_validator("preset", mode="before")
    @classmethod
    def _prime_aliases(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip().upper().replace("\u2019", "'").replace("\u2032", "'")
            value = text[:-1] + "'" if text.endswith("P") else text
        return value

    @field_validator("rates")
    @classmethod
    def _rates_positive(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and (not value or any(not r > 0 for r in value)):
            raise ValueError("every explicit rate must be > 0 samples/s")
        return value

    @field_validator("schedule")
    @classmethod
    def _schedule_ordered(cls, value: list[RateChange]) -> list[RateChange]:
        times = [c.at_seconds for c in value]
        if times != sorted(times) or len(set(times)) != len(times):
            raise ValueError("schedule entries must have strictly increasing at_seconds")
        return value

    @model_validator(mode="after")
    def _distribution_is_usable(self) -> RateConfig:
        if self.kind == "constant" and self.std > 0 and self.preset is None and self.rates is None:
            raise ValueError("std > 0 needs kind 'uniform' or 'normal' (kind 'constant' has no spread)")
        period = self.schedule_period_seconds
        if period is not None and self.schedule and self.schedule[-1].at_seconds >= period:
            raise ValueError("schedule_period_seconds must be longer than the last schedule entry's at_seconds")
        return self

    def resolved(self) -> tuple[str, float, float]:
        """(kind, mean, std) after applying the preset, if any."""
        if self.preset is not None:
            return RATE_PRESETS[self.preset]
        return self.kind, self.mean, self.std


class SizeConfig(_Model):
    """Distribution of sample sizes (frames, tokens: the sample's relative cost, = payload shape[0])."""

    kind: Literal["fixed", "normal", "lognormal", "replay"] = "fixed"
    """fixed: every sample has size `mean`; normal: mean and DIF, never below `min_size` (the
    distribution is truncated there and its parameters solved so the sizes still have the requested
    mean and DIF); lognormal: shifted lognormal with that mean and DIF (any DIF); replay: sizes drawn
    from the file or dataset at `path`."""

    mean: float = Field(default=45.0, gt=0, le=1_000_000)
    """Mean sample size."""

    dif: float = Field(default=0.0, ge=0)
    """Data imbalance factor: the standard deviation of sample sizes (CHRONICA)."""

    min_size: int = Field(default=1, ge=1)
    """Smallest size produced."""

    max_size: int = Field(default=1_000_000, ge=1)
    """Largest size produced (a guard against heavy lognormal tails filling memory)."""

    path: Path | None = None
    """For kind=replay: a text/.npy file of sizes, or a dataset (directory/.npz/.csv) whose sample sizes are used."""

    @model_validator(mode="after")
    def _consistent(self) -> SizeConfig:
        if self.max_size < self.min_size:
            raise ValueError(f"max_size ({self.max_size}) is below min_size ({self.min_size})")
        if self.kind == "replay" and self.path is None:
            raise ValueError("kind 'replay' needs path (a sizes file or a dataset)")
        if self.kind in ("normal", "lognormal", "fixed") and self.mean < self.min_size:
            raise ValueError(f"mean ({self.mean}) is below min_size ({self.min_size})")
        if self.kind == "fixed" and self.dif > 0:
            raise ValueError("dif > 0 needs kind 'normal' or 'lognormal' (kind 'fixed' has no spread)")
        return self


class SyntheticConfig(_Model):
    """The synthetic task: labels learnable from the payload (class prototype + noise per step)."""

    features: int = Field(default=16, ge=1, le=65_536)
    """Features per step of a sample: payloads are float32 arrays of shape (size, features)."""

    classes: int = Field(default=10, ge=2, le=100_000)
    """Number of classes."""

    labels_per_device: int | None = Field(default=None, ge=1)
    """Non-IID: each device sees only this many classes (device i gets classes i*k .. i*k+k-1 mod
    classes). Unset: IID, every device draws from every class."""

    signal: float = Field(default=0.5, gt=0)
    """Length of each class prototype relative to unit per-feature noise: higher is easier to learn."""

    task_seed: int = 0
    """Seed of the class prototypes; trainers and evaluators that share it share the task."""

    @model_validator(mode="after")
    def _k_fits(self) -> SyntheticConfig:
        if self.labels_per_device is not None and self.labels_per_device > self.classes:
            raise ValueError(f"labels_per_device ({self.labels_per_device}) exceeds classes ({self.classes})")
        return self


class DatasetConfig(_Model):
    """Replay a real dataset from disk instead of the synthetic task."""

    path: Path | None = None
    """A UEA/UCR `.ts` file (e.g. the archive's *_TRAIN.ts), one .npz/.csv file, or a directory of such files
    (class subdirectories label .npy files). A sample's size is its length (its first axis)."""

    packaged: str | None = None
    """Instead of `path`, a dataset an installed package ships, replayed from its training split: `plaid`
    (PLAID_TRAIN.ts from sktime's wheel, installed by the `plaid` extra), or the archive's regression problems
    from the same wheel, `tecator` and `covid3month`."""

    sharding: Literal["random", "stratified", "distribution-aware"] = "random"
    """How samples are assigned to devices: random; stratified (round-robin within each class);
    distribution-aware (PCA + k-means neighbourhoods, round-robin within each, neighbourhoods with
    fewer samples than devices broadcast to every device)."""

    neighbourhoods: int | None = Field(default=None, ge=1)
    """k of k-means for distribution-aware sharding (default twice the number of classes, as the paper recommends)."""

    pca_components: int = Field(default=8, ge=1)
    """Principal components kept before k-means."""

    loop: bool = True
    """Start a device's shard again when it is exhausted (else the device's stream ends)."""

    shuffle: bool = True
    """Shuffle each device's shard (once per pass) instead of replaying it in file order."""

    label_column: str = "label"
    """CSV column holding the label (it may be absent when `target_columns` are named)."""

    target_columns: tuple[str, ...] = ()
    """CSV columns holding each sample's float target (regression values, multi-label 0/1 tags), e.g.
    `--set producer.dataset.target_columns=fat,moisture`; constant within a sample. Empty: no target columns."""

    sample_column: str | None = "sample"
    """CSV column whose consecutive equal values group rows into one sample (size = rows); rows are
    samples of size 1 when the column is absent."""

    class_names: tuple[str, ...] | None = None
    """The class names in label order: a sample of class `class_names[i]` (its directory, its `.ts` class, its
    text label) is labelled i, in the replayed dataset and in the held-out set the trainers read alike, and a
    file holding a class not named here is skipped. Unset: names are numbered in the order a load meets them
    (class directories sorted, `.ts` files in their `@classLabel` order), which numbers a held-out set that
    lacks a class differently from the training data; `streamtrain up --dataset` sets it from both splits.
    Integer labels are used as they are either way."""

    window: int | None = Field(default=None, ge=2, le=1_000_000)
    """A single series (a CSV with no label, sample or target column, or one unlabelled array): the frames of each
    sample `streamtrain up --dataset` cuts it into, the last `trainer.horizon` of them the future it learns to
    forecast. Unset: `trainer.horizon` plus a sixth of the series (at least 2 frames, at most 256), so that a
    window's input covers two cycles of a season up to a twelfth of the series and the training part holds many
    windows (`streamtrain.datasets.windows`)."""

    stride: int = Field(default=1, ge=1, le=1_000_000)
    """A single series: frames from one window's start to the next (1: every window, overlapping)."""

    held_out_share: float = Field(default=0.25, gt=0, lt=1)
    """The share `streamtrain up --dataset` holds out of a dataset that comes without a held-out set (no packaged
    test split, no `<name>_TEST.<ext>` beside a `<name>_TRAIN.<ext>`, no `trainer.eval_path`) to evaluate on, never
    trained on. A single series: that share of its frames, at its end (at least one window's); windows are cut from
    the frames before it to train on and from it to evaluate on, and a window straddling the two is cut from
    neither. Any other dataset: that share of its samples, drawn at random from `producer.seed` (class by class
    when labelled; none from a dataset of fewer than 8 samples). To train on every sample, name a held-out set."""


    _packaged_is_known = field_validator("packaged")(check_packaged_name)
    _names_from_text = field_validator("class_names", mode="before")(text_as_tuple)
    _targets_from_text = field_validator("target_columns", mode="before")(text_as_tuple)

    @field_validator("class_names")
    @classmethod
    def _names_are_usable(cls, names: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if names is None:
            return None
        stripped = tuple(str(n).strip() for n in names)
        if not stripped or any(not n for n in stripped):
            raise ValueError("name at least one class, none of them empty")
        twice = sorted({n for n in stripped if stripped.count(n) > 1})
        if twice:
            raise ValueError(f"class names must differ: {', '.join(twice)} named more than once")
        return stripped

    @model_validator(mode="after")
    def _one_source(self) -> DatasetConfig:
        if self.path is not None and self.packaged is not None:
            raise ValueError("set path or packaged, not both")
        return self


class InjectionConfig(_Model):
    """ScaDLES data injection (alpha, beta).

    Each round a device shares a fraction beta of its samples with a fraction alpha of the other devices.
    """

    alpha: float = Field(default=0.0, ge=0, le=1)
    """Fraction of the other devices that receive a device's shared samples each round."""

    beta: float = Field(default=0.0, ge=0, le=1)
    """Fraction of a device's samples of the round that it shares."""

    round_samples: int = Field(default=64, ge=1)
    """Samples of a device's own stream per injection round (ScaDLES: one training step's batch)."""

    @property
    def enabled(self) -> bool:
        """Whether any sample is injected."""
        return self.alpha > 0 and self.beta > 0


class ProducerConfig(_Model):
    """How the producers publish device streams."""

    renamed_settings: ClassVar[dict[str, Renamed]] = seconds_renamed("duration_s", "tick_s", "flush_timeout_s",
                                                               "delivery_timeout_s")

    devices: int = Field(default=4, ge=1, le=100_000)
    """Number of device streams (topics <prefix>.device.<id>)."""

    device_ids: list[str] | None = None
    """Explicit device ids, one per device (default "0", "1", ...)."""

    duration_seconds: float | None = Field(default=None, ge=0)
    """Seconds to run; unset (or 0) runs until max_samples, Ctrl-C or SIGTERM, as a service does."""

    @field_validator("duration_seconds")
    @classmethod
    def _zero_means_forever(cls, value: float | None) -> float | None:
        return None if value == 0 else value

    max_samples: int | None = Field(default=None, ge=1)
    """Stop each device after this many samples of its own stream."""

    seed: int = 0
    """Seed of every random choice (rates, sizes, labels, sharding, injection): a run is reproducible."""

    rate: RateConfig = Field(default_factory=RateConfig)
    size: SizeConfig = Field(default_factory=SizeConfig)
    synthetic: SyntheticConfig = Field(default_factory=SyntheticConfig)
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    injection: InjectionConfig = Field(default_factory=InjectionConfig)

    create_topics: bool = True
    """Create missing device topics (with the [kafka] partitions, replication and retention)."""

    tick_seconds: float = Field(default=0.002, gt=0, le=1.0)
    """Period of the pacing loop in seconds (all devices are paced from one loop)."""

    flush_timeout_seconds: float = Field(default=300.0, gt=0)
    """Seconds to wait at exit for outstanding deliveries; what is still undelivered then counts as failed."""

    delivery_timeout_seconds: float = Field(default=300.0, gt=0)
    """Seconds librdkafka keeps retrying a record while the broker is away before reporting it failed."""

    metrics_port: int | None = Field(default=None, ge=0, le=65_535)
    """Port of the /metrics endpoint (0 picks one; default [metrics] port; unset with metrics=false)."""

    metrics: bool = True
    """Serve Prometheus /metrics while running."""

    client: dict[str, str] = Field(default_factory=dict)
    """Extra librdkafka producer settings (linger.ms, queue.buffering.max.kbytes, ...); idempotence and acks stay."""

    @field_validator("device_ids")
    @classmethod
    def _ids_unique(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("device ids must be unique")
        return value

    @field_validator("client")
    @classmethod
    def _keeps_guarantees(cls, value: dict[str, str]) -> dict[str, str]:
        for key in ("enable.idempotence", "acks"):
            if key in value:
                raise ValueError(f"{key} cannot be overridden: producers are always idempotent with acks=all")
        return value

    @model_validator(mode="after")
    def _ids_match_devices(self) -> ProducerConfig:
        if self.device_ids is not None and len(self.device_ids) != self.devices:
            raise ValueError(f"device_ids has {len(self.device_ids)} ids but devices is {self.devices}")
        if self.rate.rates is not None and len(self.rate.rates) != self.devices:
            raise ValueError(f"rate.rates has {len(self.rate.rates)} rates but devices is {self.devices}")
        return self

    def ids(self) -> list[str]:
        """The device ids in use."""
        return list(self.device_ids) if self.device_ids is not None else [str(i) for i in range(self.devices)]
