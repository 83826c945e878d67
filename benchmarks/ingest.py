"""`streamtrain bench ingest`: how well the producers keep to their rates, and how fast they go.

Measured in one run against one broker: (a) for each count of concurrent device streams and each
target rate, every device's achieved rate (acknowledged samples over a window after a warm-up);
(b) the producers' aggregate records/s with pacing off, next to Kafka's own producer performance
tool (`ProducerPerformance`, the engine of kafka-producer-perf-test.sh) at the same record size
and producer settings; (c) the trainer's input path on one core: consume -> Avro decode and
validation -> buffer -> pack into a batch, with the trainer's own `RankConsumer`, `SampleBuffer`
and `collate_packed`, for 1 KiB samples (target: >= 20,000 samples/s, so data never gates a step).
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from streamtrain.config import KafkaConfig, ProducerConfig
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin

from .common import TIMES, Bench, Record, RenderContext, Result, Target, num, pyplot, save_figure, table, targets_table
from .kafka import kafka_perf_tool

__all__ = ["BENCH", "IngestBench", "IngestResult", "RateCell", "TrainerPath", "render_ingest"]

logger = logging.getLogger(__name__)

#: The producers' own settings (`streamtrain.kafka.make_producer`), given to Kafka's tool for a fair match.
_PERF_SETTINGS = {"acks": "all", "enable.idempotence": "true", "linger.ms": "5", "compression.type": "lz4"}


class RateCell(Record):
    """Every device's achieved rate with `streams` concurrent streams at `target_rate` samples/s each."""

    streams: int
    target_rate: float
    window_s: float
    achieved_rates: list[float]
    failed: int
    """Records the producers could not deliver (-1: the producer did not report)."""


@dataclass(frozen=True)
class TrainerPath:
    """The trainer's consume -> decode -> collate rate on one core."""

    samples_per_s: float
    samples_per_cpu_s: float
    record_bytes: int
    samples: int
    batch: int
    payload_bytes: int


class IngestResult(Result):
    """What `ingest.json` holds."""

    record_bytes: int
    producer_records_per_s: float
    kafka_perf_tool_records_per_s: float | None = None
    producer_vs_kafka_tool: float | None = None
    trainer_samples_per_s: float | None = None
    trainer_samples_per_cpu_s: float | None = None
    trainer_record_bytes: int | None = None
    trainer_samples: int | None = None
    trainer_batch: int | None = None
    trainer_payload_bytes: int | None = None
    rate_cells: list[RateCell]
    window_s: float | None = None
    sample_size: int
    features: int


