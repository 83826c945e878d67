"""`streamtrain bench ingest`: how well the producers keep to their rates, and how fast they go (docs/benchmarks)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from streamtrain.config import KafkaConfig, ProducerConfig, TrainerConfig
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin, make_producer
from streamtrain.results import Record

from .common import TIMES, Bench, External, Out, Result, Target, publish, pyplot, table, targets_table
from .kafka import kafka_perf_tool
from .live import live_broker

__all__ = ["BENCH", "IngestResult", "RateCell"]

#: The producers' own settings (`streamtrain.kafka.make_producer`), given to Kafka's tool for a fair match.
_PERF_SETTINGS = {"acks": "all", "enable.idempotence": "true", "linger.ms": "5", "compression.type": "lz4"}
#: Samples per packed batch on the trainer's input path, and its samples' frames x features (16 x 16 float32: 1 KiB).
_BATCH, _FRAMES, _FEATURES = 256, 16, 16


class RateCell(Record):
    """Every device's achieved rate with `streams` concurrent streams at `target_rate` samples/s each."""

    streams: int
    target_rate: float
    achieved_rates: list[float]

    def worst(self) -> float:
        """The largest deviation of any device from the target rate, as a fraction of it."""
        return float(np.max(np.abs(np.asarray(self.achieved_rates) / self.target_rate - 1.0)))


class IngestResult(Result):
    """What `ingest.json` holds."""

    record_bytes: int
    window_s: float
    producer_records_per_s: float
    kafka_perf_tool_records_per_s: float
    trainer_samples_per_s: float
    trainer_samples_per_cpu_s: float
    trainer_record_bytes: int
    rate_cells: list[RateCell]


def _producers(kafka: KafkaConfig, tag: str, devices: int, rate: dict[str, Any], seconds: float, **more: Any) -> Any:
    """A `StreamProducer` of `devices` fixed-size synthetic streams at `rate`, on its own topics (created)."""
    from producers.service import StreamProducer

    cfg = ProducerConfig.model_validate({"devices": devices, "duration_seconds": seconds, "rate": rate,
                                         "metrics": False, "size": {"kind": "fixed", "mean": more.pop("size", 45)},
                                         "synthetic": {"features": more.pop("features", 16)}, **more})
    producer = StreamProducer(kafka.model_copy(update={"topic_prefix": f"{kafka.topic_prefix}.{tag}"}), cfg)
    producer.ensure_topics()
    return producer


def rate_cell(kafka: KafkaConfig, streams: int, rate: float, seconds: float, warmup_s: float = 3.0) -> RateCell:
    """Each device's achieved rate over `seconds` after `warmup_s`, for `streams` devices at `rate`."""
    producer = _producers(kafka, f"s{streams}r{int(rate)}", streams, {"kind": "constant", "mean": rate},
                          warmup_s + seconds + 1.0)
    worker = threading.Thread(target=producer.run, daemon=True)
    worker.start()
    if not producer.wait_started():
        raise RuntimeError("the producer did not start within 60 s")
    time.sleep(warmup_s)
    first = producer.snapshot()
    time.sleep(seconds)
    last = producer.snapshot()
    worker.join()
    achieved = (last.sent_own - first.sent_own) / (last.elapsed_s - first.elapsed_s)
    return RateCell(streams=streams, target_rate=float(rate), achieved_rates=[round(float(a), 2) for a in achieved])


