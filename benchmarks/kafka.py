"""`streamtrain bench kafka`: what publishing through `DeviceProducer` costs over the Kafka client (docs/benchmarks)."""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from confluent_kafka import KafkaError, Message, Producer

from streamtrain.broker import find_kafka_libs, kafka_version
from streamtrain.config import KafkaConfig
from streamtrain.kafka import TopicSpec, client_settings, ensure_topics, make_admin, produce
from streamtrain.publish import DeviceProducer, encode_device_sample
from streamtrain.wire import Sample, encode

from .common import TIMES, Bench, Out, Result, Target, interleaved, publish, pyplot, table, targets_table
from .live import live_broker

__all__ = ["BENCH", "KafkaResult", "kafka_perf_tool"]

_SETTINGS = {"acks": "all", "enable.idempotence": "true", "linger.ms": "5", "compression.type": "none",
             "batch.size": "262144"}
_PERF_LINE = re.compile(r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\)")
#: The producers compared, in the order they run (reversed every other repeat) and are shown.
_PRODUCERS = {"kafka_perf_tool": "`kafka-producer-perf-test` (same jars)",
              "bare_loop": "confluent-kafka `produce` loop, `Sample`s encoded beforehand",
              "device_producer": "`DeviceProducer.send` of the same samples"}
#: The samples published: a pool of payloads, one device, one time (sample i: payload i % 64, label i % 10).
_POOL, _DEVICE, _PRODUCED_AT = 64, "bench", 1_700_000_000_000


class KafkaResult(Result):
    """What `kafka.json` holds: each producer's records/s in each repeat (medians and ratios are the renderer's)."""

    kafka_version: str
    record_size_bytes: int
    records_per_run: int
    repeats: int
    records_per_s: dict[str, list[float]]

    def medians(self) -> dict[str, float]:
        return {k: statistics.median(v) for k, v in self.records_per_s.items()}

    def device_vs_bare(self) -> float | None:
        """DeviceProducer's records/s over the bare loop's: the median of the repeats' ratios (None if unmeasured)."""
        device, bare = self.records_per_s.get("device_producer"), self.records_per_s.get("bare_loop")
        return statistics.median(d / b for d, b in zip(device, bare, strict=True)) if device and bare else None


def _bare_loop(cfg: KafkaConfig, records: list[tuple[bytes, Any]]) -> float:
    """confluent-kafka's own pattern (`streamtrain.kafka.produce`: poll(0), wait when full) with a delivery report."""
    producer = Producer(client_settings(cfg, **_SETTINGS))
    failed = 0

    def report(err: KafkaError | None, _msg: Message) -> None:
        nonlocal failed
        failed += err is not None

    began = time.perf_counter()
    for value, headers in records:
        produce(producer, cfg.topics.device(_DEVICE), value, headers=headers, on_delivery=report)
    if producer.flush(120) != 0 or failed:
        raise RuntimeError("the bare produce loop could not deliver every record")
    return len(records) / (time.perf_counter() - began)


def _device_producer(cfg: KafkaConfig, records: int, payloads: list[np.ndarray]) -> float:
    """`DeviceProducer.send` of the same samples: checked, numbered and encoded on the way."""
    client = {k: v for k, v in _SETTINGS.items() if k not in ("acks", "enable.idempotence")}  # always on
    producer = DeviceProducer(cfg, device=_DEVICE, settings=client)
    began = time.perf_counter()
    for i in range(records):
        producer.send(payloads[i % _POOL], label=i % 10, produced_at=_PRODUCED_AT)
    producer.close(120)  # raises DeliveryError unless every record was delivered
    return records / (time.perf_counter() - began)


def kafka_perf_tool(bootstrap: str, topic: str, records: int, record_size: int,
                    settings: Mapping[str, str] | None = None, libs: Path | None = None) -> float:
    """Records/s of Kafka's `kafka-producer-perf-test` sending `records` of `record_size` bytes unpaced to `topic`
    with `settings` (default: this benchmark's); RuntimeError with its output when Java or the tool fails."""
    props = [f"bootstrap.servers={bootstrap}", *(f"{k}={v}" for k, v in (settings or _SETTINGS).items())]
    cmd = [shutil.which("java") or "java", "-Xmx512m", "-cp", f"{libs or find_kafka_libs()}/*",
           "org.apache.kafka.tools.ProducerPerformance", "--topic", topic, "--num-records", str(records),
           "--record-size", str(record_size), "--throughput", "-1", "--producer-props", *props]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"kafka perf tool did not run: {exc}") from None
    match = _PERF_LINE.findall(done.stdout)
    if done.returncode != 0 or not match:
        raise RuntimeError(f"kafka perf tool failed ({done.returncode}): {(done.stderr or done.stdout)[-2000:]}")
    return float(match[-1][1])


