"""`bench truncation`, the run: each policy live on one broker — producers, a coordinator, one rank per device."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from streamtrain.config import StreamtrainConfig
from streamtrain.kafka import make_consumer
from streamtrain.wire import StepFeedback

from ..common import LaunchOptions
from ..live import FeedbackTail, LiveBroker, Services, ensure_device_topics, live_broker, train_command, watermarks
from .render import plot_truncation
from .results import PolicySeries, TraceSample, TruncationCell, TruncationResult, TruncationRunSetup, compare_to_persist
from .setup import TruncationSetup

__all__ = ["Progress", "run_truncation"]

logger = logging.getLogger(__name__)

Progress = Callable[[str, int, int, int, int], None]
"""(policy, step, of steps, broker records retained, trainer buffer depth)."""


def _evaluate(setup: TruncationSetup, checkpoint_dir: Path) -> tuple[float | None, float | None]:
    """Held-out accuracy and loss of the trainers' final checkpoint (None when there is none)."""
    import torch

    from streamtrain.models.batching import collate_packed
    from streamtrain.models.plugins import build_model
    from trainer.checkpoint import load_checkpoint

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


def _run_policy(policy: str, broker: LiveBroker, setup: TruncationSetup, out: Path, launch: LaunchOptions,
                progress: Progress | None) -> tuple[TruncationCell, PolicySeries]:
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
    trace: list[TraceSample] = []
    latest: dict[str, StepFeedback] = {}
    losses: list[tuple[int, float, int]] = []
    dropped = trained = 0
    try:
        services.start("coordinator", "coordinator", launch.command(
            "coordinator", "coordinate", "--port", "0", settings={**common, **setup.coordinator_sets(policy)}))
        # The ranks obey a plan's truncation only when the policy they are told of could ask for it.
        services.start("trainers", "trainer", launch.command(
            "trainer", *train_command(devices, ckpt),
            settings={**common, **setup.coordinator_sets(policy), **setup.trainer_sets(ckpt)}))

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
        services.start("producers", "producer", launch.command(
            "producers", "produce", "--no-progress", settings={**common, **setup.producer_sets()}))
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
            trace.append(TraceSample(round(time.monotonic() - began, 2), max(0, step), retained,
                                     sum(hi for _, hi in marks.values()), depth,
                                     round(float(np.mean(recent)), 4) if recent else None))
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
    cell = TruncationCell(
        policy=policy,
        retained_records_final=retained_final,
        retained_records_per_device={d: hi - lo for d, (lo, hi) in sorted(final_marks.items())},
        produced_records=sum(hi for _, hi in final_marks.values()),
        deleted_records=sum(lo for lo, _ in final_marks.values()),
        buffer_depth_final=sum(fb.buffer_depth for fb in latest.values()),
        truncated=dropped,
        trained_samples=trained,
        final_loss=None if final_loss is None else round(final_loss, 4),
        accuracy=accuracy,
        heldout_loss=heldout_loss,
        seconds=round(seconds, 1),
        retained_records_max=max((x.retained for x in trace), default=0),
    )
    return cell, PolicySeries.of(trace)


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
            cell, curve = _run_policy(policy, broker, setup, out, launch, progress)
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