def trainer_rate(kafka: KafkaConfig, samples: int) -> tuple[float, float, int]:
    """(samples/s from the first fetch, samples per CPU second, record bytes) of `samples` 1 KiB records read as a
    rank does (`RankConsumer`), packed `_BATCH` at a time; RuntimeError unless all are packed in 300 s, none lost."""
    import torch

    from streamtrain.models.batching import collate_packed
    from trainer.consumer import RankConsumer
    from trainer.plans import PlanBook

    torch.set_num_threads(1)
    producer = _producers(kafka, "trainer", 1, {"kind": "unlimited"}, 600.0, max_samples=samples, size=_FRAMES,
                          features=_FEATURES)
    summary = producer.run()
    n = int(summary.final.sent_own.sum())
    trainer = TrainerConfig(num_features=_FEATURES, device="cpu", torch_threads=1)
    kafka = producer.kafka
    ensure_topics(make_admin(kafka), [TopicSpec.from_config(kafka, t) for t in (kafka.topics.assignments,
                                                                                 kafka.topics.dead_letter)])
    dead_letters = make_producer(kafka)
    consumer = RankConsumer(kafka, trainer, producer.ids[0], "bench-trainer", PlanBook("bench"), dead_letters)
    trained, first_fetch = 0, None
    try:
        consumer.start(0)
        buffer = consumer.buffer
        cpu_start, deadline = time.thread_time(), time.monotonic() + 300  # this thread: decode, validate, pack
        while trained < n and time.monotonic() < deadline:
            if consumer.poll(0.05, max_records=_BATCH * 4) and first_fetch is None:
                first_fetch = time.perf_counter()
            while len(buffer) >= _BATCH or (len(buffer) and buffer.position >= n):
                trained += collate_packed(buffer.take(buffer.select_oldest(_BATCH)), trainer).num_samples
                buffer.complete_step()
        elapsed, cpu = time.perf_counter() - (first_fetch or time.perf_counter()), time.thread_time() - cpu_start
    finally:
        consumer.close()
        dead_letters.flush(10)
    if trained < n or consumer.dead_lettered:
        raise RuntimeError(f"the trainer path packed {trained} of {n} samples ({consumer.dead_lettered} "
                           "dead-lettered) within 300 s")
    return trained / elapsed, trained / max(cpu, 1e-9), round(int(summary.final.bytes_sent.sum()) / max(n, 1))


def _numbers(text: str, flag: str, kind: Callable[[str], float]) -> list[Any]:
    try:
        return [kind(v) for v in text.split(",")]
    except ValueError:
        raise typer.BadParameter(f"{text!r}: expected comma-separated numbers", param_hint=flag) from None


def ingest_command(
    ctx: typer.Context,
    out: Out = Path("reports/bench"),
    seconds: Annotated[float, typer.Option(help="Measuring window per cell.")] = 30.0,
    streams: Annotated[str, typer.Option(help="Comma-separated stream counts.")] = "1,4,8,16,32",
    rates: Annotated[str, typer.Option(help="Comma-separated rates, samples/s per device.")] = "100,600",
    external: External = False,
    trainer_samples: Annotated[int, typer.Option(min=1, help="1 KiB samples of the trainer's input path.")] = 50_000,
) -> None:
    """Achieved per-device rates at each stream count and rate, throughput vs Kafka's perf tool, and the trainer's
    consume -> decode -> collate rate on one core (target >= 20,000 samples/s)."""
    from streamtrain.broker import find_kafka_libs
    from streamtrain.cli_support import config_from, console

    cfg = config_from(ctx)
    counts, targets = _numbers(streams, "--streams", int), _numbers(rates, "--rates", float)
    cells = []
    with live_broker(cfg, external, "ingest", heap="1g") as broker:
        kafka = broker.kafka
        for rate in targets:
            for count in counts:
                cells.append(rate_cell(kafka, count, rate, seconds))
                console.print(f"{count:>3} streams at {rate:g}/s: worst device off by {cells[-1].worst():.1%}")
        unpaced = _producers(kafka, "max", 4, {"kind": "unlimited"}, 15.0).run()
        records_per_s = float(unpaced.mean_rates.sum())
        record_bytes = round(int(unpaced.final.bytes_sent.sum()) / max(int(unpaced.final.sent.sum()), 1))
        topic = f"{kafka.topic_prefix}.perf"
        ensure_topics(make_admin(kafka), [TopicSpec.from_config(kafka, topic)])
        perf = kafka_perf_tool(kafka.bootstrap_servers, topic, max(10_000, int(records_per_s * 15.0)), record_bytes,
                               settings=_PERF_SETTINGS, libs=find_kafka_libs(cfg.broker.libs_dir))
        wall, per_cpu, trainer_bytes = trainer_rate(kafka, trainer_samples)
    publish(BENCH, IngestResult(record_bytes=record_bytes, window_s=seconds, kafka_perf_tool_records_per_s=perf,
                                producer_records_per_s=round(records_per_s, 1), trainer_samples_per_s=round(wall, 1),
                                trainer_samples_per_cpu_s=round(per_cpu, 1), trainer_record_bytes=trainer_bytes,
                                rate_cells=cells), out)


