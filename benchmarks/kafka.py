"""`streamtrain bench kafka`: broker start time, and our Python producers next to Kafka's own perf tool.

Every producer writes records of the same size, with the same settings (acks=all, idempotence,
linger, no compression), to fresh topics on one embedded broker, in one run, `--repeats` times
alternating, so the figures compare side by side on a shared machine. Medians are reported.

`DeviceProducer` (what an application publishes with: it checks, numbers and encodes each sample)
runs next to a bare confluent-kafka `produce` loop of the very same records, encoded beforehand:
their ratio is what the publishing API costs over the client itself.
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
from confluent_kafka import KafkaError, Message, Producer

from streamtrain.broker import EmbeddedBroker, find_kafka_libs, kafka_version
from streamtrain.config import BrokerConfig, KafkaConfig
from streamtrain.kafka import TopicSpec, client_settings, ensure_topics, make_admin, make_producer, produce
from streamtrain.publish import DeviceProducer, encode_device_sample
from streamtrain.wire import Sample, encode
from streamtrain.wire.codec import HeaderList

from .common import TIMES, Bench, Record, RenderContext, Result, pyplot, save_figure, table, verdict

__all__ = ["BENCH", "BrokerStarts", "KafkaResult", "kafka_perf_tool", "render_kafka"]

_SETTINGS = {"acks": "all", "enable.idempotence": "true", "linger.ms": "5", "compression.type": "none",
             "batch.size": "262144"}
_PERF_LINE = re.compile(r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\)")
#: The producers compared, in the order they run and are shown.
_PRODUCERS = {"python_raw": "Python producer, raw bytes", "python_sample": "Python producer, Avro `Sample`",
              "kafka_perf_tool": "`kafka-producer-perf-test` (same jars)",
              "bare_loop": "confluent-kafka `produce` loop, `Sample`s encoded beforehand",
              "device_producer": "`DeviceProducer.send` of the same samples"}
#: The samples behind the records of the bare loop and DeviceProducer: a pool of payloads, one device, one time.
_POOL, _DEVICE, _PRODUCED_AT = 64, "bench", 1_700_000_000_000


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
    device_producer_vs_bare_loop: float | None = None
    """DeviceProducer's records/s over the bare loop's, on the same records: the median of each repeat's ratio
    (the two run back to back, so a machine whose load drifts between repeats moves both). None in runs before
    it was measured."""


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


def _payloads(record_size: int) -> list[np.ndarray]:
    """Sample payloads sized so one record is about `record_size` bytes (45x16 float32 ~ 2.9 kB)."""
    features = 16
    rows = max(1, (record_size - 64) // (4 * features))
    rng = np.random.default_rng(0)
    return [rng.standard_normal((rows, features)).astype(np.float32) for _ in range(_POOL)]


def _sample_args(i: int, payloads: list[np.ndarray]) -> tuple[np.ndarray, int]:
    """Sample i's payload and label, alike for both sides of the comparison."""
    return payloads[i % len(payloads)], i % 10


def _encoded_records(records: int, payloads: list[np.ndarray]) -> list[tuple[bytes, HeaderList]]:
    """The records DeviceProducer will write, encoded beforehand for the bare loop (same seq, label, time)."""
    out = []
    for i in range(records):
        payload, label = _sample_args(i, payloads)
        out.append(encode(Sample.from_array(_DEVICE, i, payload, label=label, produced_at=_PRODUCED_AT)))
    return out


