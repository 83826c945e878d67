"""`streamtrain bench truncation`: what `persist`, `truncate` and `bounded` retain when streams outrun training.

ScaDLES §III-D / Table IV: streams at S2 rates (uniform, mean 300 samples/s per device) arrive faster
than the devices train, so persistence keeps a backlog that grows without bound, while stream
truncation keeps about one step's worth of the newest samples and reaches the same accuracy.

Each policy runs live, one after the other, on one broker and on the same data: the same device
streams (rates drawn once from the S2 preset with `--seed`, the same synthetic task and sample
sizes), a coordinator with `--truncation <policy>` (and DeleteRecords on for `truncate` and
`bounded`, so truncated records leave the broker), and one gloo rank per device. The coordinator's
per-device batch cap `coordinator.b_max` is what makes the streams outrun training: at most
`b_max` samples per device per step. Every `--sample-every` seconds the benchmark reads from Kafka
the records each device topic retains (high watermark - log start offset) and the trainers'
`StepFeedback` (buffer depth, loss, samples dropped). After N steps counted from the moment the
producers start, the trainers are stopped (they checkpoint) and the final model is scored on a
held-out set of the same task.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from pydantic import Field

from streamtrain.config import StreamtrainConfig, load_config
from streamtrain.config.trainer import TrainerConfig
from streamtrain.kafka import make_consumer
from streamtrain.wire import StepFeedback

from .common import (
    TIMES,
    Bench,
    LaunchOptions,
    Record,
    RenderContext,
    Result,
    Target,
    heldout_score,
    num,
    progress_bars,
    pyplot,
    save_figure,
    slope,
    table,
    target_lines,
    targets_table,
)
from .live import FeedbackTail, LiveBroker, Services, ensure_device_topics, live_broker, train_command, watermarks
from .streams import StreamsSetup

__all__ = ["BENCH", "PAPER_RATIO_RANGE", "POLICIES", "PolicySeries", "TruncationCell",
           "TruncationResult", "TruncationRunSetup", "TruncationSetup", "compare_to_persist", "run_truncation",
           "second_half_slope", "truncation_targets"]

logger = logging.getLogger(__name__)

#: The truncation policies, in the order they run.
POLICIES: tuple[str, ...] = ("persist", "truncate", "bounded")


class TruncationSetup(StreamsSetup):
    """What every policy of the truncation benchmark runs on (same seeds, same data); service logs and
    checkpoints go to work_dir/<policy> (default <out>/truncation-runs). `b_max` is what makes the streams
    outrun training."""

    steps: int = 400
    """Steps per policy, counted from the first step that trains a streamed sample."""
    signal: float = 0.1
    hidden_size: int = 64
    num_layers: int = 2
    checkpoint_every: int = 2
    run_timeout_s: float = 300.0
    heldout: int = 2000
    policies: tuple[str, ...] = POLICIES
    quick: bool = False
    """Whether `--quick` chose the devices and steps (a note for the reader of the JSON)."""

    def producer_sets(self) -> dict[str, object]:
        return {
            "producer.devices": self.devices, "producer.device_ids": self.device_ids(),
            "producer.rate.rates": self.stream_rates(), "producer.seed": self.seed,
            "producer.size.kind": "normal" if self.size_dif > 0 else "fixed", "producer.size.mean": self.size_mean,
            "producer.size.dif": self.size_dif, "producer.synthetic.features": self.features,
            "producer.synthetic.classes": self.classes, "producer.synthetic.signal": self.signal,
            "producer.duration_seconds": 0, "producer.tick_seconds": 0.01, "producer.metrics": False,
        }

    def trainer_sets(self) -> dict[str, object]:
        return {f"trainer.{k}": v for k, v in {
            "device": "cpu", "backend": "gloo", "torch_threads": 1, "num_features": self.features,
            "num_classes": self.classes, "hidden_size": self.hidden_size, "num_layers": self.num_layers,
            "seed": self.seed, "plan_wait_seconds": 1.0, "data_wait_seconds": 0.5,
            "checkpoint_every": self.checkpoint_every, "log_every": 10, "metrics": False}.items()}

    def trainer_config(self) -> TrainerConfig:
        return load_config(env={}, overrides=self.trainer_sets()).trainer

    def coordinator_sets(self, policy: str) -> dict[str, object]:
        sets: dict[str, object] = {
            "coordinator.devices": self.device_ids(), "coordinator.policy": self.planner,
            "coordinator.truncation": policy, "coordinator.delete_records": policy != "persist",
            "coordinator.delete_trained": policy != "persist",
            "coordinator.b_max": self.b_max, "coordinator.poll_interval_seconds": 0.5,
            "coordinator.feedback_wait_seconds": 0.5, "coordinator.seed": self.seed,
        }
        if policy == "bounded":
            sets["coordinator.max_lag_samples"] = self.max_lag_samples
        return sets

    def heldout_samples(self) -> list[Any]:
        """Held-out samples of the same task and devices (another seed of the same streams)."""
        from producers.sources import SyntheticSource
        from streamtrain.wire import Sample

        cfg = load_config(env={}, overrides={**self.producer_sets(), "producer.seed": self.seed + 10_007}).producer
        source = SyntheticSource(cfg, self.devices)
        per = max(1, self.heldout // self.devices)
        return [Sample.from_array(f"heldout-{d}", i, s.array, label=s.label)
                for d in range(self.devices) for i, s in enumerate(source.take(d, per))]


#: ScaDLES Table IV: buffer size under persistence over truncation, after their runs.
PAPER_RATIO_RANGE = (848, 9429)


class PolicySeries(Record):
    """One policy's samples over the run, every `sample_every_s` seconds."""

    t: list[float] = Field(default_factory=list)
    """Seconds since the producers started."""
    step: list[int] = Field(default_factory=list)
    """Steps since the first that trained a streamed sample."""
    retained_records: list[int] = Field(default_factory=list)
    """Records the device topics retain on the broker (high watermark - log start offset)."""
    produced_records: list[int] = Field(default_factory=list)
    buffer_depth: list[int] = Field(default_factory=list)
    """Samples the trainers buffer (all ranks)."""
    loss: list[float | None] = Field(default_factory=list)
    """Mean of the ranks' latest training losses."""


