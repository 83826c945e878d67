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

import json
import logging
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from streamtrain.cli_support import module_command
from streamtrain.config import ProducerConfig, StreamtrainConfig
from streamtrain.config.producer import RateConfig
from streamtrain.config.trainer import TrainerConfig
from streamtrain.kafka import make_consumer

from .live import (
    FeedbackTail,
    LiveBroker,
    Services,
    ensure_device_topics,
    live_broker,
    train_command,
    watermarks,
)
from .registry import save_figure

__all__ = ["POLICIES", "TruncationSetup", "plot_truncation", "render_truncation", "run_truncation",
           "truncation_command"]

logger = logging.getLogger(__name__)

POLICIES: tuple[str, ...] = ("persist", "truncate", "bounded")

#: ScaDLES Table IV: buffer size under persistence over truncation, after their runs.
PAPER_RATIO_RANGE = (848, 9429)


@dataclass
class TruncationSetup:
    """What every policy of the truncation benchmark runs on (same seeds, same data)."""

    devices: int = 4
    steps: int = 400
    seed: int = 0
    rate_preset: str = "S2"
    planner: str = "scadles"
    b_max: int = 12
    max_lag_samples: int = 512
    size_mean: float = 45.0
    size_dif: float = 15.0
    features: int = 16
    classes: int = 10
    signal: float = 0.1
    hidden_size: int = 64
    num_layers: int = 2
    checkpoint_every: int = 2
    sample_every_s: float = 0.5
    start_timeout_s: float = 240.0
    run_timeout_s: float = 300.0
    heldout: int = 2000
    policies: tuple[str, ...] = POLICIES
    work_dir: Path | None = None
    """Service logs and checkpoints go to work_dir/<policy> (default: <out>/truncation-runs)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def device_ids(self) -> list[str]:
        return [str(i) for i in range(self.devices)]

    def rates(self) -> list[float]:
        """Each device's rate in samples/s, drawn once from the preset with `seed` (identical for every policy)."""
        from producers.rates import sample_base_rates

        cfg = RateConfig(preset=self.rate_preset)  # type: ignore[arg-type]  # validated by the model
        return [round(float(r), 1) for r in sample_base_rates(cfg, self.devices, np.random.default_rng(self.seed))]

    def producer_sets(self) -> dict[str, object]:
        return {
            "producer.devices": self.devices, "producer.device_ids": self.device_ids(),
            "producer.rate.rates": self.rates(), "producer.seed": self.seed,
            "producer.size.kind": "normal" if self.size_dif > 0 else "fixed", "producer.size.mean": self.size_mean,
            "producer.size.dif": self.size_dif, "producer.synthetic.features": self.features,
            "producer.synthetic.classes": self.classes, "producer.synthetic.signal": self.signal,
            "producer.duration_s": 0, "producer.tick_s": 0.01, "producer.metrics": False,
        }

    def trainer_config(self, checkpoint_dir: Path | None = None) -> TrainerConfig:
        return TrainerConfig(
            device="cpu", backend="gloo", torch_threads=1, num_features=self.features, num_classes=self.classes,
            hidden_size=self.hidden_size, num_layers=self.num_layers, seed=self.seed, plan_wait_s=1.0,
            data_wait_s=0.5, checkpoint_dir=checkpoint_dir, checkpoint_every=self.checkpoint_every, log_every=10,
            metrics=False)

    def trainer_sets(self, checkpoint_dir: Path) -> dict[str, object]:
        cfg = self.trainer_config(checkpoint_dir)
        keys = ("device", "backend", "torch_threads", "num_features", "num_classes", "hidden_size", "num_layers",
                "seed", "plan_wait_s", "data_wait_s", "checkpoint_every", "log_every", "metrics")
        return {f"trainer.{k}": getattr(cfg, k) for k in keys}

    def coordinator_sets(self, policy: str) -> dict[str, object]:
        sets: dict[str, object] = {
            "coordinator.devices": self.device_ids(), "coordinator.policy": self.planner,
            "coordinator.truncation": policy, "coordinator.delete_records": policy != "persist",
            "coordinator.delete_trained": policy != "persist",
            "coordinator.b_max": self.b_max, "coordinator.poll_interval_seconds": 0.5,
            "coordinator.plan_wait_seconds": 0.5, "coordinator.seed": self.seed,
        }
        if policy == "bounded":
            sets["coordinator.max_lag_samples"] = self.max_lag_samples
        return sets

    def heldout_samples(self) -> list[Any]:
        """Held-out samples of the same task and devices (another seed of the same streams)."""
        from producers.sources import SyntheticSource
        from streamtrain.wire import Sample

        sets = {k.removeprefix("producer."): v for k, v in self.producer_sets().items()}
        nested: dict[str, Any] = {}
        for key, value in sets.items():
            head, _, tail = key.partition(".")
            if tail:
                nested.setdefault(head, {})[tail] = value
            else:
                nested[key] = value
        nested["seed"] = self.seed + 10_007
        cfg = ProducerConfig.model_validate(nested)
        source = SyntheticSource(cfg, self.devices)
        per = max(1, self.heldout // self.devices)
        return [Sample.from_array(f"heldout-{d}", i, s.array, label=s.label)
                for d in range(self.devices) for i, s in enumerate(source.take(d, per))]


Progress = Callable[[str, int, int, int, int], None]
"""(policy, step, of steps, broker records retained, trainer buffer depth)."""


def _evaluate(setup: TruncationSetup, checkpoint_dir: Path) -> tuple[float | None, float | None]:
    """Held-out accuracy and loss of the trainers' final checkpoint (None when there is none)."""
    import torch

    from trainer.batching import collate_packed
    from trainer.checkpoint import load_checkpoint
    from trainer.plugins import build_model

    ckpt = load_checkpoint(checkpoint_dir)
    if ckpt is None:
        return None, None
    cfg = setup.trainer_config()
    model = build_model(cfg)
    model.load_state_dict(ckpt.model)
    model.eval()
    batch = collate_packed(setup.heldout_samples(), cfg)
    with torch.no_grad():
        logits = model(batch)
        loss = float(torch.nn.functional.cross_entropy(logits, batch.labels))
        accuracy = float((logits.argmax(1) == batch.labels).double().mean())
    return round(accuracy, 4), round(loss, 4)


def _run_policy(policy: str, broker: LiveBroker, setup: TruncationSetup, out: Path, global_args: Sequence[str],
                progress: Progress | None) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    kafka = broker.kafka.model_copy(update={"topic_prefix": f"{broker.kafka.topic_prefix}.{policy}"})
    job = f"trunc-{policy}"
    devices = setup.device_ids()
    ensure_device_topics(kafka, devices)
    run_dir = (setup.work_dir or out / "truncation-runs") / policy
    ckpt = run_dir / "checkpoints"
    if ckpt.exists():
        for stale in ckpt.iterdir():
            stale.unlink()
    services = Services(run_dir / "logs")
    common = {"job": job, "kafka.bootstrap_servers": kafka.bootstrap_servers, "kafka.topic_prefix": kafka.topic_prefix,
              "metrics.port": 0, "log_level": "INFO"}
    tail = FeedbackTail(kafka, job)
    probe = make_consumer(kafka, f"st-bench-truncation-probe-{policy}")
    series: dict[str, list[Any]] = {"t": [], "step": [], "retained_records": [], "produced_records": [],
                                    "buffer_depth": [], "loss": []}
    latest: dict[str, Any] = {}
    losses: list[tuple[int, float, int]] = []
    dropped = trained = 0
    try:
        services.start("coordinator", "coordinator", module_command(
            "coordinator", "coordinate", "--port", "0", global_args=global_args,
            sets={**common, **setup.coordinator_sets(policy)}))
        # The ranks obey a plan's truncation only when the policy they are told of could ask for it.
        services.start("trainers", "trainer", module_command(
            "trainer", *train_command(devices, ckpt), global_args=global_args,
            sets={**common, **setup.coordinator_sets(policy), **setup.trainer_sets(ckpt)}))

        def take_feedback() -> None:
            nonlocal dropped, trained
            for fb in tail.poll():
                latest[fb.device_id] = fb
                dropped += fb.dropped
                trained += fb.samples
                if fb.loss is not None and fb.samples:
                    losses.append((fb.step, float(fb.loss), fb.samples))

        deadline = time.monotonic() + setup.start_timeout_s
        while len(latest) < len(devices):  # every rank has stepped once: the trainers are up
            take_feedback()
            if dead := services.dead():
                raise RuntimeError(services.failure(dead[0]))
            if time.monotonic() > deadline:
                raise RuntimeError(f"{policy}: the trainers did not report a step within {setup.start_timeout_s:.0f} s")
            time.sleep(0.2)
        idle_step = max(fb.step for fb in latest.values())
        services.start("producers", "producer", module_command(
            "producers", "produce", "--no-progress", global_args=global_args, sets={**common, **setup.producer_sets()}))
        began = time.monotonic()
        deadline = began + setup.run_timeout_s
        final_marks: dict[str, tuple[int, int]] = {}
        step0: int | None = None  # steps count from the first one that trained a streamed sample
        while True:
            take_feedback()
            if step0 is None:
                step0 = min((s for s, _, n in losses if s > idle_step), default=None)
            marks = watermarks(probe, kafka, devices)
            final_marks = marks or final_marks
            step = 0 if step0 is None else max(fb.step for fb in latest.values()) + 1 - step0
            retained = sum(hi - lo for lo, hi in marks.values())
            depth = sum(fb.buffer_depth for fb in latest.values())
            recent = [fb.loss for fb in latest.values() if fb.loss is not None and fb.samples]
            series["t"].append(round(time.monotonic() - began, 2))
            series["step"].append(max(0, step))
            series["retained_records"].append(retained)
            series["produced_records"].append(sum(hi for _, hi in marks.values()))
            series["buffer_depth"].append(depth)
            series["loss"].append(round(float(np.mean(recent)), 4) if recent else None)
            if progress is not None:
                progress(policy, max(0, step), setup.steps, retained, depth)
            if step >= setup.steps:
                break
            if dead := services.dead():
                raise RuntimeError(services.failure(dead[0]))
            if time.monotonic() > deadline:
                raise RuntimeError(f"{policy}: {setup.steps} steps not reached within {setup.run_timeout_s:.0f} s "
                                   f"(at step {step})")
            time.sleep(setup.sample_every_s)
        seconds = time.monotonic() - began
        services.stop("producers", signal.SIGINT, 60.0)
        services.stop("trainers", signal.SIGTERM, 120.0)
        take_feedback()
        services.stop("coordinator", signal.SIGTERM, 30.0)
    finally:
        services.stop_all()
        tail.close()
        probe.close()
    accuracy, heldout_loss = _evaluate(setup, ckpt)
    tail_from = (idle_step + 1 if step0 is None else step0) + max(0, setup.steps - 10)
    tail_losses = [(loss, n) for s, loss, n in losses if s >= tail_from]
    final_loss = (sum(loss * n for loss, n in tail_losses) / sum(n for _, n in tail_losses)) if tail_losses else None
    retained_final = sum(hi - lo for lo, hi in final_marks.values())
    cell = {
        "policy": policy,
        "retained_records_final": retained_final,
        "retained_records_per_device": {d: hi - lo for d, (lo, hi) in sorted(final_marks.items())},
        "produced_records": sum(hi for _, hi in final_marks.values()),
        "deleted_records": sum(lo for lo, _ in final_marks.values()),
        "buffer_depth_final": sum(fb.buffer_depth for fb in latest.values()),
        "truncated": dropped,
        "trained_samples": trained,
        "final_loss": None if final_loss is None else round(final_loss, 4),
        "accuracy": accuracy,
        "heldout_loss": heldout_loss,
        "seconds": round(seconds, 1),
        "retained_records_max": max(series["retained_records"], default=0),
    }
    return cell, series


def run_truncation(cfg: StreamtrainConfig, setup: TruncationSetup, out: Path, external: bool = False,
                   global_args: Sequence[str] = (), progress: Progress | None = None) -> dict[str, Any]:
    """Run every policy of `setup`, write `out/truncation.json` and `out/truncation.png`, return the document."""
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    cells: list[dict[str, Any]] = []
    series: dict[str, dict[str, list[Any]]] = {}
    with live_broker(cfg, external, "truncation") as broker:
        for policy in setup.policies:
            cell, curve = _run_policy(policy, broker, setup, out, global_args, progress)
            cells.append(cell)
            series[policy] = curve
    persist = next((c for c in cells if c["policy"] == "persist"), None)
    for cell in cells:
        base = persist["retained_records_final"] if persist else None
        cell["retained_ratio_to_persist"] = (round(base / cell["retained_records_final"], 1)
                                             if base and cell["retained_records_final"] else None)
        cell["retained_slope_per_step_second_half"] = _second_half_slope(series[cell["policy"]])
    growth = persist["retained_slope_per_step_second_half"] if persist else None
    for cell in cells:
        # Flat: over the second half of the run the retained records grow at under 5% of persistence's rate
        # (persistence itself grows at the whole input rate minus nothing: it keeps every record).
        own = cell["retained_slope_per_step_second_half"]
        cell["flat"] = None if own is None or not growth or cell is persist else bool(own <= 0.05 * growth)
    doc: dict[str, Any] = {
        "steps": setup.steps,
        "cells": cells,
        "series": series,
        "setup": {**{k: v for k, v in asdict(setup).items() if k not in ("extra", "work_dir")}, **setup.extra,
                  "rates": setup.rates(), "embedded_broker": broker.embedded},
        "paper_ratio_range": list(PAPER_RATIO_RANGE),
        "seconds": round(time.monotonic() - began, 1),
    }
    text = _dumps(doc)
    (out / "truncation.json").write_text(text)
    doc = json.loads(text)  # what the file holds (tuples become lists)
    plot_truncation(doc, out / "truncation.png")
    return doc


def _second_half_slope(curve: dict[str, list[Any]]) -> float | None:
    """Least-squares slope of the records retained over steps, over the second half of the steps."""
    from .live import slope

    pts = [(s, r) for s, r in zip(curve["step"], curve["retained_records"], strict=True)]
    last = pts[-1][0] if pts else 0
    half = [(s, r) for s, r in pts if s >= last / 2]
    value = slope([float(s) for s, _ in half], [float(r) for _, r in half])
    return None if value is None else round(value, 2)


def _dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1) + "\n"


