"""Trainer settings (`[trainer]` in the TOML file, STREAMTRAIN_TRAINER__* in the environment)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ..datasets.packaged import check_packaged_name
from ..wire.records import DTYPES
from .parsing import numbers_as_tuple, split_list, text_as_tuple
from .renames import Renamed, seconds_renamed

__all__ = ["BUILTIN_MODELS", "BUILTIN_OBJECTIVES", "DOTTED_PATH", "TrainerConfig"]

#: `package.module:attribute`, the form of `model` and `collate`.
DOTTED_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")

#: The models `model` can name instead of a dotted path (built by `streamtrain.models.build_model`).
BUILTIN_MODELS: tuple[str, ...] = ("conv", "seq", "seqflat", "mlp")

#: The objectives `objective` can name instead of a dotted path.
BUILTIN_OBJECTIVES: tuple[str, ...] = ("classification", "regression", "multilabel", "forecast")


class TrainerConfig(BaseModel):
    """How each trainer rank builds its model, trains a batch and aggregates gradients."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
    renamed_settings: ClassVar[dict[str, Renamed]] = seconds_renamed("plan_wait_s", "data_wait_s", "idle_wait_s",
                                                                      "hold_max_s")

    num_features: int = Field(default=16, ge=1, le=65536)
    """Features per frame: every sample's payload has shape (size, num_features)."""

    num_classes: int = Field(default=10, ge=2, le=1_000_000)
    """Classes of the label (`classification`); the model emits this many logits per sample."""

    hidden_size: int = Field(default=64, ge=1, le=65536)
    """Channels of the built-in models."""

    num_layers: int = Field(default=2, ge=1, le=64)
    """Masked conv blocks of the built-in models (`seq`: block i has dilation 2^i)."""

    kernel_size: int = Field(default=5, ge=1, le=63)
    """Temporal kernel width of the built-in models (odd, so 'same' padding is symmetric)."""

    length_buckets: int = Field(default=8, ge=0, le=1024)
    """`seq`: lengths per power of two its packed time axis is padded to (at most 1/length_buckets more
    frames), so that batches of ever new sizes reuse a few shapes; on a CPU, oneDNN builds its convolution
    kernels anew for every new shape. A power of two; 0 pads nothing."""

    model: str = "conv"
    """The model every rank trains: `conv` (the packed temporal conv net the synthetic task is made for),
    `seq` (a dilated masked conv net for real series: per-series normalisation, mean and max pooling; e.g.
    PLAID), `seqflat` (`seq` beside an MLP over the whole series, position by position, resampled to
    `series_points`: series of one length, e.g. spectra), `mlp` (a small MLP with a linear path, for tabular data:
    one-frame samples), or the dotted path `module:attr` of a factory `(TrainerConfig) -> torch.nn.Module` of your
    own. Whatever it is must take what `collate` returns, an empty batch included, and give outputs of shape
    (batch.num_samples, the objective's width: num_classes logits for classification): each rank checks that on
    a probe batch at start-up. `streamtrain up --dataset` chooses by the data's shape when it is left unset: `mlp`
    for one-frame samples, `seqflat` for series of one length, `seq` for series of varying length (and says why)."""

    series_points: int = Field(default=64, ge=1, le=4096)
    """`seqflat`: points per channel its whole-series path resamples every series to (unchanged at this length,
    interpolated when shorter, averaged in equal bins when longer). `streamtrain up --dataset` sets it to the
    dataset's series length (at most 256) when it chooses `seqflat`."""

    dropout: float | None = Field(default=None, ge=0, lt=1)
    """Dropout of the built-in MLPs in training (`mlp`, and `seqflat`'s whole-series path): the share of their
    inputs and hidden units zeroed at each step. A small dataset is replayed many times over within a run, and
    without it they fit its noise. Unset: the model's own, 0.2 for `mlp`, 0.5 for `seqflat` (hundreds of inputs
    per series)."""

    ema_decay: float = Field(default=0.0, ge=0, lt=1)
    """Held-out evaluations and published model versions use an exponential moving average of the weights
    (updated after every optimizer step, this decay per step, warming up as `min(decay, (1 + n) / (10 + n))` after
    n steps), not the last step's weights: the last step of small, noisy batches lands anywhere in the optimum's
    neighbourhood, the average near its middle. Training itself runs on the live weights. 0: off (the last
    step's weights). `streamtrain up --dataset` sets 0.95 for a built-in model when it is unset."""

    objective: str = "classification"
    """What the model learns and how it is judged: `classification` (an integer label per sample; cross-entropy),
    `regression` (a float target per sample), `multilabel` (k tags per sample), `forecast` (no labels: the next
    values of each series), or the dotted path `module:attr` of an objective of your own (see the objectives
    guide). The objective sets the model's output width, the loss, the metrics (held-out and test-then-train) and
    which samples are dead-lettered for want of the target it needs."""

    target_width: int = Field(default=1, ge=1, le=65536)
    """`regression`: floats in every sample's target (1 for a scalar); the model emits this many values. A sample
    whose target has another width is dead-lettered as `target-width`."""

    regression_loss: Literal["mse", "huber"] = "mse"
    """`regression`: the training loss, mean squared error or Huber (quadratic within `huber_delta` of the target,
    linear beyond it: an outlying target pulls less). Either way the metrics are MAE and RMSE."""

    huber_delta: float = Field(default=1.0, gt=0, le=1e6)
    """`regression` with the Huber loss: the error (in units of `target_scale`) where it turns from quadratic to
    linear."""

    target_shift: float | tuple[float, ...] = 0.0
    """`regression` (and an objective of your own that reads it): the model learns (target - target_shift) /
    target_scale, so that targets of any level and scale reach it near 0 and 1; predictions and metrics are in the
    target's own units. One number for every value of the target, or one per value (`[0, 10, 0.5]`, as many as
    `target_width`). `streamtrain up --dataset` sets both, per value, from the training targets (their mean and
    standard deviation) when they are left unset."""

    target_scale: float | tuple[float, ...] = 1.0
    """`regression`: see `target_shift` (every scale above 0)."""

    target_names: tuple[str, ...] = ()
    """Names of the target's values in metric names: `rmse_<name>`, `mae_<name>` (regression, one per value),
    `f1_<name>` (multilabel, one per tag). Empty: their index (`rmse_0`, `f1_2`). `streamtrain up --dataset` sets
    them from `producer.dataset.target_columns`."""

    input_standardise: bool = True
    """Standardise every input feature before the model, (x - input_shift) / input_scale, as targets are: a
    column of day numbers near 736,000 and one of fractions then reach the model on one scale (the default packing,
    `streamtrain export` and `predict` alike). `input_shift` / `input_scale` set: those; unset: estimated by the
    trainers from the first `input_warmup_samples` samples the group trains, then frozen (devices fed from
    outside); `streamtrain up --dataset` sets them from the training data. Off: raw inputs. A forecast is never
    standardised here (it normalises each series itself), nor a batch of your own collate's."""

    input_shift: tuple[float, ...] = ()
    """Per feature (one number per `num_features`), what `input_standardise` subtracts; with `input_scale`."""

    input_scale: tuple[float, ...] = ()
    """Per feature, what `input_standardise` divides by (every value above 0; a constant column's is 1)."""

    input_warmup_samples: int = Field(default=512, ge=1, le=100_000_000)
    """Samples (over all ranks) the trainers' online estimate of `input_shift` / `input_scale` is made from when
    those are unset; it is updated after every step until then, and frozen after (every version carries it)."""

    num_tags: int = Field(default=2, ge=1, le=65536)
    """`multilabel`: tags k; every sample's target is k floats, 1 for a tag it has and 0 for one it has not."""

    tag_threshold: float = Field(default=0.5, gt=0, lt=1)
    """`multilabel`: a tag is predicted when its probability is at least this (precision, recall and F1 count
    these predictions)."""

    horizon: int = Field(default=1, ge=1, le=65536)
    """`forecast`: values to predict after each series. The last `horizon` frames of every sample are its future,
    the frames before them its input; a sample of `horizon` frames or fewer is dead-lettered as `series-too-short`.
    A sample's size stays its whole length (the coordinator plans with it); the model reads size - horizon frames."""

    prequential_window: int = Field(default=50, ge=1, le=1_000_000)
    """Steps the windowed test-then-train metrics cover (each sample scored by the model before the step that
    trains it); the running ones cover the whole run."""

    collate: str | None = None
    """Dotted path `module:attr` of `(Sequence[Sample], TrainerConfig) -> batch` replacing the default
    packing; the batch needs `num_samples`, `total_size`, `to(device)` and what the objective reads (`labels` for
    classification, `targets` for regression and multilabel)."""

    precision: Literal["float32", "float64"] = "float32"
    """Dtype of parameters and inputs (float64 for exactness checks)."""

    accepted_dtypes: tuple[str, ...] = DTYPES
    """Payload dtypes a rank trains on (default: every dtype the wire allows). A sample of another dtype goes to
    the dead-letter topic as `dtype-not-accepted`; one whose values do not fit `precision` once converted (a
    float64 of 1e300 is infinite in float32) as `dtype-overflow`. E.g. `--set trainer.accepted_dtypes=[float32]`."""

    max_input_abs: float = Field(default=100.0, ge=0)
    """Largest magnitude the default collate feeds the model: a sample whose largest |value| (after conversion
    to `precision`) is above it is scaled down as a whole to reach it, its shape and signs kept, so samples of
    any dtype and scale (uint8 0..255, int64 up to 2^62, float16 at its maximum) keep activations bounded.
    Well-scaled data passes unchanged; 0 turns the scaling off."""

    max_grad_norm: float = Field(default=10.0, ge=0)
    """Clip the aggregated gradient (the same on every rank) to this L2 norm before the optimizer step; 0: no
    clipping. Either way a step whose gradient norm or loss is not finite is skipped on every rank and its
    samples are dead-lettered as `non-finite-loss`."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where a rank trains: auto picks cuda:LOCAL_RANK when CUDA is present, else the CPU."""

    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend: auto picks NCCL for CUDA and gloo for the CPU."""

    torch_threads: int = Field(default=0, ge=0, le=1024)
    """Intra-op CPU threads per rank (0 keeps torch's default; set 1-2 when many ranks share a host)."""

    keep_freed_memory: bool = True
    """On the CPU, have glibc keep the memory a step frees (blocks up to 32 MiB) for the next step instead of
    unmapping it and page-faulting it in again: faster, steadier steps (a truer time model for the coordinator),
    with RSS held at the largest step's. Off: glibc's defaults."""

    memory_reserve_mb: int = Field(default=256, ge=0, le=1 << 20)
    """On the CPU, MiB of memory each rank maps in at start and frees for its steps to reuse, so a step
    larger than any before it does not page-fault new memory in (0: none). Held for the rank's life."""

    cpu_allocator: Literal["auto", "jemalloc", "system"] = "auto"
    """Memory allocator of the CPU ranks streamtrain starts itself (`train --local-ranks`, `up`): `jemalloc`
    (Debian's libjemalloc2, preloaded, freed memory kept for reuse) keeps a rank's heap from fragmenting, so
    steps stop page-faulting once the reserve is in; `system` is glibc (tuned by keep_freed_memory); `auto`
    is jemalloc when it is installed. Ranks started by torchrun or a container use what their environment
    preloads (LD_PRELOAD)."""

    optimizer: Literal["sgd", "adamw"] = "sgd"
    """Optimizer of every rank."""

    lr: float = Field(default=0.05, gt=0, le=100)
    """Learning rate at the base batch (the rate actually used when lr_scaling is off)."""

    momentum: float = Field(default=0.9, ge=0, lt=1)
    """SGD momentum (ignored by adamw)."""

    weight_decay: float = Field(default=0.0, ge=0, le=1)
    """Weight decay of the optimizer."""

    aggregation: Literal["weighted", "mean"] = "weighted"
    """How gradients combine: weighted gives rank i the share lambda_i / sum(lambda) (CHRONICA Eq. 7,
    ScaDLES Eq. 4); mean is the plain average of conventional DDP (biased for uneven batches)."""

    weight_by: Literal["samples", "size"] = "samples"
    """What lambda counts: samples trained (exact against SGD on the union when the loss is a per-rank
    mean) or their total size (CHRONICA's data-amount weighting)."""

    lr_scaling: bool = True
    """Scale the learning rate linearly with the global batch: lr * global_batch / base_batch."""

    base_batch: int = Field(default=64, ge=1)
    """Global batch (samples over all ranks) at which the learning rate is exactly `lr`."""

    max_lr_scale: float = Field(default=16.0, gt=0)
    """Upper bound of the linear learning-rate scale, so one huge global batch cannot blow up a step."""

    compression: bool = False
    """Adaptive Top-k compression of each gradient bucket (ScaDLES section IV)."""

    topk_ratio: float = Field(default=0.1, gt=0, le=1)
    """Fraction of a bucket's entries Top-k keeps."""

    compression_delta: float = Field(default=0.3, ge=0)
    """Threshold delta on the relative energy loss |‖g‖² - ‖Topk(g)‖²| / ‖g‖²: a bucket is sent sparse
    only when every rank's loss is within it, dense otherwise."""

    collective_timeout_seconds: float = Field(default=300.0, gt=0, le=86_400)
    """Longest a rank waits in a collective (and in joining its group) before it fails. A peer silent for longer
    (a host cut off, a rank hung) fails the step on every rank, and torchrun's elastic agent restarts the group:
    across nodes, this is how long a node may be away before the others go on without it. A shorter absence
    only pauses the group."""

    bucket_cap_mb: float = Field(default=25.0, gt=0, le=4096)
    """DDP gradient bucket size in MiB (each bucket is one hook call and one collective)."""

    seed: int = Field(default=0, ge=0)
    """Seed of the model's initial parameters (rank 0's are broadcast to the others)."""

    group_id: str | None = Field(default=None, min_length=1, max_length=200)
    """Kafka consumer group every rank commits its device offsets under (default `<job>.trainers`), so the
    coordinator reads each device's lag as high watermark - committed offset."""

    buffer_max_samples: int = Field(default=4096, ge=1)
    """Samples a rank buffers before it pauses fetching its device topic."""

    buffer_max_bytes: int = Field(default=256 * 1024 * 1024, ge=1024)
    """Record bytes a rank buffers before it pauses fetching; a single record larger than this is
    dead-lettered as oversize."""

    buffer_resume_ratio: float = Field(default=0.8, gt=0, lt=1)
    """Fetching resumes once the buffer is below this fraction of both bounds (hysteresis)."""

    plan_wait_seconds: float = Field(default=2.0, ge=0, le=600)
    """Seconds a rank waits for the coordinator's Assignment of a step before it falls back to a local plan."""

    startup_profile: bool = True
    """Before its first step, a rank times forward and backward of its own model on batches of 1/4, 1 and 2 times its
    equal share of `coordinator.global_batch`, made of its first buffered samples (LBB's profiling phase), the way
    its steps' compute is measured (an emulated slow-down, `slowdowns`, included), and sends the fitted line
    T = a·size + b to the coordinator, which plans step 0 from it (`coordinator.use_profiles`). It costs twelve such
    passes (a warm-up and three timed per batch): 0.2 to 0.8 s on the benchmarks' CPU models (it is logged), plus a wait
    of at most `coordinator.profile_wait_seconds` + `plan_wait_seconds` for the step-0 plan made from it. Skipped
    when the rank resumes from a checkpoint, or has no sample within `coordinator.profile_wait_seconds`. The profile
    runs `collate` and the model on samples it does not train (they are trained later as planned): turn it off for
    a plug-in whose collate records what it packs as trained."""

    plan_window_steps: int = Field(default=1000, ge=1)
    """How many steps ahead of its own a rank accepts a plan. The coordinator plans one step ahead; a group
    restarted from a checkpoint runs behind the plans already published by the steps since that checkpoint
    (keep this above `checkpoint_every`). A plan further ahead is rejected (dead-lettered as plan-step-window):
    kept, it would make every step until then fall back to a local plan and could push the real plans out."""

    data_wait_seconds: float = Field(default=1.0, ge=0, le=600)
    """Seconds a rank waits for planned offsets (or, on a local plan, for any sample) to arrive from Kafka."""

    idle_wait_seconds: float = Field(default=0.25, ge=0, le=60)
    """After a step in which the whole group trained nothing, seconds a rank waits for a sample to arrive
    before its next step, so an idle group (streams paused or not started) does not spin through empty
    steps, plans, feedback and checkpoints as fast as the broker answers."""

    hold_max_seconds: float = Field(default=1.0, ge=0, le=600)
    """Longest a rank holds a step's report when the plan drained every rank's buffer (line rate): the
    report waits until the plan's step-time target has passed, so the next plan batches what arrived
    meanwhile instead of a few samples buried in fixed costs (`streamtrain.pacing`). It costs freshness,
    at most this much; 0 reports every step at once."""

    local_batch: int = Field(default=32, ge=1)
    """Samples of a local plan before any Assignment or time model exists."""

    max_steps: int = Field(default=0, ge=0)
    """Stop after this global step (0: run until SIGTERM)."""

    checkpoint_dir: Path | None = None
    """Directory of rank 0's atomic checkpoints (model, optimizer, step, per-device offsets); none: no checkpoints."""

    checkpoint_every: int = Field(default=10, ge=1)
    """Steps between checkpoints (a final one is always written on SIGTERM or max_steps)."""

    commit_after_checkpoint: bool = True
    """With checkpoints on, commit device offsets only once a checkpoint holds the steps that trained them
    (a crash then retrains nothing committed: at-least-once without repeats of committed work); off commits
    after every step."""

    log_every: int = Field(default=10, ge=1)
    """Steps between a rank's one-line progress log."""

    slowdowns: tuple[float, ...] = ()
    """Emulated heterogeneity for benchmarks: one factor >= 1 per rank; after each step rank r sleeps until its
    compute has taken factor x its measured compute (see `slowdown_clock`), so its compute and step times (and the
    group's waits) are those of a device that many times slower. E.g. `--set trainer.slowdowns=[1,1,1,4]` or
    `=1,1,1,4`; empty: every rank at full speed."""

    slowdown_clock: Literal["auto", "cpu", "wall"] = "auto"
    """What `slowdowns` multiply. `cpu`: the rank's own CPU time in the step (its training thread), which other
    processes on a shared machine barely change, so a slowed rank's time is reproducible however busy the cores
    are; `wall`: elapsed time (CPU time does not see GPU kernels); `auto`: `wall` on CUDA, `cpu` otherwise."""

    metrics: bool = True
    """Serve Prometheus /metrics per rank on metrics.port + rank (a free port when metrics.port is 0)."""

    eval_path: Path | None = None
    """Held-out set evaluated while training: a file or directory dataset replay reads (.ts, .npz, .npy,
    .csv), e.g. the archive's *_TEST.ts beside the *_TRAIN.ts the producers replay. Labels must number the
    classes as the training data does. Unset (and no eval_packaged): no evaluation."""

    eval_packaged: str | None = None
    """Instead of eval_path, the test split of a packaged dataset: `plaid` (PLAID_TEST.ts), `tecator`,
    `covid3month`."""

    eval_every: int = Field(default=20, ge=1)
    """Steps between held-out evaluations (and one after the last step). Each rank evaluates its own slice
    of the held-out set with the step's weights; one all-reduce combines them."""

    eval_max_samples: int | None = Field(default=None, ge=1)
    """Evaluate on at most this many held-out samples (a fixed, class-stratified subset), to bound the time
    an evaluation takes from training."""

    eval_batch_size: int = Field(default=16384, ge=1)
    """Total size (frames) per forward pass of an evaluation: bounds its memory, not its result."""

    @field_validator("kernel_size")
    @classmethod
    def _kernel_is_odd(cls, value: int) -> int:
        if value % 2 == 0:
            raise ValueError(f"kernel_size must be odd for symmetric 'same' padding, got {value}")
        return value

    @field_validator("length_buckets")
    @classmethod
    def _buckets_are_a_power_of_two(cls, value: int) -> int:
        if value & (value - 1):
            raise ValueError(f"length_buckets must be 0 or a power of two (1, 2, 4, 8, ...), got {value}")
        return value

    @field_validator("slowdowns", mode="before")
    @classmethod
    def _split_slowdowns(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                return tuple(float(p) for p in split_list(value))
            except ValueError:
                raise ValueError(f"{value!r} is not a comma-separated list of numbers") from None
        return value

    _dtypes_from_text = field_validator("accepted_dtypes", mode="before")(text_as_tuple)
    _names_from_text = field_validator("target_names", mode="before")(text_as_tuple)

    @field_validator("target_shift", "target_scale", mode="before")
    @classmethod
    def _numbers_from_text(cls, value: object) -> object:
        """A list given as one string (`0,1,2`, `[0, 1, 2]`) as its numbers; a list of one as that number."""
        if isinstance(value, str) and ("," in value or value.strip().startswith("[")):
            try:
                value = tuple(float(p) for p in split_list(value))
            except ValueError:
                raise ValueError(f"{value!r} is neither a number nor a comma-separated list of numbers") from None
        if isinstance(value, (list, tuple)) and len(value) == 1:
            return value[0]
        return value

    @field_validator("target_shift", "target_scale")
    @classmethod
    def _finite_and_scales_positive(cls, value: float | tuple[float, ...], info: ValidationInfo) -> float | tuple[
            float, ...]:
        values = value if isinstance(value, tuple) else (value,)
        if not values:
            raise ValueError("give one number, or one per value of the target")
        for i, v in enumerate(values):
            where = f"value {i} ({v})" if isinstance(value, tuple) else str(v)
            if not math.isfinite(v):
                raise ValueError(f"{where} is not finite")
            if info.field_name == "target_scale" and v <= 0:
                raise ValueError(f"{where} is not above 0 (a scale divides the target)")
        return value

    _input_stats_from_text = field_validator("input_shift", "input_scale", mode="before")(numbers_as_tuple)

    @field_validator("input_shift", "input_scale")
    @classmethod
    def _input_stats_finite(cls, value: tuple[float, ...], info: ValidationInfo) -> tuple[float, ...]:
        for i, v in enumerate(value):
            if not math.isfinite(v) or (info.field_name == "input_scale" and v <= 0):
                need = "finite and above 0 (a scale divides the feature)" if info.field_name == "input_scale" \
                    else "finite"
                raise ValueError(f"feature {i}: {v} is not {need}")
        return value

    @field_validator("accepted_dtypes")
    @classmethod
    def _dtypes_on_the_wire(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [d for d in value if d not in DTYPES]
        if unknown:
            raise ValueError(f"{', '.join(map(repr, unknown))} not among the wire's dtypes ({', '.join(DTYPES)})")
        if not value:
            raise ValueError(f"name at least one dtype ({', '.join(DTYPES)})")
        return value

    @field_validator("slowdowns")
    @classmethod
    def _slowdowns_at_least_one(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        for i, factor in enumerate(value):
            if not 1.0 <= factor <= 1000.0:  # also rejects nan
                raise ValueError(f"factor {factor} of rank {i} must be in [1, 1000] (1 = full speed)")
        return value

    @field_validator("model")
    @classmethod
    def _is_builtin_or_dotted(cls, value: str) -> str:
        if value not in BUILTIN_MODELS and not DOTTED_PATH.match(value):
            raise ValueError(f"{value!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) nor a dotted "
                             "path of the form package.module:attribute")
        return value

    @field_validator("objective")
    @classmethod
    def _is_builtin_objective_or_dotted(cls, value: str) -> str:
        if value not in BUILTIN_OBJECTIVES and not DOTTED_PATH.match(value):
            raise ValueError(f"{value!r} is neither a built-in objective ({', '.join(BUILTIN_OBJECTIVES)}) nor a "
                             "dotted path of the form package.module:attribute")
        return value

    @field_validator("collate")
    @classmethod
    def _is_dotted_path(cls, value: str | None) -> str | None:
        if value is not None and not DOTTED_PATH.match(value):
            raise ValueError(f"{value!r} is not a dotted path of the form package.module:attribute")
        return value

    _packaged_is_known = field_validator("eval_packaged")(check_packaged_name)

    @model_validator(mode="after")
    def _device_fits_backend(self) -> TrainerConfig:
        if self.device == "cpu" and self.backend == "nccl":
            raise ValueError("backend 'nccl' needs device 'cuda' or 'auto', not 'cpu'")
        if self.eval_path is not None and self.eval_packaged is not None:
            raise ValueError("set eval_path or eval_packaged, not both")
        return self

    @model_validator(mode="after")
    def _per_value_settings_fit_the_width(self) -> TrainerConfig:
        for name in ("target_shift", "target_scale"):
            value = getattr(self, name)
            if isinstance(value, tuple) and len(value) != self.target_width:
                raise ValueError(f"{name} has {len(value)} values but target_width is {self.target_width}: give "
                                 f"one number, or one per value of the target")
        for name in ("input_shift", "input_scale"):
            got = len(getattr(self, name))
            if got and got != self.num_features:
                raise ValueError(f"{name} has {got} values but num_features is {self.num_features}: give one per "
                                 "feature (or none, to have them estimated)")
        if bool(self.input_shift) != bool(self.input_scale):
            raise ValueError("set input_shift and input_scale together (or neither, to have them estimated)")
        width = {"regression": ("target_width", self.target_width), "multilabel": ("num_tags", self.num_tags)}.get(
            self.objective)
        if self.target_names and width is not None and len(self.target_names) != width[1]:
            raise ValueError(f"target_names has {len(self.target_names)} names but {width[0]} is {width[1]}")
        return self