@dataclass
class IngestBench:
    """The ingest benchmark against the broker at `kafka`.

    Args:
        kafka: where the broker is; each measurement uses its own topic prefix under it.
        streams: counts of concurrent device streams.
        rates: target rates (samples/s per device).
        seconds: measuring window per cell.
        warmup_s: seconds run before each window (topic creation, producer id, first batches).
        size: sample size (rows of `features` float32) of every record.
        features: features per row.
        throughput_s: seconds of unpaced publishing for the aggregate throughput.
        libs: Kafka jars for the perf tool (None skips it).
        progress: called with a line of text after each measurement.
        trainer_samples: samples the trainer's input path is timed on.
        trainer_batch: samples per packed batch on that path.
    """

    kafka: KafkaConfig
    streams: Sequence[int] = (1, 4, 8, 16, 32)
    rates: Sequence[float] = (100.0, 600.0)
    seconds: float = 30.0
    warmup_s: float = 3.0
    size: int = 45
    features: int = 16
    throughput_s: float = 15.0
    libs: Path | None = None
    progress: Callable[[str], None] = logger.info
    trainer_samples: int = 50_000
    trainer_batch: int = 256

    def _producer_cfg(self, devices: int, rate: dict[str, Any], duration: float) -> ProducerConfig:
        return ProducerConfig.model_validate({
            "devices": devices, "duration_seconds": duration, "rate": rate, "metrics": False,
            "size": {"kind": "fixed", "mean": self.size}, "synthetic": {"features": self.features},
        })

    def _kafka(self, tag: str) -> KafkaConfig:
        prefix = f"{self.kafka.topic_prefix}.bench-{tag}-{int(time.time())}"
        return self.kafka.model_copy(update={"topic_prefix": prefix})

    def rate_cell(self, streams: int, rate: float) -> RateCell:
        """Each device's achieved rate over the window, for `streams` devices at `rate`."""
        from producers.service import StreamProducer

        cfg = self._producer_cfg(streams, {"kind": "constant", "mean": rate}, self.warmup_s + self.seconds + 1.0)
        producer = StreamProducer(self._kafka(f"s{streams}r{int(rate)}"), cfg)
        producer.ensure_topics()
        result: dict[str, Any] = {}
        worker = threading.Thread(target=lambda: result.setdefault("summary", producer.run()), daemon=True)
        worker.start()
        if not producer.wait_started():
            raise RuntimeError("the producer did not start within 60 s")
        time.sleep(self.warmup_s)
        first = producer.snapshot()
        time.sleep(self.seconds)
        last = producer.snapshot()
        worker.join()
        window = last.elapsed_s - first.elapsed_s
        achieved = (last.sent_own - first.sent_own) / window
        failed = int(result["summary"].final.failed.sum()) if "summary" in result else -1
        self.progress(f"{streams:>3} streams at {rate:g}/s: achieved min {achieved.min():.1f} "
                      f"median {np.median(achieved):.1f} max {achieved.max():.1f} (failed {failed})")
        return RateCell(streams=streams, target_rate=float(rate), window_s=round(window, 3),
                        achieved_rates=[round(float(a), 2) for a in achieved], failed=failed)

    def throughput(self, devices: int = 4) -> tuple[float, int]:
        """(records/s with pacing off, mean record value bytes)."""
        from producers.service import StreamProducer

        cfg = self._producer_cfg(devices, {"kind": "unlimited"}, self.throughput_s)
        producer = StreamProducer(self._kafka("max"), cfg)
        producer.ensure_topics()
        summary = producer.run()
        sent = int(summary.final.sent.sum())
        record_bytes = round(int(summary.final.bytes_sent.sum()) / max(sent, 1))
        rate = float(summary.mean_rates.sum())
        self.progress(f"producers, pacing off: {rate:,.0f} records/s of {record_bytes} bytes")
        return rate, record_bytes

    def trainer_rate(self) -> TrainerPath:
        """The trainer's consume -> decode -> collate rate on one core for 1 KiB samples.

        `trainer_samples` records of 16 frames x 16 float32 features (1 KiB payloads) are published
        first; then one `RankConsumer` reads them from the device topic the way a rank does (decode,
        validate, buffer) while batches of `trainer_batch` oldest samples are taken and packed by
        the default collate function. The clock runs from the first fetch to the last packed batch.
        """
        import torch

        from producers.service import StreamProducer

        torch.set_num_threads(1)
        frames, features = 16, 16  # 16 x 16 float32 = 1 KiB of payload per sample
        cfg = ProducerConfig.model_validate({
            "devices": 1, "duration_seconds": 600.0, "max_samples": self.trainer_samples, "rate": {"kind": "unlimited"},
            "metrics": False, "size": {"kind": "fixed", "mean": frames}, "synthetic": {"features": features},
        })
        kafka = self._kafka("trainer")
        producer = StreamProducer(kafka, cfg)
        producer.ensure_topics()
        summary = producer.run()
        n = int(summary.final.sent_own.sum())
        record_bytes = round(int(summary.final.bytes_sent.sum()) / max(n, 1))
        trained, elapsed, cpu = self._consume_and_pack(kafka, producer.ids[0], features, n)
        rate, cpu_rate = trained / elapsed, trained / max(cpu, 1e-9)
        self.progress(f"trainer consume -> decode -> collate, one core: {rate:,.0f} samples/s wall, {cpu_rate:,.0f} "
                      f"per CPU second, of {record_bytes} bytes (target >= 20,000; {trained} samples in batches of "
                      f"{self.trainer_batch})")
        return TrainerPath(round(rate, 1), round(cpu_rate, 1), record_bytes, trained, self.trainer_batch,
                           frames * features * 4)

    def _consume_and_pack(self, kafka: KafkaConfig, device: str, features: int, n: int) -> tuple[int, float, float]:
        """(samples packed, wall seconds from the first fetch, this thread's CPU seconds) of reading `n` records of
        `device` as a rank does and packing them in batches of `trainer_batch`.

        Raises:
            RuntimeError: not every record was packed within 300 s, or some were dead-lettered.
        """
        from streamtrain.config import TrainerConfig
        from streamtrain.kafka import make_producer
        from streamtrain.models.batching import collate_packed
        from trainer.consumer import RankConsumer
        from trainer.plans import PlanBook

        trainer = TrainerConfig(num_features=features, device="cpu", torch_threads=1)
        ensure_topics(make_admin(kafka), [TopicSpec.from_config(kafka, kafka.topics.assignments),
                                          TopicSpec.from_config(kafka, kafka.topics.dead_letter)])
        dead_letters = make_producer(kafka)
        consumer = RankConsumer(kafka, trainer, device, "bench-trainer", PlanBook("bench"), dead_letters)
        try:
            consumer.start(0)
            buffer = consumer.buffer
            trained = 0
            first_fetch: float | None = None
            cpu_start = time.thread_time()  # this thread's CPU: decode, validate, buffer, pack
            deadline = time.monotonic() + 300
            while trained < n and time.monotonic() < deadline:
                if consumer.poll(0.05, max_records=self.trainer_batch * 4) and first_fetch is None:
                    first_fetch = time.perf_counter()
                while len(buffer) >= self.trainer_batch or (len(buffer) and buffer.position >= n):
                    batch = collate_packed(buffer.take(buffer.select_oldest(self.trainer_batch)), trainer)
                    buffer.complete_step()
                    trained += batch.num_samples
            elapsed = time.perf_counter() - (first_fetch or time.perf_counter())
            cpu = time.thread_time() - cpu_start
        finally:
            consumer.close()
            dead_letters.flush(10)
        if trained < n or consumer.dead_lettered:
            raise RuntimeError(f"the trainer path packed {trained} of {n} samples ({consumer.dead_lettered} "
                               "dead-lettered) within 300 s")
        return trained, elapsed, cpu

    def run(self) -> IngestResult:
        """Every measurement, as the `ingest.json` document."""
        cells = [self.rate_cell(s, r) for r in self.rates for s in self.streams]
        records_per_s, record_bytes = self.throughput()
        perf: float | None = None
        if self.libs is not None:
            topic = f"{self._kafka('perf').topic_prefix}.perf"
            ensure_topics(make_admin(self.kafka), [TopicSpec.from_config(self.kafka, topic)])
            perf = kafka_perf_tool(self.kafka.bootstrap_servers, topic,
                                   max(10_000, int(records_per_s * self.throughput_s)), record_bytes,
                                   settings=_PERF_SETTINGS, libs=self.libs)
            self.progress(f"kafka perf tool: {perf:,.0f} records/s of {record_bytes} bytes")
        trainer = self.trainer_rate()
        return IngestResult(
            record_bytes=record_bytes, producer_records_per_s=round(records_per_s, 1),
            kafka_perf_tool_records_per_s=perf,
            producer_vs_kafka_tool=round(records_per_s / perf, 3) if perf else None,
            trainer_samples_per_s=trainer.samples_per_s, trainer_samples_per_cpu_s=trainer.samples_per_cpu_s,
            trainer_record_bytes=trainer.record_bytes, trainer_samples=trainer.samples,
            trainer_batch=trainer.batch, trainer_payload_bytes=trainer.payload_bytes,
            rate_cells=cells, window_s=self.seconds, sample_size=self.size, features=self.features)


