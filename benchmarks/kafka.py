"""`streamtrain bench kafka`: broker start time, and our Python producer next to Kafka's own perf tool.

Both producers write records of the same size, with the same settings (acks=all, idempotence,
linger, no compression), to fresh topics on one embedded broker, in one run, `--repeats` times
alternating, so the figures compare side by side on a shared machine. Medians are reported.
"""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from streamtrain.broker import EmbeddedBroker, find_kafka_libs, kafka_version
from streamtrain.config import BrokerConfig, KafkaConfig
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin, make_producer, produce
from streamtrain.wire import Sample, encode

from .common import TIMES, Bench, Record, RenderContext, Result, pyplot, save_figure, table

__all__ = ["BENCH", "BrokerStarts", "KafkaResult", "kafka_perf_tool", "render_kafka"]

_SETTINGS = {"acks": "all", "enable.idempotence": "true", "linger.ms": "5", "compression.type": "none",
             "batch.size": "262144"}
_PERF_LINE = re.compile(r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\)")
#: The producers compared, in the order they run and are shown.
_PRODUCERS = {"python_raw": "Python producer, raw bytes", "python_sample": "Python producer, Avro `Sample`",
              "kafka_perf_tool": "`kafka-producer-perf-test` (same jars)"}


class BrokerStarts(Record):
    """Seconds from `start()` to a broker answering."""

    fresh_seconds: list[float]
    """On a fresh data directory (format + start), each repeat."""
    restart_seconds: list[float]
    """Restarting on the data it left, each repeat."""
    fresh_median_s: float
    restart_median_s: float


class KafkaResult(Result):
    """What `kafka.json` holds."""

    kafka_version: str
    record_size_bytes: int
    records_per_run: int
    repeats: int
    producer_settings: dict[str, str]
    broker_start: BrokerStarts
    records_per_s: dict[str, list[float]]
    """Each producer's records/s in each repeat."""
    records_per_s_median: dict[str, float]
    python_raw_vs_perf_tool: float
    python_sample_vs_perf_tool: float


def _time_broker_starts(base: Path, repeats: int) -> BrokerStarts:
    fresh, restart = [], []
    for i in range(repeats):
        broker = EmbeddedBroker(BrokerConfig(data_dir=base / f"start{i}"))
        began = time.perf_counter()
        broker.start()
        fresh.append(time.perf_counter() - began)
        broker.stop()
        began = time.perf_counter()
        broker.start()
        restart.append(time.perf_counter() - began)
        broker.stop()
    return BrokerStarts(fresh_seconds=fresh, restart_seconds=restart, fresh_median_s=statistics.median(fresh),
                        restart_median_s=statistics.median(restart))


def _python_producer(cfg: KafkaConfig, topic: str, records: int, payload: bytes) -> float:
    producer = make_producer(cfg, **_SETTINGS)
    began = time.perf_counter()
    for _ in range(records):
        produce(producer, topic, payload)
    if producer.flush(120) != 0:
        raise RuntimeError("python producer could not deliver every record")
    return records / (time.perf_counter() - began)


def _python_sample_producer(cfg: KafkaConfig, topic: str, records: int, record_size: int) -> float:
    """The real path: Avro-encode a Sample per record (payload sized so the record is ~record_size)."""
    features = 16
    rows = max(1, (record_size - 64) // (4 * features))
    arr = np.random.default_rng(0).standard_normal((rows, features)).astype(np.float32)
    producer = make_producer(cfg, **_SETTINGS)
    began = time.perf_counter()
    for seq in range(records):
        value, headers = encode(Sample.from_array("bench", seq, arr))
        produce(producer, topic, value, headers)
    if producer.flush(120) != 0:
        raise RuntimeError("python producer could not deliver every record")
    return records / (time.perf_counter() - began)


def kafka_perf_tool(bootstrap: str, topic: str, records: int, record_size: int,
                    settings: Mapping[str, str] | None = None, libs: Path | None = None,
                    timeout_s: float = 600.0) -> float:
    """Records/s of Kafka's own `kafka-producer-perf-test` (ProducerPerformance) from the same jars.

    Args:
        bootstrap: the broker.
        topic: an existing topic to write to.
        records: records to send, unpaced.
        record_size: bytes per record.
        settings: producer properties (default: acks=all, idempotence, linger 5 ms, no compression).
        libs: Kafka jars (default `find_kafka_libs()`).
        timeout_s: how long the tool may run.

    Raises:
        RuntimeError: when Java or the tool fails, with its output.
    """
    jars = libs or find_kafka_libs()
    java = shutil.which("java") or "java"
    props = [f"bootstrap.servers={bootstrap}", *(f"{k}={v}" for k, v in (settings or _SETTINGS).items())]
    cmd = [java, "-Xmx512m", "-cp", f"{jars}/*", "org.apache.kafka.tools.ProducerPerformance", "--topic", topic,
           "--num-records", str(records), "--record-size", str(record_size), "--throughput", "-1",
           "--producer-props", *props]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"kafka perf tool did not run: {exc}") from None
    match = _PERF_LINE.findall(done.stdout)
    if done.returncode != 0 or not match:
        raise RuntimeError(f"kafka perf tool failed ({done.returncode}): {(done.stderr or done.stdout)[-2000:]}")
    return float(match[-1][1])