def _bare_loop(cfg: KafkaConfig, records: list[tuple[bytes, HeaderList]]) -> float:
    """confluent-kafka's own pattern and nothing of ours: produce with a delivery report, poll(0), wait when full."""
    producer = Producer(client_settings(cfg, **_SETTINGS))
    topic = cfg.topics.device(_DEVICE)
    failed = 0

    def report(err: KafkaError | None, _msg: Message) -> None:
        nonlocal failed
        failed += err is not None

    began = time.perf_counter()
    for value, headers in records:
        while True:
            try:
                producer.produce(topic, value, headers=headers, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(120) != 0 or failed:
        raise RuntimeError("the bare produce loop could not deliver every record")
    return len(records) / (time.perf_counter() - began)


def _device_producer(cfg: KafkaConfig, records: int, payloads: list[np.ndarray]) -> float:
    """`DeviceProducer.send` of the same samples: checked, numbered and encoded on the way."""
    client = {k: v for k, v in _SETTINGS.items() if k not in ("acks", "enable.idempotence")}  # always on
    producer = DeviceProducer(cfg, device=_DEVICE, settings=client)
    began = time.perf_counter()
    for i in range(records):
        payload, label = _sample_args(i, payloads)
        producer.send(payload, label=label, produced_at=_PRODUCED_AT)
    producer.close(120)  # raises DeliveryError unless every record was delivered
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
        try:
            runs = _run_producers(cfg, records, record_size, repeats)
        finally:
            broker.stop()
    medians = {k: statistics.median(v) for k, v in runs.items()}
    return KafkaResult(
        kafka_version=version, record_size_bytes=record_size, records_per_run=records, repeats=repeats,
        producer_settings=_SETTINGS, broker_start=starts, records_per_s=runs, records_per_s_median=medians,
        python_raw_vs_perf_tool=medians["python_raw"] / medians["kafka_perf_tool"],
        python_sample_vs_perf_tool=medians["python_sample"] / medians["kafka_perf_tool"],
        device_producer_vs_bare_loop=statistics.median(
            d / b for d, b in zip(runs["device_producer"], runs["bare_loop"], strict=True)))


def _run_producers(cfg: KafkaConfig, records: int, record_size: int, repeats: int) -> dict[str, list[float]]:
    """Each producer's records/s in each repeat, every run on fresh topics."""
    from streamtrain.cli_support import console

    payload = bytes(np.random.default_rng(0).integers(65, 91, record_size, dtype=np.uint8))
    payloads = _payloads(record_size)
    with console.status(f"encoding {records:,} records for the bare loop ..."):
        encoded = _encoded_records(records, payloads)
    first, label = _sample_args(0, payloads)
    if encode_device_sample(_DEVICE, 0, first, label=label, produced_at=_PRODUCED_AT).value != encoded[0][0]:
        raise RuntimeError("DeviceProducer would not write the bare loop's records: the comparison would be unfair")
    runs: dict[str, list[float]] = {kind: [] for kind in _PRODUCERS}
    for r in range(repeats):
        pair = ["bare_loop", "device_producer"]
        order = ["python_raw", "python_sample", "kafka_perf_tool", *(pair if r % 2 == 0 else pair[::-1])]
        for kind in order:  # the compared pair side by side, which goes first alternating
            run_cfg = cfg.model_copy(update={"topic_prefix": f"bench-{kind}-{r}".replace("_", "-")})
            topic = run_cfg.topics.device(_DEVICE)
            ensure_topics(make_admin(cfg), [TopicSpec.from_config(cfg, topic)])
            with console.status(f"run {r + 1}/{repeats}: {kind} ..."):
                if kind == "python_raw":
                    rate = _python_producer(cfg, topic, records, payload)
                elif kind == "python_sample":
                    rate = _python_sample_producer(cfg, topic, records, record_size)
                elif kind == "bare_loop":
                    rate = _bare_loop(run_cfg, encoded)
                elif kind == "device_producer":
                    rate = _device_producer(run_cfg, records, payloads)
                else:
                    rate = kafka_perf_tool(cfg.bootstrap_servers, topic, records, record_size)
            runs[kind].append(rate)
            console.print(f"  {kind:<16} {rate:>10,.0f} records/s")
    return runs


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
                  f"DeviceProducer / bare loop = {result.device_producer_vs_bare_loop:.2f}; "
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
    ratio = result.device_producer_vs_bare_loop
    device = ([] if ratio is None else [
        f"`DeviceProducer` / a bare confluent-kafka `produce` loop of the same records, encoded beforehand "
        f"(median of the repeats' ratios, the two back to back): {ratio:.2f}{TIMES} {verdict(ratio >= 0.8)} "
        f"(target: within 20%, {TIMES} >= 0.80)."])
    return "\n\n".join([
        f"Measured: {result.records_per_run:,} records of {result.record_size_bytes:,} bytes per run, "
        f"{result.repeats} alternating repeats (medians).",
        table(["producer", "records/s", "vs perf tool"], rows),
        *device,
        f"Broker start (embedded KRaft, median): fresh {starts.fresh_median_s:.2f} s, "
        f"restart on its data {starts.restart_median_s:.2f} s.",
        f"![kafka]({ctx.link(png)})",
    ])


BENCH = Bench("kafka", kafka_command, KafkaResult, render_kafka, args=("--records", "100000", "--repeats", "3"),
              quick_args=("--records", "20000", "--repeats", "1"), timeout_s=540, about=__doc__ or "")
