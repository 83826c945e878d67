"""`streamtrain bench bridge`: the bridge's throughput beside a bare consume-produce loop (docs/benchmarks)."""

from __future__ import annotations

import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from confluent_kafka import Producer
from prometheus_client import CollectorRegistry

from streamtrain.bridge.service import Bridge
from streamtrain.config import KafkaConfig, StreamtrainConfig
from streamtrain.kafka import (
    TopicSpec,
    consume_available,
    ensure_topics,
    make_admin,
    make_consumer,
    make_producer,
    make_transactional_producer,
    produce,
)

from .common import TIMES, Bench, Out, Result, interleaved, publish, pyplot, table
from .live import live_broker

__all__ = ["BENCH", "BridgeResult"]

DEVICES = ("0", "1", "2", "3")
#: The loops compared (the method page says what each does), in the order they run (reversed every other repeat).
_KINDS = {"bare": "bare loop", "bare_transactions": "bare loop in transactions", "bridge": "the bridge"}


class BridgeResult(Result):
    """What `bridge.json` holds: each loop's records/s in each repeat, their medians and two ratios of them."""

    records_per_run: int
    mean_record_bytes: float
    features: int
    repeats: int
    transaction_records: int
    transaction_seconds: float
    records_per_s: dict[str, list[float]]
    records_per_s_median: dict[str, float]
    transactions_vs_bare: float
    bridge_vs_bare_transactions: float


def _write_source(cfg: KafkaConfig, topic: str, records: int, features: int) -> float:
    """JSON records of 1-8 frames to `topic`, keyed by device; returns their mean size in bytes."""
    ensure_topics(make_admin(cfg), [TopicSpec(topic, 3)])
    rng = np.random.default_rng(0)
    values = [json.dumps({"values": np.round(rng.standard_normal(int(rng.integers(1, 9)) * features), 4).tolist(),
                          "label": i % 4}).encode() for i in range(records)]
    producer = make_producer(cfg)
    for i, value in enumerate(values):
        produce(producer, topic, value, key=DEVICES[i % len(DEVICES)].encode())
    if producer.flush(120):
        raise RuntimeError("the source records could not all be written")
    return sum(map(len, values)) / records


def _bare(cfg: KafkaConfig, source: str, records: int, batch: int | None) -> float:
    """Records/s of a bare loop: values copied to a fresh topic, the group's offsets committed at the end or, with
    `batch`, in each transaction of that many records."""
    target = f"{cfg.topic_prefix}.copy-{uuid.uuid4().hex[:6]}"
    ensure_topics(make_admin(cfg), [TopicSpec(target, 1)])
    consumer = make_consumer(cfg, f"bench-bare-{uuid.uuid4().hex[:6]}")
    producer: Producer = (make_transactional_producer(cfg, f"bench-{uuid.uuid4().hex[:6]}", 60.0) if batch
                          else make_producer(cfg))
    if batch:
        producer.init_transactions(60)
    consumer.subscribe([source])
    try:
        began, done = 0.0, 0
        while done < records:
            if batch:
                producer.begin_transaction()
            end = min(records, done + (batch or records))
            while done < end:
                for msg in consume_available(consumer, min(500, end - done), 0.5):
                    if msg.error() is None:
                        began = began or time.perf_counter()
                        produce(producer, target, msg.value() or b"", key=msg.key())
                        done += 1
            positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
            if batch:
                producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 30)
                producer.commit_transaction(30)
            elif producer.flush(60):
                raise RuntimeError("the bare loop could not deliver every record")
            else:
                consumer.commit(offsets=positions, asynchronous=False)
        return records / (time.perf_counter() - began)
    finally:
        consumer.close()


def _bridge(cfg: KafkaConfig, source: str, records: int, features: int, batch: int, seconds: float) -> float:
    """Records/s of the bridge itself, in this process, on fresh device topics and a fresh group."""
    prefix = f"{cfg.topic_prefix}{uuid.uuid4().hex[:6]}"
    config = StreamtrainConfig.model_validate({
        "job": prefix, "kafka": {**cfg.model_dump(), "topic_prefix": prefix},
        "bridge": {"devices": DEVICES, "transaction_records": batch, "transaction_seconds": seconds,
                   "metrics": False, "check_records": 0,
                   "sources": [{"topic": source, "decoder": "json",
                                "mapping": {"data": "values", "shape": [-1, features], "label": "label"}}]}})
    service = Bridge(config, CollectorRegistry())
    service.start()
    counted = ("streamtrain_bridge_records_in_total", {"job": prefix, "topic": source})
    try:
        began = 0.0
        while (service.metrics.registry.get_sample_value(*counted) or 0) < records:
            if service.run_once(0.5) and not began:
                began = time.perf_counter()
        return records / (time.perf_counter() - began)
    finally:
        service.close()


