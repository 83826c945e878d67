"""`streamtrain bench truncation`: what `persist`, `truncate` and `bounded` retain when streams outrun training."""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from pydantic import Field

from streamtrain.config import StreamtrainConfig, load_config
from streamtrain.kafka import make_consumer
from streamtrain.runtime.commands import EXIT_CONFIG, config_from, console, die
from streamtrain.wire import Sample, StepFeedback

from . import common
from .common import TIMES, Bench, LaunchOptions, Record, Result, Target, num, publish, pyplot, table, targets_table
from .live import FeedbackTail, LiveBroker, Services, StreamsSetup, live_broker, train_command, watermarks

__all__ = ["BENCH", "TruncationResult", "TruncationSetup", "against_persist", "run_truncation"]

POLICIES: tuple[str, ...] = ("persist", "truncate", "bounded")


class TruncationSetup(StreamsSetup):
    """What every policy runs on (same seeds, same data): `steps` counted from the first step that trains a streamed
    sample; `b_max` makes the streams outrun training; `quick` says whether `--quick` chose devices and steps."""

    steps: int = 400
    signal: float = 0.1
    hidden_size: int = 64
    num_layers: int = 2
    checkpoint_every: int = 2
    run_timeout_s: float = 300.0
    heldout: int = 2000
    policies: tuple[str, ...] = POLICIES
    quick: bool = False

    def producers(self, seed: int) -> dict[str, object]:
        return {**self.producer_sets(self.device_ids(), self.stream_rates(), seed),
                "producer.synthetic.signal": self.signal}

    def ranks(self) -> dict[str, object]:
        return self.trainer_sets(hidden_size=self.hidden_size, num_layers=self.num_layers, seed=self.seed,
                                 checkpoint_every=self.checkpoint_every, log_every=10)


class PolicySeries(Record):
    """One policy's readings: seconds since the producers started, steps, records the device topics retain,
    samples the trainers buffer (all ranks), the mean of the ranks' latest losses."""

    t: list[float] = Field(default_factory=list)
    step: list[int] = Field(default_factory=list)
    retained_records: list[int] = Field(default_factory=list)
    buffer_depth: list[int] = Field(default_factory=list)
    loss: list[float | None] = Field(default_factory=list)

    def growth(self) -> float | None:
        """Least-squares slope of the records retained over steps, over the second half of the steps."""
        last = self.step[-1] if self.step else 0
        half = [(s, r) for s, r in zip(self.step, self.retained_records, strict=True) if s >= last / 2]
        value = common.slope([float(s) for s, _ in half], [float(r) for _, r in half])
        return None if value is None else round(value, 2)


class TruncationCell(Record):
    """One truncation policy's figures after its N steps (`accuracy`: held-out, of the final checkpoint)."""

    policy: str
    retained_records_final: int
    retained_records_max: int
    produced_records: int
    deleted_records: int
    buffer_depth_final: int
    truncated: int
    trained_samples: int
    final_loss: float | None
    accuracy: float | None


class TruncationResult(Result):
    """What `truncation.json` holds (`rates`: each device's, in samples/s)."""

    setup: TruncationSetup
    rates: list[float]
    cells: list[TruncationCell]
    series: dict[str, PolicySeries]
    seconds: float

    def cell(self, policy: str) -> TruncationCell | None:
        return next((c for c in self.cells if c.policy == policy), None)


def against_persist(result: TruncationResult) -> dict[str, tuple[float | None, float | None, bool | None]]:
    """Per policy: (persistence's records retained over its own, its second-half growth in records per step, whether
    that growth is flat: under 5% of persistence's)."""
    persist = result.cell("persist")
    base = persist.retained_records_final if persist else None
    growth = result.series["persist"].growth() if persist else None
    out = {}
    for cell in result.cells:
        own = result.series[cell.policy].growth()
        out[cell.policy] = (round(base / cell.retained_records_final, 1) if base and cell.retained_records_final
                            else None, own,
                            None if own is None or not growth or cell.policy == "persist" else own <= 0.05 * growth)
    return out


