"""`streamtrain demo`: the embedded broker and a visible produce → consume round trip.

Variable-size samples go to one topic per device through the idempotent `acks=all` producer,
are read back, and every seq and size is checked: a check that Kafka works here, before
`streamtrain up` runs the whole stack.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from confluent_kafka import KafkaError, Message
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from streamtrain.broker import BrokerError, EmbeddedBroker
from streamtrain.config import KafkaConfig
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin, make_producer, produce, read_to_end
from streamtrain.report.accounting import SeqLedger
from streamtrain.runtime.commands import config_from, console, die
from streamtrain.wire import Sample, WireError, decode, encode

__all__ = ["RoundTrip", "register", "run_round_trip"]


@dataclass
class RoundTrip:
    """What a round trip produced and read back, per device."""

    devices: list[str]
    per_device: int
    produce_seconds: float = 0.0
    consume_seconds: float = 0.0
    produced_bytes: int = 0
    delivery_failures: int = 0
    decode_failures: int = 0
    ledger: SeqLedger = field(default_factory=SeqLedger)
    sizes: dict[str, list[int]] = field(default_factory=dict)
    size_mismatches: int = 0

    @property
    def ok(self) -> bool:
        accounts = [self.ledger.account(d, self.per_device) for d in self.devices]
        return (all(a.exact for a in accounts) and not self.delivery_failures and not self.decode_failures
                and not self.size_mismatches)


def _sizes(rng: np.random.Generator, n: int, mean: float, dif: float) -> np.ndarray:
    return np.maximum(1, np.rint(rng.normal(mean, dif, n))).astype(int)


def run_round_trip(cfg: KafkaConfig, devices: list[str], per_device: int, mean_size: float = 45.0,
                   dif: float = 16.0, features: int = 16, seed: int = 0, progress: Progress | None = None) -> RoundTrip:
    """Produce `per_device` samples to each device topic, read them back, and account for every one."""
    topics = {d: cfg.topics.device(d) for d in devices}
    ensure_topics(make_admin(cfg), [TopicSpec.from_config(cfg, t) for t in topics.values()])
    result = RoundTrip(list(devices), per_device)
    rng = np.random.default_rng(seed)
    expected: dict[tuple[str, int], int] = {}
    producer = make_producer(cfg)

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            result.delivery_failures += 1

    total = per_device * len(devices)
    bar = progress.add_task("produce", total=total) if progress else None
    began = time.perf_counter()
    for seq in range(per_device):
        for device in devices:
            size = int(_sizes(rng, 1, mean_size, dif)[0])
            label = int(rng.integers(0, 10))
            payload = rng.standard_normal((size, features)).astype(np.float32) + label
            value, headers = encode(Sample.from_array(device, seq, payload, label=label))
            expected[(device, seq)] = size
            produce(producer, topics[device], value, headers, delivered)
            result.produced_bytes += len(value)
        if progress and bar is not None:
            progress.update(bar, advance=len(devices))
    remaining = producer.flush(60)
    result.delivery_failures += remaining
    result.produce_seconds = time.perf_counter() - began

    bar = progress.add_task("consume", total=total) if progress else None
    began = time.perf_counter()
    for msg in read_to_end(cfg, topics.values()):
        try:
            sample = decode(msg.value(), msg.headers(), Sample)
        except WireError:
            result.decode_failures += 1
            continue
        result.ledger.add(sample.device_id, sample.seq)
        result.sizes.setdefault(sample.device_id, []).append(sample.size)
        if expected.get((sample.device_id, sample.seq)) != sample.size:
            result.size_mismatches += 1
        if progress and bar is not None:
            progress.advance(bar)
    result.consume_seconds = time.perf_counter() - began
    return result


def _table(result: RoundTrip) -> Table:
    table = Table(title="round trip: produced → Kafka → consumed")
    for col in ("device", "produced", "read back", "missing", "duplicates", "mean size", "DIF (std)"):
        table.add_column(col, justify="right")
    for device in result.devices:
        acc = result.ledger.account(device, result.per_device)
        sizes = np.array(result.sizes.get(device, [0]))
        table.add_row(device, str(result.per_device), str(acc.seen), str(len(acc.missing)), str(acc.duplicates),
                      f"{sizes.mean():.1f}", f"{sizes.std():.1f}")
    return table


def register(app: typer.Typer) -> None:
    """Add `streamtrain demo` to the root CLI."""

    @app.command()
    def demo(
        ctx: typer.Context,
        devices: Annotated[int, typer.Option(min=1, max=64, help="Number of device streams.")] = 4,
        samples: Annotated[int, typer.Option(min=1, help="Samples per device.")] = 2500,
        mean_size: Annotated[float, typer.Option(min=1, help="Mean sample size (frames/tokens).")] = 45.0,
        dif: Annotated[float, typer.Option(min=0, help="DIF: standard deviation of sample sizes.")] = 16.0,
        data_dir: Annotated[Path, typer.Option(help="Data directory of the demo's embedded broker.")] = Path(
            ".streamtrain/demo-broker"),
        external: Annotated[bool, typer.Option(help="Use the broker at kafka.bootstrap_servers instead.")] = False,
        keep_broker: Annotated[bool, typer.Option(help="Leave the embedded broker running afterwards.")] = False,
    ) -> None:
        """Start the embedded Kafka broker and run a round trip of variable-size samples through it.

        Every sample goes to its device's topic with acks=all and idempotence, is read back, and its
        seq and size are checked. Exit status 0 when every sample came back exactly once.
        """
        cfg = config_from(ctx, {"broker.data_dir": data_dir})
        broker = None if external else EmbeddedBroker(cfg.broker)
        kafka = cfg.kafka
        if broker is not None:
            try:
                with console.status("starting the embedded Kafka broker ...", spinner="dots"):
                    began = time.monotonic()
                    bootstrap = broker.start()
            except BrokerError as exc:
                die(str(exc))
            console.print(f"Kafka broker answering on [bold]{bootstrap}[/] after {time.monotonic() - began:.1f} s")
            kafka = kafka.model_copy(update={"bootstrap_servers": bootstrap, "topic_prefix": f"demo{int(time.time())}"})
        try:
            names = [f"dev{i}" for i in range(devices)]
            columns = (TextColumn("{task.description:>8}"), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
                       TimeElapsedColumn())
            with Progress(*columns, console=console) as progress:
                result = run_round_trip(kafka, names, samples, mean_size, dif, progress=progress)
        finally:
            if broker is not None and not keep_broker:
                broker.stop()
        console.print(_table(result))
        n = samples * devices
        console.print(f"produced {n} samples ({result.produced_bytes / 1e6:.1f} MB) in {result.produce_seconds:.2f} s "
                      f"= {n / result.produce_seconds:,.0f} samples/s; read back in {result.consume_seconds:.2f} s "
                      f"= {n / result.consume_seconds:,.0f} samples/s")
        if not result.ok:
            die(f"round trip lost or duplicated samples (delivery failures {result.delivery_failures}, "
                f"decode failures {result.decode_failures}, size mismatches {result.size_mismatches})")
        console.print("[bold green]every sample came back exactly once with its size[/]")