class TruncationCell(Record):
    """One truncation policy's figures after its N steps."""

    policy: str
    retained_records_final: int
    retained_records_per_device: dict[str, int]
    produced_records: int
    deleted_records: int
    buffer_depth_final: int
    truncated: int
    trained_samples: int
    final_loss: float | None
    accuracy: float | None
    """Held-out accuracy of the final checkpoint (None without one)."""
    heldout_loss: float | None
    seconds: float
    retained_records_max: int
    retained_ratio_to_persist: float | None = None
    retained_slope_per_step_second_half: float | None = None
    flat: bool | None = None
    """Its retained records grow, over the second half, at under 5% of persistence's rate (None for persist)."""


class TruncationRunSetup(TruncationSetup):
    """The setup as `truncation.json` stores it: with the rates drawn and where the broker was."""

    rates: list[float]
    embedded_broker: bool


class TruncationResult(Result):
    """What `truncation.json` holds."""

    steps: int
    cells: list[TruncationCell]
    series: dict[str, PolicySeries]
    setup: TruncationRunSetup
    paper_ratio_range: tuple[int, int] = PAPER_RATIO_RANGE
    seconds: float

    def cell(self, policy: str) -> TruncationCell | None:
        return next((c for c in self.cells if c.policy == policy), None)


def second_half_slope(series: PolicySeries) -> float | None:
    """Least-squares slope of the records retained over steps, over the second half of the steps."""
    pts = list(zip(series.step, series.retained_records, strict=True))
    last = pts[-1][0] if pts else 0
    half = [(s, r) for s, r in pts if s >= last / 2]
    value = slope([float(s) for s, _ in half], [float(r) for _, r in half])
    return None if value is None else round(value, 2)


