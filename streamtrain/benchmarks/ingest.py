"""`streamtrain bench ingest`: everything on the way in — how well the producers keep to their rates, what publishing
costs against the Kafka client and Kafka's own tool, and the trainer's input path (docs/benchmarks)."""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from confluent_kafka import KafkaError, Message, Producer
from pydantic import Field

from streamtrain.broker import find_kafka_libs
from streamtrain.config import KafkaConfig, ProducerConfig, TrainerConfig
from streamtrain.kafka import (
    TopicSpec,
    ensure_topics,
    java_client_properties,
    make_admin,
    make_producer,
    produce,
    producer_settings,
)
from streamtrain.publish import DeviceProducer, encode_device_sample
from streamtrain.report.record import Record
from streamtrain.wire import Sample, encode

from .common import TIMES, Bench, External, Out, Result, Target, interleaved, publish, pyplot, table, targets_table
from .live import live_broker

__all__ = ["BENCH", "IngestResult", "RateCell", "kafka_perf_tool", "perf_settings"]

_PERF_LINE = re.compile(r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\)")
#: The producers compared, in the order they run (reversed every other repeat) and are shown.
_PRODUCERS = {"kafka_perf_tool": "`kafka-producer-perf-test` (same jars, same settings)",
              "bare_loop": "confluent-kafka `produce` loop, `Sample`s encoded beforehand",
              "device_producer": "`DeviceProducer.send` of the same samples",
              "replay_producers": "`streamtrain produce`: 4 synthetic streams, unpaced"}
#: The producers' samples: 45 frames x 16 float32 (~2.9 kB records), from a pool of payloads, one device and time.
_FRAMES, _FEATURES, _POOL, _DEVICE, _PRODUCED_AT = 45, 16, 64, "bench", 1_700_000_000_000
#: Samples per packed batch on the trainer's input path, and its samples' frames (x 16 float32: 1 KiB).
_BATCH, _TRAINER_FRAMES = 256, 16


class RateCell(Record):
    """Every device's achieved rate with `streams` concurrent streams at `target_rate` samples/s each."""

    streams: int
    target_rate: float
    achieved_rates: list[float]

    def worst(self) -> float:
        """The largest deviation of any device from the target rate, as a fraction of it."""
        return float(np.max(np.abs(np.asarray(self.achieved_rates) / self.target_rate - 1.0)))


class IngestResult(Result):
    """What `ingest.json` holds: the rate cells, each producer's records/s in each repeat, the trainer's input path."""

    record_bytes: int
    window_s: float
    rate_cells: list[RateCell]
    records_per_run: int
    repeats: int
    records_per_s: dict[str, list[float]]
    trainer_samples_per_s: float
    trainer_samples_per_cpu_s: float
    trainer_record_bytes: int
    sender_cpu_us: dict[str, list[float]] = Field(default_factory=dict)
    """CPU microseconds per record of the sending thread (its Python, the client's `produce` and `poll` calls, the
    delivery callbacks it serves; not librdkafka's own threads), for the bare loop and `DeviceProducer`, each repeat:
    what `DeviceProducer` adds per record, measured apart from a shared machine's wall-clock noise."""

    def medians(self) -> dict[str, float]:
        return {k: statistics.median(v) for k, v in self.records_per_s.items()}

    def ratio(self, kind: str, over: str) -> float | None:
        """`kind`'s records/s over `over`'s: the median of the repeats' ratios (they ran back to back)."""
        a, b = self.records_per_s.get(kind), self.records_per_s.get(over)
        return statistics.median(x / y for x, y in zip(a, b, strict=True)) if a and b else None


def _producers(kafka: KafkaConfig, tag: str, devices: int, rate: dict[str, Any], seconds: float, **more: Any) -> Any:
    """A `StreamProducer` of `devices` fixed-size synthetic streams at `rate`, on its own topics (created)."""
    from streamtrain.producers.service import StreamProducer

    cfg = ProducerConfig.model_validate({"devices": devices, "duration_seconds": seconds, "rate": rate,
                                         "metrics": False, "size": {"kind": "fixed", "mean": more.pop("size", _FRAMES)},
                                         "synthetic": {"features": _FEATURES}, **more})
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