def plot_ingest(result: IngestResult) -> Any:
    """Every device's achieved/target rate per stream count: median with min-max bars, one line per rate."""
    cells = result.rate_cells
    fig, ax = pyplot().subplots(figsize=(6, 3))
    for target in sorted({c.target_rate for c in cells}):
        line = sorted((c for c in cells if c.target_rate == target), key=lambda c: c.streams)
        low, mid, high = np.array([np.percentile(c.achieved_rates, [0, 50, 100]) / target for c in line]).T
        ax.errorbar([c.streams for c in line], mid, yerr=[mid - low, high - mid], marker="o", capsize=3,
                    label=f"{target:g} samples/s per device")
    ax.axhspan(0.95, 1.05, color="green", alpha=0.1, label="±5% target")
    ax.set_xscale("log", base=2)
    counts = sorted({c.streams for c in cells})
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.set(xlabel="concurrent device streams", ylabel="achieved / target rate",
           title="every device's achieved rate: median, min-max bars", ylim=(0.9, 1.1))
    ax.legend(fontsize=8)
    return fig


def ingest_targets(result: IngestResult) -> list[Target]:
    """Rates held at 32 streams x 600/s, the producers against Kafka's tool, the trainer's input path."""
    at = next((c.worst() for c in result.rate_cells if (c.streams, c.target_rate) == (32, 600.0)), None)
    perf, per_cpu = result.kafka_perf_tool_records_per_s, result.trainer_samples_per_cpu_s
    ratio = result.producer_records_per_s / perf
    return [
        Target("32 streams at 600 samples/s, every device within ±5%",
               "not measured" if at is None else f"worst device off by {at * 100:.1f}%", None if at is None
               else at <= 0.05, "ScaDLES Fig. 6: 100/s held for 1-32 streams; 600/s sagged beyond 16 streams"),
        Target(f"unpaced producers ≥ 0.5{TIMES} Kafka's perf tool",
               f"{result.producer_records_per_s:,.0f} vs {perf:,.0f} records/s = {ratio:.2f}{TIMES}", ratio >= 0.5,
               "not reported"),
        Target("trainer consume → decode → collate ≥ 20,000 samples/s on one core (judged per CPU second of its "
               "thread)", f"{per_cpu:,.0f} per CPU second ({result.trainer_samples_per_s:,.0f} samples/s wall), "
               f"{result.trainer_record_bytes:,}-byte records", per_cpu >= 20_000, "not reported"),
    ]


def render_ingest(result: IngestResult) -> str:
    """The `ingest` section of BENCHMARKS.md: targets, every cell."""
    rows = [[c.streams, c.target_rate, min(c.achieved_rates), float(np.median(c.achieved_rates)),
             max(c.achieved_rates), f"{c.worst() * 100:.1f}%"] for c in result.rate_cells]
    return "\n\n".join([f"Record size {result.record_bytes:,} bytes, window {result.window_s} s per cell.",
                        targets_table(ingest_targets(result)),
                        table(["streams", "target/s", "min", "median", "max", "worst deviation"], rows)])


BENCH = Bench("ingest", ingest_command, IngestResult, render_ingest, ingest_targets, plot_ingest,
              args=("--seconds", "10"), quick_args=("--seconds", "5", "--streams", "1,8,32"), timeout_s=900)