def _numbers(text: str, flag: str, kind: Callable[[str], float]) -> list[Any]:
    try:
        return [kind(v) for v in text.split(",")]
    except ValueError:
        raise typer.BadParameter(f"{text!r}: expected comma-separated numbers", param_hint=flag) from None


def ingest_command(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="Directory for ingest.json.")],
    seconds: Annotated[float, typer.Option(help="Measuring window per cell.")] = 30.0,
    streams: Annotated[str, typer.Option(help="Comma-separated stream counts.")] = "1,4,8,16,32",
    rates: Annotated[str, typer.Option(help="Comma-separated rates, samples/s per device.")] = "100,600",
    external: Annotated[
        bool, typer.Option(help="Use the configured Kafka instead of a private embedded broker.")
    ] = False,
    trainer_samples: Annotated[
        int, typer.Option(help="1 KiB samples the trainer's consume -> decode -> collate rate is measured on.", min=1)
    ] = 50_000,
) -> None:
    """Achieved per-device rates for 1-32 streams at 100 and 600 samples/s, throughput vs Kafka's perf tool,
    and the trainer's consume -> decode -> collate rate on one core for 1 KiB samples (target >= 20,000/s)."""
    from streamtrain.broker import EmbeddedBroker, find_kafka_libs
    from streamtrain.cli_support import config_from, console

    cfg = config_from(ctx)
    stream_counts = _numbers(streams, "--streams", int)
    rate_values = _numbers(rates, "--rates", float)
    libs = find_kafka_libs(cfg.broker.libs_dir)
    broker = None
    kafka = cfg.kafka
    with tempfile.TemporaryDirectory(prefix="st-ingest-") as tmp:
        if not external:
            broker = EmbeddedBroker(cfg.broker.model_copy(update={"data_dir": Path(tmp) / "kafka", "port": 0,
                                                                   "controller_port": 0, "heap": "1g"}))
            kafka = kafka.model_copy(update={"bootstrap_servers": broker.start()})
        try:
            bench = IngestBench(kafka, stream_counts, rate_values, seconds, libs=libs, progress=console.print,
                                trainer_samples=trainer_samples)
            result = bench.run()
        finally:
            if broker is not None:
                broker.stop()
    out.mkdir(parents=True, exist_ok=True)
    result.write(out / "ingest.json")
    console.print(f"wrote {out / 'ingest.json'}")