def _bare_loop(cfg: KafkaConfig, records: list[tuple[bytes, Any]]) -> tuple[float, float]:
    """confluent-kafka's own pattern (`streamtrain.kafka.produce`: poll(0), wait when full) with a delivery report:
    (records/s, the sending thread's CPU microseconds per record)."""
    producer = Producer(producer_settings(cfg))
    failed = 0

    def report(err: KafkaError | None, _msg: Message) -> None:
        nonlocal failed
        failed += err is not None

    began, cpu = time.perf_counter(), time.thread_time()
    for value, headers in records:
        produce(producer, cfg.topics.device(_DEVICE), value, headers=headers, on_delivery=report)
    if producer.flush(120) != 0 or failed:
        raise RuntimeError("the bare produce loop could not deliver every record")
    return _per_record(len(records), began, cpu)


def _per_record(records: int, began: float, cpu: float) -> tuple[float, float]:
    """(records/s, CPU microseconds per record of this thread) since `perf_counter()` was `began`, `thread_time()`
    was `cpu`."""
    wall, cpu = time.perf_counter() - began, time.thread_time() - cpu
    return records / wall, round(cpu / records * 1e6, 3)


def _device_producer(cfg: KafkaConfig, records: int, payloads: list[np.ndarray]) -> tuple[float, float]:
    """`DeviceProducer.send` of the same samples, checked, numbered and encoded on the way: as `_bare_loop`."""
    producer = DeviceProducer(cfg, device=_DEVICE)
    began, cpu = time.perf_counter(), time.thread_time()
    for i in range(records):
        producer.send(payloads[i % _POOL], label=i % 10, produced_at=_PRODUCED_AT)
    producer.close(120)  # raises DeliveryError unless every record was delivered
    return _per_record(records, began, cpu)


