"""The bridge under faults, on the real broker: JSON lines that kcat (a C client) streams into a 3-partition topic
keyed by device are bridged into the device topics and trained, while the bridge is SIGKILLed mid-stream and
restarted, or the broker is killed mid-transaction and restarted. Counted by source offset: every source
record bridged once (or dead-lettered), none lost, none duplicated; every bridged sample trained.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from fault_helpers import FaultStack, Service, assert_nothing_lost
from trainer_seq_log import committed_offsets, high_watermarks  # on sys.path through fault_helpers

from streamtrain.broker import EmbeddedBroker
from streamtrain.config import KafkaConfig, StreamtrainConfig
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin, make_producer
from streamtrain.report.source_accounting import SourceTally, collect_sources, tally_sources

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.slow]

DEVICES = ("0", "1", "2")
FEATURES = 16  # trainer.num_features' default
MAPPING = {"data": "values", "shape": [-1, FEATURES], "label": "label", "time": "ts", "seq": "n"}


def _bad(i: int) -> bool:
    """Every 97th line fails the mapping (not whole frames): dead-lettered as bad-shape."""
    return i % 97 == 50


def _good_per_device(count: int) -> dict[str, int]:
    return {d: sum(1 for i in range(k, count, len(DEVICES)) if not _bad(i)) for k, d in enumerate(DEVICES)}


def _lines(count: int, seed: int) -> Iterator[tuple[str, str]]:
    """(device key, JSON line) of `count` samples, the devices in turn. The good ones of each device are numbered
    0, 1, ... (its seq): the seq logs of the trainers then tell a sample trained twice or never."""
    rng = np.random.default_rng(seed)
    numbered = dict.fromkeys(DEVICES, 0)
    for i in range(count):
        device = DEVICES[i % len(DEVICES)]
        frames = 1 + int(rng.integers(0, 6))
        body = {"values": np.round(rng.standard_normal(frames * FEATURES), 3).tolist(), "label": int(i % 4),
                "ts": int(time.time() * 1000), "n": numbered[device]}
        if _bad(i):
            body["values"] = body["values"][:-1]
        else:
            numbered[device] += 1
        yield device, json.dumps(body)


def _stream_with_kcat(kafka: KafkaConfig, topic: str, count: int, rate: float) -> subprocess.Popen[str]:
    """kcat reading `key<TAB>json` lines from a pipe fed at `rate` lines/s (a thread feeds it)."""
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed (apt-get install kcat; `make system-deps` does)")
    proc = subprocess.Popen([kcat, "-P", "-b", kafka.bootstrap_servers, "-t", topic, "-K", "\t", "-X",
                             "linger.ms=5"], stdin=subprocess.PIPE, text=True, stderr=subprocess.PIPE)

    def feed() -> None:
        assert proc.stdin is not None
        began = time.monotonic()
        for i, (key, line) in enumerate(_lines(count, seed=3)):
            proc.stdin.write(f"{key}\t{line}\n")
            proc.stdin.flush()
            time.sleep(max(0.0, began + (i + 1) / rate - time.monotonic()))
        proc.stdin.close()

    threading.Thread(target=feed, daemon=True).start()
    return proc


def _bridge_args(stack: FaultStack, topic: str, **extra: object) -> list[str]:
    settings = {"bridge.sources": json.dumps([{"topic": topic, "decoder": "json", "mapping": MAPPING}]),
                "bridge.devices": json.dumps(list(DEVICES)), "bridge.transaction_seconds": 0.5,
                "bridge.transaction_records": 200, **extra}
    return [*stack.base, *(x for k, v in settings.items() for x in ("--set", f"{k}={v}")), "bridge"]


def _config(kafka: KafkaConfig, job: str, topic: str) -> StreamtrainConfig:
    return StreamtrainConfig.model_validate({
        "job": job, "kafka": kafka.model_dump(),
        "bridge": {"sources": [{"topic": topic, "decoder": "json", "mapping": MAPPING}], "devices": DEVICES}})


def _bridged_through(cfg: StreamtrainConfig, count: int, timeout: float,
                     watch: Callable[[], None]) -> list[SourceTally]:
    """Wait until the source holds `count` records, none of them pending; returns the tallies."""
    deadline = time.monotonic() + timeout
    while True:
        tallies = tally_sources(collect_sources(cfg, timeout=30))
        records = sum(t.fates.records for t in tallies)
        if records == count and not any(t.fates.pending for t in tallies):
            return tallies
        watch()
        assert time.monotonic() < deadline, [t.summary() for t in tallies]
        time.sleep(1.0)


def _assert_exactly_once(tallies: list[SourceTally], count: int) -> int:
    """Every source record bridged or rejected once; returns how many were bridged."""
    assert len(tallies) == 3 and sum(t.fates.records for t in tallies) == count
    for t in tallies:
        assert t.exact and t.fates.complete, t.summary()
        assert t.fates.truncated == 0 and set(t.reasons) <= {"bad-shape"}, t.summary()
    return sum(t.fates.trained for t in tallies)


def test_kcat_json_lines_are_bridged_then_trained_exactly_once_across_a_bridge_sigkill(
        kafka_cfg: KafkaConfig, tmp_path: Path) -> None:
    count, rate = 600, 60.0  # ~10 s of stream: the kill lands mid-stream, with a transaction open
    job = kafka_cfg.topic_prefix
    topic = f"{job}-events"
    ensure_topics(make_admin(kafka_cfg), [TopicSpec(topic, 3)])
    stack = FaultStack(kafka_cfg, tmp_path, job, DEVICES)
    bridge = Service("bridge", _bridge_args(stack, topic), tmp_path / "bridge.log")
    stack.services.append(bridge)
    try:
        coordinator = stack.coordinator().start()
        coordinator.wait_for(r"coordinating job", 60)
        bridge.start().wait_for(r"bridging .* into the topics", 60)
        trainer = stack.start_trainer()
        writer = _stream_with_kcat(kafka_cfg, topic, count, rate)
        stack.wait_trained(dict.fromkeys(DEVICES, 20), 60, watch=(bridge, trainer, coordinator))
        bridge.kill()  # SIGKILL: its open transaction is left to the next start to abort
        time.sleep(1.0)
        bridge.start().wait_for(r"bridging .* into the topics", 60)
        assert writer.wait(60) == 0, writer.stderr.read() if writer.stderr else ""
        cfg = _config(kafka_cfg, job, topic)
        tallies = _bridged_through(cfg, count, 60, lambda: None)
        per_device = _good_per_device(count)
        assert _assert_exactly_once(tallies, count) == sum(per_device.values())
        stack.wait_trained(per_device, 90, watch=(bridge, trainer, coordinator))
        assert bridge.stop(30) == 0, bridge.tail()
        assert trainer.stop(60) == 0, trainer.tail()
        assert coordinator.stop(30) == 0, coordinator.tail()
        fates, _feedback = stack.account(per_device)
        # Lag 0: each rank committed its topic's end, past the last commit marker (no record is ever there).
        ends = high_watermarks(kafka_cfg, DEVICES)
        assert committed_offsets(kafka_cfg, stack.config().trainer_group_id, DEVICES) == ends
        assert all(ends[d] > per_device[d] for d in DEVICES)  # markers took offsets: the topics have gaps
    finally:
        stack.cleanup()
    assert bridge.starts == 2
    # The device topics, written in transactions (markers, an aborted transaction's records): every sample
    # trained, nothing lost, nothing left as lag, nothing written twice.
    assert_nothing_lost(fates)


def test_a_broker_killed_mid_transaction_loses_and_duplicates_nothing(
        broker_factory: Callable[..., EmbeddedBroker], tmp_path: Path) -> None:
    broker = broker_factory(heap="512m")
    bootstrap = broker.start()
    kafka = KafkaConfig(bootstrap_servers=bootstrap, topic_prefix="bxk")
    topic, count = "bxk-events", 900
    ensure_topics(make_admin(kafka), [TopicSpec(topic, 3)])
    stack = FaultStack(kafka, tmp_path, "bxk", DEVICES)
    # Long transactions: the kill lands inside one, with samples and offsets of it in flight.
    bridge = Service("bridge", _bridge_args(stack, topic, **{"bridge.transaction_seconds": 2.0,
                                                               "bridge.transaction_records": 5000}),
                     tmp_path / "bridge.log")
    stack.services.append(bridge)
    producer = make_producer(kafka)
    written = threading.Event()

    def write() -> None:
        for i, (key, line) in enumerate(_lines(count, seed=5)):
            producer.produce(topic, key=key.encode(), value=line.encode())
            producer.poll(0)
            if i % 10 == 9:
                time.sleep(0.1)  # ~100 records/s: ~9 s of stream
        assert producer.flush(120) == 0
        written.set()

    cfg = _config(kafka, "bxk", topic)
    try:
        bridge.start().wait_for(r"bridging .* into the topics", 60)
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        bridge.wait_for(r"assigned .*\[0\]", 30)
        time.sleep(3.0)
        broker.kill()
        time.sleep(3.0)
        assert broker.start() == bootstrap
        writer.join(150)
        assert written.is_set()

        def alive() -> None:
            assert bridge.alive(), f"the bridge did not ride out the broker's restart:\n{bridge.tail()}"

        tallies = _bridged_through(cfg, count, 90, alive)
        assert bridge.stop(30) == 0, bridge.tail()
    finally:
        stack.cleanup()
    assert _assert_exactly_once(tallies, count) == sum(_good_per_device(count).values())
    assert "Traceback" not in bridge.log.read_text(errors="replace"), bridge.tail()