class _PolicyRun:
    """One truncation policy live: a coordinator and the ranks, then the producers, sampled until N steps."""

    def __init__(self, policy: str, broker: LiveBroker, setup: TruncationSetup, run_dir: Path,
                 launch: LaunchOptions) -> None:
        self.policy, self.setup, self.devices = policy, setup, setup.device_ids()
        self.kafka = broker.kafka.model_copy(update={"topic_prefix": f"{broker.kafka.topic_prefix}.{policy}"})
        self.ckpt = run_dir / "checkpoints"
        shutil.rmtree(self.ckpt, ignore_errors=True)
        self.services = Services(self.kafka, f"trunc-{policy}", run_dir / "logs", launch, self.devices)
        self.services.common["log_level"] = "INFO"
        self.tail = FeedbackTail(self.kafka, f"trunc-{policy}")
        self.probe = make_consumer(self.kafka, f"st-bench-truncation-probe-{policy}")
        self.trace = PolicySeries()  # appended to in place while it runs (its lists are not frozen)
        self.fed: list[StepFeedback] = []
        self.marks: dict[str, tuple[int, int]] = {}
        self.idle_step = 0
        self.step0: int | None = None  # the first step that trained a streamed sample

    def take_feedback(self) -> set[str]:
        """Read the new feedback; returns the devices that have reported a step."""
        self.fed += self.tail.poll()
        return set(self.tail.latest)

    def sample(self, seconds: float) -> int:
        """Read the feedback and the watermarks once (a console line every 50 steps); returns the step reached."""
        self.take_feedback()
        if self.step0 is None:
            self.step0 = min((fb.step for fb in self.fed if fb.loss is not None and fb.samples
                              and fb.step > self.idle_step), default=None)
        self.marks = watermarks(self.probe, self.kafka, self.devices) or self.marks
        latest = self.tail.latest.values()
        step = 0 if self.step0 is None else max(0, max(fb.step for fb in latest) + 1 - self.step0)
        recent = [fb.loss for fb in latest if fb.loss is not None and fb.samples]
        retained, depth = sum(hi - lo for lo, hi in self.marks.values()), sum(fb.buffer_depth for fb in latest)
        if step // 50 > (self.trace.step[-1] // 50 if self.trace.step else -1) or step >= self.setup.steps:
            console.print(f"{self.policy:<8} step {min(step, self.setup.steps):>4}/{self.setup.steps}: broker retains "
                          f"{retained:>7,}, trainers buffer {depth:>6,}", highlight=False)
        self.trace.t.append(round(seconds, 2))
        self.trace.step.append(step)
        self.trace.retained_records.append(retained)
        self.trace.buffer_depth.append(depth)
        self.trace.loss.append(round(float(np.mean(recent)), 4) if recent else None)
        return step

    def run(self) -> tuple[TruncationCell, PolicySeries]:
        """Start, sample every `sample_every_s` until N steps, stop in order, score the final checkpoint."""
        setup, policy = self.setup, self.policy
        sets = setup.coordinator_sets(policy, delete_records=policy != "persist", delete_trained=policy != "persist",
                                      poll_interval_seconds=0.5, feedback_wait_seconds=0.5,
                                      **({"max_lag_samples": setup.max_lag_samples} if policy == "bounded" else {}))
        try:
            self.services.start("coordinator", "coordinator", "coordinate", "--port", "0", settings=sets)
            # The ranks obey a plan's truncation only when the policy they are told of could ask for it.
            self.services.start("trainers", "trainer", *train_command(self.devices, self.ckpt),
                                settings={**sets, **setup.ranks()})
            self.services.await_ranks(self.take_feedback, self.devices, setup.start_timeout_s)
            self.idle_step = max(fb.step for fb in self.tail.latest.values())
            self.services.start("producers", "producer", "produce", "--no-progress",
                                settings=setup.producers(setup.seed))
            began = time.monotonic()
            while (step := self.sample(time.monotonic() - began)) < setup.steps:
                self.services.check(began + setup.run_timeout_s, f"{policy}: {setup.steps} steps not reached "
                                    f"within {setup.run_timeout_s:.0f} s (at step {step})")
                time.sleep(setup.sample_every_s)
            self.services.stop("producers", signal.SIGINT, 60.0)
            self.services.stop("trainers", signal.SIGTERM, 120.0)
            self.take_feedback()
            self.services.stop("coordinator", signal.SIGTERM, 30.0)
        finally:
            self.services.stop_all()
            self.tail.close()
            self.probe.close()
        return self.cell(), self.trace

    def cell(self) -> TruncationCell:
        """The policy's figures: the final watermarks and feedback, the loss of the last 10 steps, the accuracy."""
        tail_from = (self.idle_step + 1 if self.step0 is None else self.step0) + max(0, self.setup.steps - 10)
        tail = [(fb.loss, fb.samples) for fb in self.fed if fb.loss is not None and fb.samples and fb.step >= tail_from]
        final_loss = sum(loss * n for loss, n in tail) / sum(n for _, n in tail) if tail else None
        marks = self.marks.values()
        return TruncationCell(
            policy=self.policy, retained_records_final=sum(hi - lo for lo, hi in marks),
            retained_records_max=max(self.trace.retained_records, default=0),
            produced_records=sum(hi for _, hi in marks), deleted_records=sum(lo for lo, _ in marks),
            buffer_depth_final=sum(fb.buffer_depth for fb in self.tail.latest.values()),
            truncated=sum(fb.dropped for fb in self.fed), trained_samples=sum(fb.samples for fb in self.fed),
            final_loss=None if final_loss is None else round(final_loss, 4), accuracy=self.accuracy())

    def accuracy(self) -> float | None:
        """Held-out accuracy of the final checkpoint (None without one), on another seed of the same streams."""
        from streamtrain.models.batching import collate_packed
        from streamtrain.models.plugins import build_model
        from streamtrain.producers.sources import SyntheticSource
        from streamtrain.trainer.checkpoint import load_checkpoint

        setup, ckpt = self.setup, load_checkpoint(self.ckpt)
        if ckpt is None:
            return None
        cfg = load_config(env={}, overrides=setup.ranks()).trainer
        model = build_model(cfg)
        model.load_state_dict(ckpt.model)
        source = SyntheticSource(load_config(env={}, overrides=setup.producers(setup.seed + 10_007)).producer,
                                 setup.devices)
        heldout = [Sample.from_array(f"heldout-{d}", i, s.array, label=s.label) for d in range(setup.devices)
                   for i, s in enumerate(source.take(d, max(1, setup.heldout // setup.devices)))]
        return round(common.heldout_score(model, collate_packed(heldout, cfg))[0], 4)


def run_truncation(cfg: StreamtrainConfig, setup: TruncationSetup, out: Path, external: bool = False,
                   launch: LaunchOptions = LaunchOptions()) -> TruncationResult:
    """Run every policy of `setup` on a private embedded broker (or `cfg.kafka` with `external`); write
    `out/truncation.json` and `out/truncation.png`, return the result."""
    began = time.monotonic()
    with live_broker(cfg, external, "truncation") as broker:
        runs = [_PolicyRun(policy, broker, setup, (setup.work_dir or out / "truncation-runs") / policy, launch)
                .run() for policy in setup.policies]
    result = TruncationResult(setup=setup, rates=setup.stream_rates(), cells=[c for c, _ in runs],
                              series={c.policy: s for c, s in runs}, seconds=round(time.monotonic() - began, 1))
    return publish(BENCH, result, out)


def plot_truncation(result: TruncationResult) -> Any:
    """Records retained on the broker, trainer buffer depth and loss over steps, one line per policy."""
    fig, axes = pyplot().subplots(1, 3, figsize=(12, 3.4))
    panels = (("retained_records", "records retained on the broker", "broker log (all device topics)", "log"),
              ("buffer_depth", "samples buffered", "trainer buffers (all ranks)", "linear"),
              ("loss", "training loss (mean over ranks)", "loss", "linear"))
    for ax, (column, ylabel, title, yscale) in zip(axes, panels, strict=True):
        for policy, curve in result.series.items():
            pts = [(s, v) for s, v in zip(curve.step, getattr(curve, column), strict=True) if v is not None]
            ax.plot([s for s, _ in pts], [max(1, v) if yscale == "log" else v for _, v in pts], label=policy)
        ax.set(xlabel="step", ylabel=ylabel, title=title, yscale=yscale)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    setup = result.setup
    fig.suptitle(f"{setup.devices} devices at ScaDLES {setup.rate_preset} rates "
                 f"({', '.join(f'{r:g}' for r in result.rates)} samples/s), b_max {setup.b_max}", fontsize=9)
    return fig


def truncation_targets(result: TruncationResult) -> list[Target]:
    """Truncation keeps the broker's records flat next to persistence's, at the same accuracy."""
    persist, versus = result.cell("persist"), against_persist(result)
    if persist is None:
        return []
    out = [Target(f"`{c.policy}`: retained records flat (second-half growth < 5% of `persist`'s); ratio to `persist` "
                  f"after {result.setup.steps} steps",
                  f"{num(c.retained_records_final)} vs {num(persist.retained_records_final)} records = "
                  f"{num(versus[c.policy][0], 1)}{TIMES} (peak {num(c.retained_records_max)}; growth "
                  f"{num(versus[c.policy][1], 1)} vs {num(versus['persist'][1], 1)} records/step)", versus[c.policy][2],
                  f"ScaDLES Table IV: 848{TIMES}-9,429{TIMES} after their (much longer) runs")
           for c in result.cells if c.policy != "persist"]
    if persist.accuracy is not None:
        worst = min((c.accuracy for c in result.cells if c.policy != "persist" and c.accuracy is not None),
                    default=None)
        out.append(Target("accuracy under truncation within 2 points of persistence",
                          ", ".join(f"{c.policy} {num(c.accuracy, 3)}" for c in result.cells),
                          None if worst is None else worst >= persist.accuracy - 0.02,
                          "ScaDLES: truncation reached the same 95% / 84% targets as persistence"))
    return out


def render_truncation(result: TruncationResult) -> str:
    """The `truncation` section of BENCHMARKS.md: setup, targets with the paper's figures, the cells."""
    setup, versus = result.setup, against_persist(result)
    return "\n\n".join([
        f"Setup: {setup.devices} devices, a gloo rank each, ScaDLES {setup.rate_preset} rates "
        f"{', '.join(f'{r:g}' for r in result.rates)} samples/s (seed {setup.seed}); planner `{setup.planner}`, "
        f"b_max {setup.b_max}; `bounded` keeps {setup.max_lag_samples} samples per device; N = {setup.steps} steps "
        f"per policy; {result.seconds:.0f} s in all.",
        targets_table(truncation_targets(result)),
        table(["policy", "retained records", f"ratio persist{TIMES}/policy", "peak retained", "deleted",
               "buffer depth", "truncated", "trained", "final loss", "held-out accuracy"],
              [[c.policy, c.retained_records_final, num(versus[c.policy][0], 1), c.retained_records_max,
                c.deleted_records, c.buffer_depth_final, c.truncated, c.trained_samples, num(c.final_loss, 3),
                num(c.accuracy, 3)] for c in result.cells]),
    ])


def truncation_command(
    ctx: typer.Context,
    out: common.Out = Path("reports/bench"),
    quick: Annotated[bool, typer.Option(help="2 devices, 100 steps per policy (~1.5 min).")] = False,
    steps: Annotated[int | None, typer.Option(min=5, help="Steps per policy (default 400; 100 with --quick).")] = None,
    devices: Annotated[int | None, typer.Option(min=1, max=16, help="Device streams, a gloo rank each (default 4; "
                                                "2 with --quick).")] = None,
    b_max: Annotated[int, typer.Option(min=1, help="coordinator.b_max: most samples per device per step.")] = 12,
    max_lag_samples: Annotated[int, typer.Option(min=1, help="bounded: coordinator.max_lag_samples.")] = 512,
    policy: Annotated[list[str] | None, typer.Option("--policy", help="Truncation policy to run (repeatable; "
                                                     "default all three).")] = None,
    planner: Annotated[str, typer.Option(help="coordinator.policy that plans the batches.")] = "scadles",
    seed: common.Seed = 0,
    external: common.External = False,
    work_dir: common.WorkDir = Path("reports/bench-runs"),
) -> None:
    """Records retained under persist, truncate and bounded when ScaDLES S2 streams outrun training, and held-out
    accuracy. Writes DIR/truncation.json and .png; logs in WORK_DIR/truncation/<policy>/logs."""
    cfg = config_from(ctx)
    chosen = tuple(policy or POLICIES)
    if unknown := sorted(set(chosen) - set(POLICIES)):
        die(f"--policy {', '.join(unknown)}: not a truncation policy (have: {', '.join(POLICIES)})", EXIT_CONFIG)
    setup = TruncationSetup(devices=devices or (2 if quick else 4), steps=steps or (100 if quick else 400),
                            seed=seed, b_max=b_max, max_lag_samples=max_lag_samples, planner=planner,
                            policies=chosen, work_dir=work_dir / "truncation", quick=quick)
    try:
        run_truncation(cfg, setup, out, external, LaunchOptions.of(ctx))
    except RuntimeError as exc:
        die(str(exc))


BENCH = Bench("truncation", truncation_command, TruncationResult, render_truncation, truncation_targets,
              plot_truncation, quick_args=("--quick",), timeout_s=600)