def compare_to_persist(cells: Sequence[TruncationCell], series: dict[str, PolicySeries]) -> list[TruncationCell]:
    """Each cell with its ratio of records retained to persistence's, its second-half growth, and whether that
    growth is flat next to persistence's (which keeps every record: it grows at the whole input rate)."""
    persist = next((c for c in cells if c.policy == "persist"), None)
    base = persist.retained_records_final if persist else None
    growth = second_half_slope(series["persist"]) if persist else None
    out = []
    for cell in cells:
        own = second_half_slope(series[cell.policy])
        out.append(cell.model_copy(update={
            "retained_ratio_to_persist": round(base / cell.retained_records_final, 1)
            if base and cell.retained_records_final else None,
            "retained_slope_per_step_second_half": own,
            # Flat: over the second half the retained records grow at under 5% of persistence's rate.
            "flat": None if own is None or not growth or cell.policy == "persist" else bool(own <= 0.05 * growth),
        }))
    return out


Progress = Callable[[str, int, int, int, int], None]
"""(policy, step, of steps, broker records retained, trainer buffer depth)."""


def _evaluate(setup: TruncationSetup, checkpoint_dir: Path) -> tuple[float | None, float | None]:
    """Held-out accuracy and loss of the trainers' final checkpoint (None when there is none)."""
    from streamtrain.models.batching import collate_packed
    from streamtrain.models.plugins import build_model
    from trainer.checkpoint import load_checkpoint

    ckpt = load_checkpoint(checkpoint_dir)
    if ckpt is None:
        return None, None
    cfg = setup.trainer_config()
    model = build_model(cfg)
    model.load_state_dict(ckpt.model)
    accuracy, loss = heldout_score(model, collate_packed(setup.heldout_samples(), cfg))
    return round(accuracy, 4), round(loss, 4)