def kafka_command(
    ctx: typer.Context,
    out: Out = Path("reports/bench"),
    records: Annotated[int, typer.Option(min=1000, help="Records per producer run.")] = 100_000,
    record_size: Annotated[int, typer.Option(min=16, help="Bytes per record (45x16 float32: ~2.9 kB).")] = 2900,
    repeats: Annotated[int, typer.Option(min=1, max=20, help="Alternating runs of each producer.")] = 3,
) -> None:
    """DeviceProducer beside a bare confluent-kafka produce loop and kafka-producer-perf-test (target: within 20%)."""
    from streamtrain.cli_support import config_from, console

    rng = np.random.default_rng(0)  # 2.9 kB records: 45x16 float32 samples
    payloads = [rng.standard_normal((max(1, (record_size - 64) // 64), 16)).astype(np.float32) for _ in range(_POOL)]
    with console.status(f"encoding {records:,} records for the bare loop ..."):
        encoded = [encode(Sample.from_array(_DEVICE, i, payloads[i % _POOL], label=i % 10, produced_at=_PRODUCED_AT))
                   for i in range(records)]
    if encode_device_sample(_DEVICE, 0, payloads[0], label=0, produced_at=_PRODUCED_AT).value != encoded[0][0]:
        raise RuntimeError("DeviceProducer would not write the bare loop's records: the comparison would be unfair")

    cfg = config_from(ctx)
    with live_broker(cfg, False, "kafka", heap="1g") as broker:
        kafka = broker.kafka

        def measure(kind: str, r: int) -> float:
            run_cfg = kafka.model_copy(update={"topic_prefix": f"bench-{kind}-{r}".replace("_", "-")})
            topic = run_cfg.topics.device(_DEVICE)
            ensure_topics(make_admin(kafka), [TopicSpec.from_config(kafka, topic)])
            with console.status(f"run {r + 1}/{repeats}: {kind} ..."):
                rate = (_bare_loop(run_cfg, encoded) if kind == "bare_loop" else
                        _device_producer(run_cfg, records, payloads) if kind == "device_producer" else
                        kafka_perf_tool(kafka.bootstrap_servers, topic, records, record_size))
            console.print(f"  {kind:<16} {rate:>10,.0f} records/s")
            return rate

        runs = interleaved(list(_PRODUCERS), repeats, measure)
    publish(BENCH, KafkaResult(kafka_version=kafka_version(find_kafka_libs(cfg.broker.libs_dir)), repeats=repeats,
                               record_size_bytes=record_size, records_per_run=records, records_per_s=runs), out)


def plot_kafka(result: KafkaResult) -> Any:
    medians = result.medians()
    fig, ax = pyplot().subplots(figsize=(6, 2.6))
    ax.barh([_PRODUCERS.get(k, k).replace("`", "") for k in medians], list(medians.values()), color="tab:blue")
    ax.set_xlabel("records/s (median)")
    ax.set_title(f"{result.record_size_bytes}-byte records, acks=all, idempotent", fontsize=9)
    return fig


def kafka_targets(result: KafkaResult) -> list[Target]:
    """DeviceProducer within 20% of the bare loop (none in a result from before the pair was measured)."""
    ratio = result.device_vs_bare()
    return [] if ratio is None else [Target("`DeviceProducer` within 20% of the bare `produce` loop (median of the "
                                            "repeats' ratios)", f"{ratio:.2f}{TIMES}", ratio >= 0.8)]


def render_kafka(result: KafkaResult) -> str:
    """The `kafka` section of BENCHMARKS.md: the producers side by side, DeviceProducer's target."""
    medians, targets = result.medians(), kafka_targets(result)
    perf = medians.get("kafka_perf_tool") or 0.0
    return "\n\n".join([
        f"Measured: {result.records_per_run:,} records of {result.record_size_bytes:,} bytes per run, "
        f"{result.repeats} alternating repeats (medians), Kafka {result.kafka_version}.",
        table(["producer", "records/s", "vs perf tool"], [[_PRODUCERS.get(k, k), round(v), f"{v / perf:.2f}{TIMES}"
                                                            if perf else "—"] for k, v in medians.items()]),
        *([targets_table(targets)] if targets else [])])


BENCH = Bench("kafka", kafka_command, KafkaResult, render_kafka, kafka_targets, plot_kafka,
              args=("--records", "100000", "--repeats", "3"), quick_args=("--records", "20000", "--repeats", "1"),
              timeout_s=540)