def _replay_producers(kafka: KafkaConfig, tag: str, records: int) -> float:
    """`streamtrain produce`'s producer: 4 synthetic streams of `records // 4` samples each, unpaced, timed like the
    others (from opening its client to the last acknowledgement; its own rates leave out the final flush)."""
    producer = _producers(kafka, tag, 4, {"kind": "unlimited"}, 600.0, max_samples=records // 4)
    began = time.perf_counter()
    acknowledged = int(producer.run().final.sent_own.sum())
    if acknowledged < 4 * (records // 4):
        raise RuntimeError(f"the replay producers had {acknowledged} of {4 * (records // 4)} samples acknowledged")
    return acknowledged / (time.perf_counter() - began)


def perf_settings(cfg: KafkaConfig) -> dict[str, str]:
    """The Python producers' own settings (`streamtrain.kafka.producer_settings`) that Kafka's Java producer reads
    alike, and librdkafka's batch size (1 MB, where Java's default is 16 KB), so that Kafka's tool is a fair match."""
    ours = producer_settings(cfg)
    return {key: str(ours[key]).lower() for key in ("acks", "enable.idempotence", "linger.ms", "compression.type")
            } | {"batch.size": "1000000"}


def kafka_perf_tool(cfg: KafkaConfig, topic: str, records: int, record_size: int, libs: Path | None = None) -> float:
    """Records/s of Kafka's `kafka-producer-perf-test` sending `records` of `record_size` bytes unpaced to `topic` on
    `cfg`'s Kafka (its security settings too, in a file only this user reads), with `perf_settings`; RuntimeError with
    its output when Java or the tool fails."""
    with tempfile.NamedTemporaryFile("w", prefix="st-perf-", suffix=".properties") as props:  # mode 0600
        props.writelines(f"{k}={v}\n" for k, v in (java_client_properties(cfg) | perf_settings(cfg)).items())
        props.flush()
        cmd = [shutil.which("java") or "java", "-Xmx512m", "-cp", f"{libs or find_kafka_libs()}/*",
               "org.apache.kafka.tools.ProducerPerformance", "--topic", topic, "--num-records", str(records),
               "--record-size", str(record_size), "--throughput", "-1", "--producer.config", props.name]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeError(f"kafka perf tool did not run: {exc}") from None
    match = _PERF_LINE.findall(done.stdout)
    if done.returncode != 0 or not match:
        raise RuntimeError(f"kafka perf tool failed ({done.returncode}): {(done.stderr or done.stdout)[-2000:]}")
    return float(match[-1][1])


def producer_rates(kafka: KafkaConfig, records: int, repeats: int,
                   libs: Path) -> tuple[dict[str, list[float]], int, dict[str, list[float]]]:
    """Each of `_PRODUCERS` sending `records` of the same samples to fresh topics, `repeats` times alternating;
    (records/s of each in each repeat, the record's bytes, the sending thread's CPU microseconds per record of the
    bare loop and `DeviceProducer` in each repeat)."""
    from streamtrain.runtime.commands import console

    rng = np.random.default_rng(0)
    payloads = [rng.standard_normal((_FRAMES, _FEATURES)).astype(np.float32) for _ in range(_POOL)]
    with console.status(f"encoding {records:,} records for the bare loop ..."):
        encoded = [encode(Sample.from_array(_DEVICE, i, payloads[i % _POOL], label=i % 10, produced_at=_PRODUCED_AT))
                   for i in range(records)]
    if encode_device_sample(_DEVICE, 0, payloads[0], label=0, produced_at=_PRODUCED_AT).value != encoded[0][0]:
        raise RuntimeError("DeviceProducer would not write the bare loop's records: the comparison would be unfair")

    admin, size = make_admin(kafka), len(encoded[0][0])
    cpu: dict[str, list[float]] = {"bare_loop": [], "device_producer": []}

    def measure(kind: str, r: int) -> float:
        with console.status(f"run {r + 1}/{repeats}: {kind} ..."):
            if kind == "replay_producers":  # four streams, on topics of their own they create
                rate = _replay_producers(kafka, f"replay-{r}", records)
            else:
                run = kafka.model_copy(update={"topic_prefix": f"{kafka.topic_prefix}.{kind}-{r}".replace("_", "-")})
                topic = run.topics.device(_DEVICE)
                ensure_topics(admin, [TopicSpec.from_config(kafka, topic)])
                if kind in cpu:
                    rate, per_record = (_bare_loop(run, encoded) if kind == "bare_loop" else
                                        _device_producer(run, records, payloads))
                    cpu[kind].append(per_record)
                else:
                    rate = kafka_perf_tool(run, topic, records, size, libs)
        console.print(f"  {kind:<16} {rate:>10,.0f} records/s")
        return rate

    return interleaved(list(_PRODUCERS), repeats, measure), size, cpu


def trainer_rate(kafka: KafkaConfig, samples: int) -> tuple[float, float, int]:
    """(samples/s from the first fetch, samples per CPU second, record bytes) of `samples` 1 KiB records read as a
    rank does (`RankConsumer`), packed `_BATCH` at a time; RuntimeError unless all are packed in 300 s, none lost."""
    import torch

    from streamtrain.models.batching import collate_packed
    from streamtrain.trainer.consumer import RankConsumer
    from streamtrain.trainer.plans import PlanBook

    torch.set_num_threads(1)
    producer = _producers(kafka, "trainer", 1, {"kind": "unlimited"}, 600.0, max_samples=samples,
                          size=_TRAINER_FRAMES)
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
    seconds: Annotated[float, typer.Option(help="Measuring window per rate cell.")] = 30.0,
    streams: Annotated[str, typer.Option(help="Comma-separated stream counts.")] = "1,4,8,16,32",
    rates: Annotated[str, typer.Option(help="Comma-separated rates, samples/s per device.")] = "100,600",
    records: Annotated[int, typer.Option(min=1000, help="Records per producer run (2.9 kB each).")] = 100_000,
    repeats: Annotated[int, typer.Option(min=1, max=20, help="Alternating runs of each producer.")] = 3,
    external: External = False,
    trainer_samples: Annotated[int, typer.Option(min=1, help="1 KiB samples of the trainer's input path.")] = 50_000,
) -> None:
    """Achieved per-device rates at each stream count and rate; DeviceProducer, a bare confluent-kafka loop and the
    replay producers beside kafka-producer-perf-test (target: DeviceProducer >= 0.9x the loop); the trainer's
    consume -> decode -> collate rate on one core (target >= 20,000 samples/s)."""
    from streamtrain.runtime.commands import config_from, console

    cfg = config_from(ctx)
    counts, targets = _numbers(streams, "--streams", int), _numbers(rates, "--rates", float)
    cells = []
    with live_broker(cfg, external, "ingest", heap="1g") as broker:
        kafka = broker.kafka
        for rate in targets:
            for count in counts:
                cells.append(rate_cell(kafka, count, rate, seconds))
                console.print(f"{count:>3} streams at {rate:g}/s: worst device off by {cells[-1].worst():.1%}")
        runs, record_bytes, cpu = producer_rates(kafka, records, repeats, find_kafka_libs(cfg.broker.libs_dir))
        wall, per_cpu, trainer_bytes = trainer_rate(kafka, trainer_samples)
    publish(BENCH, IngestResult(record_bytes=record_bytes, window_s=seconds, rate_cells=cells, records_per_run=records,
                                repeats=repeats, records_per_s=runs, sender_cpu_us=cpu,
                                trainer_samples_per_s=round(wall, 1),
                                trainer_samples_per_cpu_s=round(per_cpu, 1), trainer_record_bytes=trainer_bytes), out)


def plot_ingest(result: IngestResult) -> Any:
    """Every device's achieved/target rate per stream count (median, min-max bars, a line per rate); the producers."""
    cells = result.rate_cells
    fig, (ax, bars) = pyplot().subplots(1, 2, figsize=(12, 3), gridspec_kw={"width_ratios": [1, 1.2]})
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
    medians = result.medians()
    bars.barh([_PRODUCERS.get(k, k).replace("`", "") for k in medians], list(medians.values()), color="tab:blue")
    bars.set(xlabel="records/s (median)", title=f"{result.record_bytes:,}-byte records, acks=all, idempotent, lz4")
    bars.locator_params(axis="x", nbins=4)
    return fig


def ingest_targets(result: IngestResult) -> list[Target]:
    """Rates held at 32 streams x 600/s, the producers against Kafka's tool and the bare loop, the trainer's path."""
    at = next((c.worst() for c in result.rate_cells if (c.streams, c.target_rate) == (32, 600.0)), None)
    replay, device, per_cpu = (result.ratio("replay_producers", "kafka_perf_tool"),
                               result.ratio("device_producer", "bare_loop"), result.trainer_samples_per_cpu_s)
    return [
        Target("32 streams at 600 samples/s, every device within ±5%",
               "not measured" if at is None else f"worst device off by {at * 100:.1f}%", None if at is None
               else at <= 0.05, "ScaDLES Fig. 6: 100/s held for 1-32 streams; 600/s sagged beyond 16 streams"),
        Target(f"unpaced replay producers ≥ 0.5{TIMES} Kafka's perf tool (median of the repeats' ratios)",
               "not measured" if replay is None else f"{replay:.2f}{TIMES}", None if replay is None else replay >= 0.5,
               "not reported"),
        Target(f"`DeviceProducer` ≥ 0.9{TIMES} the bare `produce` loop of records encoded beforehand (median of the "
               "repeats' ratios)",
               "not measured" if device is None else f"{device:.2f}{TIMES}", None if device is None else device >= 0.9,
               "not reported"),
        Target("trainer consume → decode → collate ≥ 20,000 samples/s on one core (judged per CPU second of its "
               "thread)", f"{per_cpu:,.0f} per CPU second ({result.trainer_samples_per_s:,.0f} samples/s wall), "
               f"{result.trainer_record_bytes:,}-byte records", per_cpu >= 20_000, "not reported"),
    ]


def render_ingest(result: IngestResult) -> str:
    """The `ingest` section of BENCHMARKS.md: targets, every rate cell, the producers side by side."""
    medians = result.medians()
    perf = medians.get("kafka_perf_tool") or 0.0
    rows = [[c.streams, c.target_rate, min(c.achieved_rates), float(np.median(c.achieved_rates)),
             max(c.achieved_rates), f"{c.worst() * 100:.1f}%"] for c in result.rate_cells]
    return "\n\n".join([
        f"Records of {result.record_bytes:,} bytes; a window of {result.window_s:g} s per rate cell; "
        f"{result.records_per_run:,} records per producer run, {result.repeats} alternating repeats (medians).",
        targets_table(ingest_targets(result)),
        table(["streams", "target/s", "min", "median", "max", "worst deviation"], rows),
        table(["producer", "records/s", "vs perf tool", "sending thread's CPU µs/record"],
              [[_PRODUCERS.get(k, k), round(v), f"{v / perf:.2f}{TIMES}" if perf else "—",
                f"{statistics.median(result.sender_cpu_us[k]):.2f}" if result.sender_cpu_us.get(k) else "—"]
               for k, v in medians.items()])])


BENCH = Bench("ingest", ingest_command, IngestResult, render_ingest, ingest_targets, plot_ingest,
              args=("--seconds", "10"), quick_args=("--seconds", "5", "--streams", "1,8,32", "--records", "20000",
                                                   "--repeats", "1"), timeout_s=900,
              command_line="--seconds 10 --records 200000 --repeats 9")