class _PolicyRun:
    """One truncation policy live: a coordinator and the ranks, then the producers, sampled until N steps."""

    def __init__(self, policy: str, broker: LiveBroker, setup: TruncationSetup, run_dir: Path) -> None:
        self.policy, self.setup, self.job, self.devices = policy, setup, f"trunc-{policy}", setup.device_ids()
        self.kafka = broker.kafka.model_copy(update={"topic_prefix": f"{broker.kafka.topic_prefix}.{policy}"})
        self.ckpt = run_dir / "checkpoints"
        for stale in self.ckpt.iterdir() if self.ckpt.exists() else ():
            stale.unlink()
        self.services = Services(run_dir / "logs")
        self.tail = FeedbackTail(self.kafka, self.job)
        self.probe = make_consumer(self.kafka, f"st-bench-truncation-probe-{policy}")
        self.trace = PolicySeries()  # appended to in place while it runs (its lists are not frozen)
        self.latest: dict[str, StepFeedback] = {}
        self.losses: list[tuple[int, float, int]] = []  # (step, loss, samples)
        self.dropped = self.trained = self.idle_step = 0
        self.marks: dict[str, tuple[int, int]] = {}
        self.step0: int | None = None  # steps count from the first one that trained a streamed sample

    def take_feedback(self) -> None:
        for fb in self.tail.poll():
            self.latest[fb.device_id] = fb
            self.dropped += fb.dropped
            self.trained += fb.samples
            if fb.loss is not None and fb.samples:
                self.losses.append((fb.step, float(fb.loss), fb.samples))

    def _check(self, deadline: float, what: str) -> None:
        if dead := self.services.dead():
            raise RuntimeError(self.services.failure(dead[0]))
        if time.monotonic() > deadline:
            raise RuntimeError(f"{self.policy}: {what}")

    def start(self, launch: LaunchOptions) -> None:
        """The coordinator and the ranks, until every rank has stepped once; then the producers."""
        ensure_device_topics(self.kafka, self.devices)
        common = {"job": self.job, "kafka.bootstrap_servers": self.kafka.bootstrap_servers,
                  "kafka.topic_prefix": self.kafka.topic_prefix, "metrics.port": 0, "log_level": "INFO"}
        sets = {**common, **self.setup.coordinator_sets(self.policy)}
        self.services.start("coordinator", "coordinator", launch.command("coordinator", "coordinate", "--port", "0",
                                                                         settings=sets))
        # The ranks obey a plan's truncation only when the policy they are told of could ask for it.
        trainer_sets = {**sets, **self.setup.trainer_sets()}
        self.services.start("trainers", "trainer", launch.command("trainer", *train_command(self.devices, self.ckpt),
                                                                  settings=trainer_sets))
        deadline = time.monotonic() + self.setup.start_timeout_s
        while len(self.latest) < len(self.devices):
            self.take_feedback()
            self._check(deadline, f"the trainers did not report a step within {self.setup.start_timeout_s:.0f} s")
            time.sleep(0.2)
        self.idle_step = max(fb.step for fb in self.latest.values())
        self.services.start("producers", "producer", launch.command(
            "producers", "produce", "--no-progress", settings={**common, **self.setup.producer_sets()}))

    def sample(self, seconds: float) -> int:
        """Read the feedback and the watermarks once; returns the step reached."""
        self.take_feedback()
        if self.step0 is None:
            self.step0 = min((s for s, _, _ in self.losses if s > self.idle_step), default=None)
        marks = watermarks(self.probe, self.kafka, self.devices)
        self.marks = marks or self.marks
        step = 0 if self.step0 is None else max(0, max(fb.step for fb in self.latest.values()) + 1 - self.step0)
        recent = [fb.loss for fb in self.latest.values() if fb.loss is not None and fb.samples]
        for column, value in (("t", round(seconds, 2)), ("step", step),
                              ("retained_records", sum(hi - lo for lo, hi in marks.values())),
                              ("produced_records", sum(hi for _, hi in marks.values())),
                              ("buffer_depth", sum(fb.buffer_depth for fb in self.latest.values())),
                              ("loss", round(float(np.mean(recent)), 4) if recent else None)):
            getattr(self.trace, column).append(value)
        return step

    def run(self, launch: LaunchOptions, progress: Progress | None) -> tuple[TruncationCell, PolicySeries]:
        """Start, sample every `sample_every_s` until N steps, stop in order, score the final checkpoint."""
        setup = self.setup
        try:
            self.start(launch)
            began = time.monotonic()
            while True:
                step = self.sample(time.monotonic() - began)
                if progress is not None:
                    progress(self.policy, step, setup.steps, self.trace.retained_records[-1],
                             self.trace.buffer_depth[-1])
                if step >= setup.steps:
                    break
                self._check(began + setup.run_timeout_s,
                            f"{setup.steps} steps not reached within {setup.run_timeout_s:.0f} s (at step {step})")
                time.sleep(setup.sample_every_s)
            seconds = time.monotonic() - began
            self.services.stop("producers", signal.SIGINT, 60.0)
            self.services.stop("trainers", signal.SIGTERM, 120.0)
            self.take_feedback()
            self.services.stop("coordinator", signal.SIGTERM, 30.0)
        finally:
            self.services.stop_all()
            self.tail.close()
            self.probe.close()
        return self.cell(seconds), self.trace

    def cell(self, seconds: float) -> TruncationCell:
        accuracy, heldout_loss = _evaluate(self.setup, self.ckpt)
        tail_from = (self.idle_step + 1 if self.step0 is None else self.step0) + max(0, self.setup.steps - 10)
        tail = [(loss, n) for s, loss, n in self.losses if s >= tail_from]
        final_loss = sum(loss * n for loss, n in tail) / sum(n for _, n in tail) if tail else None
        marks = self.marks
        return TruncationCell(
            policy=self.policy, retained_records_final=sum(hi - lo for lo, hi in marks.values()),
            retained_records_per_device={d: hi - lo for d, (lo, hi) in sorted(marks.items())},
            produced_records=sum(hi for _, hi in marks.values()), deleted_records=sum(lo for lo, _ in marks.values()),
            buffer_depth_final=sum(fb.buffer_depth for fb in self.latest.values()), truncated=self.dropped,
            trained_samples=self.trained, final_loss=None if final_loss is None else round(final_loss, 4),
            accuracy=accuracy, heldout_loss=heldout_loss, seconds=round(seconds, 1),
            retained_records_max=max(self.trace.retained_records, default=0))