def _plot_rates(cells: Sequence[RateCell], path: Path) -> Path:
    """Every device's achieved/target rate per stream count: median with min-max bars, one line per rate."""
    fig, ax = pyplot().subplots(figsize=(6, 3))
    for target in sorted({c.target_rate for c in cells}):
        line = sorted((c for c in cells if c.target_rate == target), key=lambda c: c.streams)
        shares = [np.asarray(c.achieved_rates, float) / target for c in line]
        med = [float(np.median(r)) for r in shares]
        err = [[m - float(r.min()) for m, r in zip(med, shares, strict=True)],
               [float(r.max()) - m for m, r in zip(med, shares, strict=True)]]
        ax.errorbar([c.streams for c in line], med, yerr=err, marker="o", capsize=3,
                    label=f"{target:g} samples/s per device")
    ax.axhspan(0.95, 1.05, color="green", alpha=0.1, label="±5% target")
    ax.set_xscale("log", base=2)
    counts = sorted({c.streams for c in cells})
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.set(xlabel="concurrent device streams", ylabel="achieved / target rate",
           title="every device's achieved rate: median, min-max bars", ylim=(0.9, 1.1))
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def render_ingest(result: IngestResult, ctx: RenderContext) -> str:
    """The `ingest` section of BENCHMARKS.md: targets, every cell, the plot."""
    rows, worst = [], {}
    for cell in result.rate_cells:
        rates = np.asarray(cell.achieved_rates, dtype=float)
        dev = float(np.max(np.abs(rates / cell.target_rate - 1.0))) if len(rates) else float("nan")
        worst[(cell.streams, cell.target_rate)] = dev
        rows.append([cell.streams, cell.target_rate, float(rates.min()), float(np.median(rates)), float(rates.max()),
                     f"{dev * 100:.1f}%"])
    png = _plot_rates(result.rate_cells, ctx.plot_path("ingest.png"))
    at_32_600 = worst.get((32, 600.0))
    ratio = result.producer_vs_kafka_tool
    per_cpu = result.trainer_samples_per_cpu_s
    targets = targets_table([
        Target("32 streams at 600 samples/s, every device within ±5%",
               "not measured" if at_32_600 is None else f"worst device off by {at_32_600 * 100:.1f}%",
               None if at_32_600 is None else at_32_600 <= 0.05,
               "ScaDLES Fig. 6: 100/s held for 1-32 streams; 600/s sagged beyond 16 streams"),
        Target(f"unpaced producers ≥ 0.5{TIMES} Kafka's perf tool",
               "—" if ratio is None else f"{result.producer_records_per_s:,.0f} vs "
               f"{result.kafka_perf_tool_records_per_s:,.0f} records/s = {ratio:.2f}{TIMES}",
               None if ratio is None else ratio >= 0.5, "not reported"),
        Target("trainer consume → decode → collate ≥ 20,000 samples/s on one core (judged per CPU second of its "
               "thread)", "not measured" if per_cpu is None else f"{per_cpu:,.0f} per CPU second "
               f"({num(result.trainer_samples_per_s, 0)} samples/s wall), {result.trainer_record_bytes or 0:,}-byte "
               "records", None if per_cpu is None else per_cpu >= 20_000, "not reported"),
    ])
    return "\n\n".join([
        f"Record size {result.record_bytes:,} bytes, window {'?' if result.window_s is None else result.window_s} s "
        "per cell.",
        targets,
        table(["streams", "target/s", "min", "median", "max", "worst deviation"], rows),
        f"![ingest]({ctx.link(png)})",
    ])


BENCH = Bench("ingest", ingest_command, IngestResult, render_ingest, args=("--seconds", "10"),
              quick_args=("--seconds", "5", "--streams", "1,8,32"), timeout_s=900, about=__doc__ or "")
