"""`streamtrain bench kafka`: broker start time, and our Python producer next to Kafka's own perf tool.

Both producers write records of the same size, with the same settings (acks=all, idempotence,
linger, no compression), to fresh topics on one embedded broker, in one run, `--repeats` times
alternating, so the figures compare side by side on a shared machine. Medians are reported.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from .broker import EmbeddedBroker, find_kafka_libs, kafka_version
from .cli_support import config_from, console
from .config import BrokerConfig, KafkaConfig
from .kafka import TopicSpec, ensure_topics, make_admin, make_producer, produce
from .wire import Sample, encode

__all__ = ["kafka_perf_tool", "register"]

_SETTINGS = {"acks": "all", "enable.idempotence": "true", "linger.ms": "5", "compression.type": "none",
             "batch.size": "262144"}
_PERF_LINE = re.compile(r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\)")


def _time_broker_starts(base: Path, repeats: int) -> dict[str, Any]:
    """Seconds from `start()` to a broker answering: on a fresh directory, and restarting with data."""
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
    return {"fresh_seconds": fresh, "restart_seconds": restart,
            "fresh_median_s": statistics.median(fresh), "restart_median_s": statistics.median(restart)}


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


def register(bench: typer.Typer) -> None:
    """Add `streamtrain bench kafka`."""

    @bench.command("kafka")
    def kafka_bench(
        ctx: typer.Context,
        out: Annotated[Path, typer.Option(help="Directory for kafka.json.")] = Path("reports/bench"),
        records: Annotated[int, typer.Option(min=1000, help="Records per producer run.")] = 100_000,
        record_size: Annotated[int, typer.Option(min=16, help="Bytes per record (a 45x16 float32 sample ~2.9 kB).")
                               ] = 2900,
        repeats: Annotated[int, typer.Option(min=1, max=20, help="Alternating runs of each producer.")] = 3,
    ) -> None:
        """Broker start time, and Python producer records/s next to kafka-producer-perf-test, in one run."""
        config_from(ctx)
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="st-bench-") as tmp:
            base = Path(tmp)
            with console.status("timing broker starts ..."):
                starts = _time_broker_starts(base, repeats)
            broker = EmbeddedBroker(BrokerConfig(data_dir=base / "perf", heap="1g"))
            cfg = KafkaConfig(bootstrap_servers=broker.start(), topic_prefix="bench")
            version = kafka_version(find_kafka_libs())
            runs: dict[str, list[float]] = {"python_raw": [], "python_sample": [], "kafka_perf_tool": []}
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
        report = {
            "kafka_version": version,
            "record_size_bytes": record_size, "records_per_run": records, "repeats": repeats,
            "producer_settings": _SETTINGS, "broker_start": starts, "records_per_s": runs,
            "records_per_s_median": medians,
            "python_raw_vs_perf_tool": medians["python_raw"] / medians["kafka_perf_tool"],
            "python_sample_vs_perf_tool": medians["python_sample"] / medians["kafka_perf_tool"],
        }
        (out / "kafka.json").write_text(json.dumps(report, indent=2))
        console.print(f"broker start: fresh {starts['fresh_median_s']:.2f} s, "
                      f"restart {starts['restart_median_s']:.2f} s (medians of {repeats})")
        for kind, rate in medians.items():
            console.print(f"{kind:<16} median {rate:>10,.0f} records/s  ({rate * record_size / 1e6:,.1f} MB/s)")
        console.print(f"python raw / perf tool = {report['python_raw_vs_perf_tool']:.2f}; "
                      f"python Sample / perf tool = {report['python_sample_vs_perf_tool']:.2f}; "
                      f"wrote {out / 'kafka.json'}")