def run_truncation(cfg: StreamtrainConfig, setup: TruncationSetup, out: Path, external: bool = False,
                   launch: LaunchOptions = LaunchOptions(), progress: Progress | None = None) -> TruncationResult:
    """Run every policy of `setup`, write `out/truncation.json` and `out/truncation.png`, return the result.

    Args:
        cfg: the configuration (its broker settings, or the Kafka to use with `external`).
        setup: what to run.
        out: where the JSON and the plot go.
        external: use the Kafka at `cfg.kafka` rather than a private embedded broker.
        launch: the root options the services are started with.
        progress: called after every sample of the run.
    """
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    cells: list[TruncationCell] = []
    series: dict[str, PolicySeries] = {}
    with live_broker(cfg, external, "truncation") as broker:
        for policy in setup.policies:
            run_dir = (setup.work_dir or out / "truncation-runs") / policy
            cell, curve = _PolicyRun(policy, broker, setup, run_dir).run(launch, progress)
            cells.append(cell)
            series[policy] = curve
    result = TruncationResult(
        steps=setup.steps, cells=compare_to_persist(cells, series), series=series,
        setup=TruncationRunSetup.model_validate({**setup.model_dump(), "rates": setup.stream_rates(),
                                                 "embedded_broker": broker.embedded}),
        seconds=round(time.monotonic() - began, 1))
    result.write(out / "truncation.json")
    plot_truncation(result, out / "truncation.png")
    return result


def plot_truncation(result: TruncationResult, png: Path) -> Path:
    """Records retained on the broker, trainer buffer depth and loss over steps, one line per policy."""
    fig, axes = pyplot().subplots(1, 3, figsize=(12, 3.4))
    for policy, curve in result.series.items():
        axes[0].plot(curve.step, [max(1, r) for r in curve.retained_records], label=policy)
        axes[1].plot(curve.step, curve.buffer_depth, label=policy)
        pts = [(s, v) for s, v in zip(curve.step, curve.loss, strict=True) if v is not None]
        axes[2].plot([p[0] for p in pts], [p[1] for p in pts], label=policy)
    labels = (("records retained on the broker", "broker log (all device topics)"),
              ("samples buffered", "trainer buffers (all ranks)"), ("training loss (mean over ranks)", "loss"))
    for ax, (ylabel, title) in zip(axes, labels, strict=True):
        ax.set(xlabel="step", ylabel=ylabel, title=title, yscale="log" if ax is axes[0] else "linear")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    setup = result.setup
    fig.suptitle(f"{setup.devices} devices at ScaDLES {setup.rate_preset} rates "
                 f"({', '.join(f'{r:g}' for r in setup.rates)} samples/s), b_max {setup.b_max}", fontsize=9)
    return save_figure(fig, png)


def truncation_targets(result: TruncationResult) -> list[Target]:
    """Truncation keeps the broker's records flat next to persistence's, at the same accuracy."""
    persist = result.cell("persist")
    lo, hi = result.paper_ratio_range
    out = [Target(f"`{c.policy}` keeps retained records flat (second-half growth < 5% of `persist`'s); ratio to "
                  f"`persist` after {result.steps} steps",
                  f"{num(c.retained_records_final)} vs {num(persist.retained_records_final)} records = "
                  f"{num(c.retained_ratio_to_persist, 1)}{TIMES} (peak {num(c.retained_records_max)}; growth "
                  f"{num(c.retained_slope_per_step_second_half, 1)} vs "
                  f"{num(persist.retained_slope_per_step_second_half, 1)} records/step)",
                  c.flat, f"ScaDLES Table IV: {lo:,}{TIMES}-{hi:,}{TIMES} after their (much longer) runs")
           for c in result.cells if c.policy != "persist" and persist is not None]
    if persist is not None and persist.accuracy is not None:
        worst = min((c.accuracy for c in result.cells if c.policy != "persist" and c.accuracy is not None),
                    default=None)
        out.append(Target("accuracy under truncation within 2 points of persistence",
                          ", ".join(f"{c.policy} {num(c.accuracy, 3)}" for c in result.cells),
                          None if worst is None else worst >= persist.accuracy - 0.02,
                          "ScaDLES: truncation reached the same 95% / 84% targets as persistence"))
    return out