def measure_kafka(records: int, record_size: int, repeats: int) -> KafkaResult:
    """Broker starts, then each producer `repeats` times alternating, on one embedded broker."""
    from streamtrain.cli_support import console

    with tempfile.TemporaryDirectory(prefix="st-bench-") as tmp:
        base = Path(tmp)
        with console.status("timing broker starts ..."):
            starts = _time_broker_starts(base, repeats)
        broker = EmbeddedBroker(BrokerConfig(data_dir=base / "perf", heap="1g"))
        cfg = KafkaConfig(bootstrap_servers=broker.start(), topic_prefix="bench")
        version = kafka_version(find_kafka_libs())
        runs: dict[str, list[float]] = {kind: [] for kind in _PRODUCERS}
        try:
            payload = bytes(np.random.default_rng(0).integers(65, 91, record_size, dtype=np.uint8))
            for r in range(repeats):
                for kind in runs:
                    topic = cfg.topics.device(f"{kind}-{r}".replace("_", "-"))
                    ensure_topics(make_admin(cfg), [TopicSpec.from_config(cfg, topic)])
                    with console.status(f"run {r + 1}/{repeats}: {kind} ..."):
                        if kind == "python_raw":
                            rate = _python_producer(cfg, topic, records, payload)
                        elif kind == "python_sample":
                            rate = _python_sample_producer(cfg, topic, records, record_size)
                        else:
                            rate = kafka_perf_tool(cfg.bootstrap_servers, topic, records, record_size)
                    runs[kind].append(rate)
                    console.print(f"  {kind:<16} {rate:>10,.0f} records/s")
        finally:
            broker.stop()
    medians = {k: statistics.median(v) for k, v in runs.items()}
    return KafkaResult(
        kafka_version=version, record_size_bytes=record_size, records_per_run=records, repeats=repeats,
        producer_settings=_SETTINGS, broker_start=starts, records_per_s=runs, records_per_s_median=medians,
        python_raw_vs_perf_tool=medians["python_raw"] / medians["kafka_perf_tool"],
        python_sample_vs_perf_tool=medians["python_sample"] / medians["kafka_perf_tool"])


def kafka_command(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="Directory for kafka.json.")] = Path("reports/bench"),
    records: Annotated[int, typer.Option(min=1000, help="Records per producer run.")] = 100_000,
    record_size: Annotated[int, typer.Option(min=16, help="Bytes per record (a 45x16 float32 sample ~2.9 kB).")
                           ] = 2900,
    repeats: Annotated[int, typer.Option(min=1, max=20, help="Alternating runs of each producer.")] = 3,
) -> None:
    """Broker start time, and Python producer records/s next to kafka-producer-perf-test, in one run."""
    from streamtrain.cli_support import config_from, console

    config_from(ctx)
    out.mkdir(parents=True, exist_ok=True)
    result = measure_kafka(records, record_size, repeats)
    result.write(out / "kafka.json")
    starts = result.broker_start
    console.print(f"broker start: fresh {starts.fresh_median_s:.2f} s, "
                  f"restart {starts.restart_median_s:.2f} s (medians of {repeats})")
    for kind, rate in result.records_per_s_median.items():
        console.print(f"{kind:<16} median {rate:>10,.0f} records/s  ({rate * record_size / 1e6:,.1f} MB/s)")
    console.print(f"python raw / perf tool = {result.python_raw_vs_perf_tool:.2f}; "
                  f"python Sample / perf tool = {result.python_sample_vs_perf_tool:.2f}; "
                  f"wrote {out / 'kafka.json'}")


def render_kafka(result: KafkaResult, ctx: RenderContext) -> str:
    """The `kafka` section of BENCHMARKS.md: producers side by side, broker starts, the plot."""
    medians = result.records_per_s_median
    perf = medians.get("kafka_perf_tool") or 0.0
    rows = [[_PRODUCERS.get(k, k), round(v), f"{v / perf:.2f}{TIMES}" if perf else "—"] for k, v in medians.items()]
    fig, ax = pyplot().subplots(figsize=(6, 2.6))
    ax.barh([_PRODUCERS.get(k, k).replace("`", "") for k in medians], list(medians.values()), color="tab:blue")
    ax.set_xlabel("records/s (median)")
    ax.set_title(f"{result.record_size_bytes}-byte records, acks=all, idempotent", fontsize=9)
    png = save_figure(fig, ctx.plot_path("kafka.png"))
    starts = result.broker_start
    return "\n\n".join([
        f"Measured: {result.records_per_run:,} records of {result.record_size_bytes:,} bytes per run, "
        f"{result.repeats} alternating repeats (medians).",
        table(["producer", "records/s", "vs perf tool"], rows),
        f"Broker start (embedded KRaft, median): fresh {starts.fresh_median_s:.2f} s, "
        f"restart on its data {starts.restart_median_s:.2f} s.",
        f"![kafka]({ctx.link(png)})",
    ])


BENCH = Bench("kafka", kafka_command, KafkaResult, render_kafka, args=("--records", "100000", "--repeats", "3"),
              quick_args=("--records", "20000", "--repeats", "1"), timeout_s=420, about=__doc__ or "")