def bridge_command(
    ctx: typer.Context,
    out: Out = Path("reports/bench"),
    records: Annotated[int, typer.Option(min=1000, help="Source records per run.")] = 20_000,
    features: Annotated[int, typer.Option(min=1, help="Floats per frame (1-8 frames a record).")] = 16,
    repeats: Annotated[int, typer.Option(min=1, max=20, help="Alternating runs of each loop.")] = 3,
    transaction_records: Annotated[int, typer.Option(min=1, help="Records per transaction.")] = 500,
    transaction_seconds: Annotated[float, typer.Option(min=0.01, help="bridge.transaction_seconds.")] = 0.1,
) -> None:
    """The bridge's records/s beside a bare consume-produce loop of the same records, with and without transactions,
    on one embedded broker (`broker` settings, a 1 GiB heap)."""
    from streamtrain.runtime.commands import config_from, console

    cfg = config_from(ctx)
    batch = transaction_records
    with live_broker(cfg, False, "bridge", heap="1g") as broker:
        kafka, source = broker.kafka, "bench-source"
        with console.status("writing the source records ..."):
            size = _write_source(kafka, source, records, features)

        def measure(kind: str, r: int) -> float:
            with console.status(f"run {r + 1}/{repeats}: {kind} ..."):
                rate = (_bridge(kafka, source, records, features, batch, transaction_seconds) if kind == "bridge"
                        else _bare(kafka, source, records, batch if kind == "bare_transactions" else None))
            console.print(f"  {kind:<18} {rate:>10,.0f} records/s")
            return rate

        runs = interleaved(list(_KINDS), repeats, measure)
    medians = {k: statistics.median(v) for k, v in runs.items()}
    publish(BENCH, BridgeResult(
        records_per_run=records, mean_record_bytes=round(size, 1), features=features, repeats=repeats,
        transaction_records=batch, transaction_seconds=transaction_seconds, records_per_s=runs,
        records_per_s_median=medians, transactions_vs_bare=medians["bare_transactions"] / medians["bare"],
        bridge_vs_bare_transactions=medians["bridge"] / medians["bare_transactions"]), out)


def plot_bridge(result: BridgeResult) -> Any:
    """The three loops' medians side by side."""
    medians = result.records_per_s_median
    fig, ax = pyplot().subplots(figsize=(7, 2.4))
    ax.barh([_KINDS.get(k, k) for k in medians], list(medians.values()), color="tab:blue")
    ax.set(xlabel="records/s (median)",
           title=f"{result.mean_record_bytes:.0f}-byte JSON records; transactions of {result.transaction_records}")
    return fig


def render_bridge(result: BridgeResult) -> str:
    """The `bridge` section of BENCHMARKS.md: the three loops side by side, the bridge against the transactional one."""
    medians = result.records_per_s_median
    bare = medians.get("bare") or 0.0
    rows = [[_KINDS.get(k, k), round(v), f"{v / bare:.2f}{TIMES}" if bare else "—"] for k, v in medians.items()]
    return "\n\n".join([
        f"Setup: {result.records_per_run:,} JSON records (mean {result.mean_record_bytes:.0f} bytes) per run from a "
        f"3-partition topic, {result.repeats} repeats (medians), transactions of {result.transaction_records} records "
        f"or {result.transaction_seconds:g} s.", table(["loop", "records/s", "vs bare"], rows),
        f"Bridge / bare loop in transactions: {result.bridge_vs_bare_transactions:.2f}{TIMES}."])


BENCH = Bench("bridge", bridge_command, BridgeResult, render_bridge, plot=plot_bridge,
              args=("--records", "20000", "--repeats", "3"), quick_args=("--records", "3000", "--repeats", "1"),
              timeout_s=600, command_line="--records 20000 --repeats 5")