def render_truncation(result: TruncationResult, ctx: RenderContext) -> str:
    """The `truncation` section of BENCHMARKS.md: targets with the paper's figures, the cells, the plot."""
    png = plot_truncation(result, ctx.plot_path("truncation.png"))
    setup = result.setup
    cells = table(["policy", "retained records", f"ratio persist{TIMES}/policy", "peak retained", "deleted",
                   "buffer depth", "truncated", "trained", "final loss", "held-out accuracy"],
                  [[c.policy, c.retained_records_final, num(c.retained_ratio_to_persist, 1), c.retained_records_max,
                    c.deleted_records, c.buffer_depth_final, c.truncated, c.trained_samples, num(c.final_loss, 3),
                    num(c.accuracy, 3)] for c in result.cells])
    return "\n\n".join([
        f"Setup: {setup.devices} devices, one gloo rank each, rates drawn from ScaDLES {setup.rate_preset} "
        f"({', '.join(f'{r:g}' for r in setup.rates)} samples/s, seed {setup.seed}); planner "
        f"`{setup.planner}` with at most {setup.b_max} samples per device per step, so the streams outrun "
        f"training; `bounded` keeps at most {setup.max_lag_samples} samples per device; DeleteRecords on for "
        f"`truncate` and `bounded`. N = {result.steps} steps per policy from the moment the producers start "
        f"(run time {result.seconds:.0f} s for all three).",
        targets_table(truncation_targets(result)),
        cells,
        f"![truncation]({ctx.link(png)})",
    ])


def truncation_command(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="Directory for truncation.json and truncation.png.",
                                      metavar="DIR")] = Path("reports/bench"),
    quick: Annotated[bool, typer.Option(help="2 devices and 100 steps per policy (about a minute and a half).")
                     ] = False,
    steps: Annotated[int | None, typer.Option(min=5, help="Steps per policy (default 400; 100 with --quick).")] = None,
    devices: Annotated[int | None, typer.Option(min=1, max=16, help="Device streams, one gloo rank each "
                                                "(default 4; 2 with --quick).")] = None,
    b_max: Annotated[int, typer.Option(min=1, help="coordinator.b_max: most samples per device per step "
                                       "(what makes the streams outrun training).")] = 12,
    max_lag_samples: Annotated[int, typer.Option(min=1, help="bounded: coordinator.max_lag_samples.")] = 512,
    policy: Annotated[list[str] | None, typer.Option("--policy", help="Truncation policy to run (repeatable; "
                                                     "default all three).")] = None,
    planner: Annotated[str, typer.Option(help="coordinator.policy that plans the batches.")] = "scadles",
    seed: Annotated[int, typer.Option(help="Seed of the stream rates, the data and the model.")] = 0,
    external: Annotated[bool, typer.Option(help="Use the configured Kafka (kafka.bootstrap_servers) instead of a "
                                           "private embedded broker.")] = False,
    work_dir: Annotated[Path, typer.Option(help="Service logs and checkpoints (WORK_DIR/truncation/<policy>).")
                        ] = Path("reports/bench-runs"),
) -> None:
    """Records retained under persist, truncate and bounded when ScaDLES S2 streams outrun training, and the
    final model's held-out accuracy. Writes DIR/truncation.json and DIR/truncation.png; service logs go to
    WORK_DIR/truncation/<policy>/logs."""
    from streamtrain.cli_support import config_from, console, die

    cfg = config_from(ctx)
    chosen = tuple(policy or POLICIES)
    unknown = sorted(set(chosen) - set(POLICIES))
    if unknown:
        die(f"--policy {', '.join(unknown)}: not a truncation policy (have: {', '.join(POLICIES)})", 2)
    setup = TruncationSetup(devices=devices or (2 if quick else 4), steps=steps or (100 if quick else 400),
                            seed=seed, b_max=b_max, max_lag_samples=max_lag_samples, planner=planner,
                            policies=chosen, work_dir=work_dir / "truncation", quick=quick)
    try:
        with progress_bars(chosen, setup.steps, "broker retains {task.fields[retained]:>8,}  buffers "
                           "{task.fields[depth]:>6,}", retained=0, depth=0) as update:
            result = run_truncation(cfg, setup, out, external, LaunchOptions.of(ctx), lambda name, step, total,
                                    retained, depth: update(name, min(step, total), retained=retained, depth=depth))
    except RuntimeError as exc:
        die(str(exc))
    for line in target_lines(truncation_targets(result)):
        console.print(line, highlight=False)
    console.print(f"wrote {out / 'truncation.json'} and {out / 'truncation.png'} in {result.seconds:.0f} s",
                  highlight=False)


BENCH = Bench("truncation", truncation_command, TruncationResult, render_truncation, quick_args=("--quick",),
              timeout_s=600, about=__doc__ or "")