def plot_truncation(doc: dict[str, Any], png: Path) -> Path:
    """Records retained on the broker, trainer buffer depth and loss over steps, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    for policy, curve in doc["series"].items():
        steps = curve["step"]
        axes[0].plot(steps, [max(1, r) for r in curve["retained_records"]], label=policy)
        axes[1].plot(steps, curve["buffer_depth"], label=policy)
        pts = [(s, v) for s, v in zip(steps, curve["loss"], strict=True) if v is not None]
        axes[2].plot([p[0] for p in pts], [p[1] for p in pts], label=policy)
    axes[0].set_yscale("log")
    axes[0].set(xlabel="step", ylabel="records retained on the broker", title="broker log (all device topics)")
    axes[1].set(xlabel="step", ylabel="samples buffered", title="trainer buffers (all ranks)")
    axes[2].set(xlabel="step", ylabel="training loss (mean over ranks)", title="loss")
    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    setup = doc["setup"]
    fig.suptitle(f"{setup['devices']} devices at ScaDLES {setup['rate_preset']} rates "
                 f"({', '.join(f'{r:g}' for r in setup['rates'])} samples/s), b_max {setup['b_max']}", fontsize=9)
    return save_figure(fig, png)


def render_truncation(doc: dict[str, Any], ctx: Any) -> str:
    """The BENCHMARKS.md section: targets with the paper's figures, the cells, the plot."""
    from .registry import _X, _num, _table, _verdict

    png = plot_truncation(doc, ctx.plot_path("truncation.png"))
    setup, cells = doc["setup"], doc["cells"]
    by = {c["policy"]: c for c in cells}
    persist = by.get("persist")
    lo, hi = doc.get("paper_ratio_range", PAPER_RATIO_RANGE)
    rows = []
    for name in ("truncate", "bounded"):
        c = by.get(name)
        if c is None or persist is None:
            continue
        rows.append([f"`{name}` keeps retained records flat (second-half growth < 5% of `persist`'s); ratio to "
                     f"`persist` after {doc['steps']} steps",
                     f"{_num(c['retained_records_final'])} vs {_num(persist['retained_records_final'])} records = "
                     f"{_num(c['retained_ratio_to_persist'], 1)}{_X} (peak {_num(c['retained_records_max'])}; growth "
                     f"{_num(c.get('retained_slope_per_step_second_half'), 1)} vs "
                     f"{_num(persist.get('retained_slope_per_step_second_half'), 1)} records/step)",
                     f"ScaDLES Table IV: {lo:,}{_X}-{hi:,}{_X} after their (much longer) runs",
                     _verdict(c.get("flat"))])
    acc = {k: v.get("accuracy") for k, v in by.items()}
    if persist is not None and persist.get("accuracy") is not None:
        worst = min((v for k, v in acc.items() if k != "persist" and v is not None), default=None)
        rows.append(["accuracy under truncation within 2 points of persistence",
                     ", ".join(f"{k} {_num(v, 3)}" for k, v in acc.items()),
                     "ScaDLES: truncation reached the same 95% / 84% targets as persistence",
                     _verdict(None if worst is None else worst >= persist["accuracy"] - 0.02)])
    table = _table(["policy", "retained records", f"ratio persist{_X}/policy", "peak retained", "deleted",
                    "buffer depth", "truncated", "trained", "final loss", "held-out accuracy"],
                   [[c["policy"], c["retained_records_final"], _num(c["retained_ratio_to_persist"], 1),
                     c["retained_records_max"], c["deleted_records"], c["buffer_depth_final"], c["truncated"],
                     c["trained_samples"], _num(c["final_loss"], 3), _num(c["accuracy"], 3)] for c in cells])
    notes = []
    truncate = by.get("truncate")
    if persist is not None and truncate is not None:
        notes.append(
            f"Persistence retains every record produced (rate {_X} run time: {persist['seconds']:.0f} s for "
            f"{doc['steps']} steps here), truncation about one step's worth plus what arrives between two "
            "DeleteRecords rounds, so the ratio grows linearly with the length of the run; ScaDLES measured theirs "
            "after training to target accuracy (hours of streams), which is why its ratios are larger than ours "
            f"after {doc['steps']} steps. Truncation trained {_num(truncate['trained_samples'])} samples against "
            f"persistence's {_num(persist['trained_samples'])}: it keeps arrival rate {_X} the last step's "
            "cycle (the time between a rank's feedback records), and arrivals jitter around that rate, so a step "
            "sometimes drops a sample a longer one would have trained.")
    bounded = by.get("bounded")
    if bounded is not None:
        over = [d for d, n in bounded.get("retained_records_per_device", {}).items()
                if n > 2 * setup["max_lag_samples"]]
        if over:
            notes.append(
                f"`bounded` falls short on device(s) {', '.join(over)}: their trainers kept up with their streams, so "
                "the backlog never exceeded the bound and nothing was truncated there; the coordinator's "
                "DeleteRecords only removes truncated records (never past a truncate-before offset), so trained "
                "records stay on the broker as under persistence.")
    return "\n\n".join([
        f"Setup: {setup['devices']} devices, one gloo rank each, rates drawn from ScaDLES {setup['rate_preset']} "
        f"({', '.join(f'{r:g}' for r in setup['rates'])} samples/s, seed {setup['seed']}); planner "
        f"`{setup['planner']}` with at most {setup['b_max']} samples per device per step, so the streams outrun "
        f"training; `bounded` keeps at most {setup['max_lag_samples']} samples per device; DeleteRecords on for "
        f"`truncate` and `bounded`. N = {doc['steps']} steps per policy from the moment the producers start "
        f"(run time {doc['seconds']:.0f} s for all three).",
        _table(["target", "measured", "paper", "verdict"], rows),
        table,
        *notes,
        f"![truncation]({ctx.link(png)})",
    ])


# ---------------------------------------------------------------------------------------------
# CLI


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
    """Records retained under persist, truncate and bounded when ScaDLES S2 streams outrun training.

    For each policy, on the same seeds and data: producers at S2 rates, a coordinator with that
    truncation (DeleteRecords on for truncate and bounded) and one gloo rank per device, for N
    steps. Reports the records each device topic retains on the broker (high watermark - log start
    offset) and the trainer buffer depth over steps, the ratio persist/policy after N steps, and the
    held-out accuracy of the final model. Writes DIR/truncation.json and DIR/truncation.png; service
    logs go to WORK_DIR/truncation/<policy>/logs.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from streamtrain.cli_support import config_from, console, die

    from .cli import _root_options

    cfg = config_from(ctx)
    chosen = tuple(policy or POLICIES)
    unknown = sorted(set(chosen) - set(POLICIES))
    if unknown:
        die(f"--policy {', '.join(unknown)}: not a truncation policy (have: {', '.join(POLICIES)})", 2)
    setup = TruncationSetup(devices=devices or (2 if quick else 4), steps=steps or (100 if quick else 400),
                            seed=seed, b_max=b_max, max_lag_samples=max_lag_samples, planner=planner,
                            policies=chosen, work_dir=work_dir / "truncation", extra={"quick": quick})
    columns = (TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("broker retains {task.fields[retained]:>8,}  buffers {task.fields[depth]:>6,}"),
               TimeElapsedColumn())
    try:
        with Progress(*columns, console=console) as bar:
            tasks: dict[str, TaskID] = {p: bar.add_task(p, total=setup.steps, retained=0, depth=0, start=False)
                                        for p in chosen}

            def progress(name: str, step: int, total: int, retained: int, depth: int) -> None:
                bar.start_task(tasks[name])
                bar.update(tasks[name], completed=min(step, total), retained=retained, depth=depth)

            doc = run_truncation(cfg, setup, out, external, _root_options(ctx), progress)
    except RuntimeError as exc:
        die(str(exc))
    for cell in doc["cells"]:
        console.print(f"{cell['policy']:<9} retains {cell['retained_records_final']:>9,} records "
                      f"(ratio to persist {_ratio(cell['retained_ratio_to_persist'])}), buffer "
                      f"{cell['buffer_depth_final']:,}, truncated {cell['truncated']:,}, held-out accuracy "
                      f"{_ratio(cell['accuracy'])}", highlight=False)
    console.print(f"wrote {out / 'truncation.json'} and {out / 'truncation.png'} in {doc['seconds']:.0f} s",
                  highlight=False)


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"
