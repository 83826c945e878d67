"""The producers against the real broker: rates, sizes, labels, sharding, injection, read back from Kafka."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from streamtrain.cli import app
from streamtrain.config import KafkaConfig, ProducerConfig
from streamtrain.kafka import read_to_end
from streamtrain.producers.service import ProducerSummary, StreamProducer
from streamtrain.producers.synthetic import device_label_sets
from streamtrain.report.accounting import SeqLedger
from streamtrain.runtime.commands import module_command
from streamtrain.wire import SIZE_HEADER, Sample, decode

pytestmark = pytest.mark.integration


def run(kafka_cfg: KafkaConfig, registry: CollectorRegistry | None = None, **settings: Any) -> tuple[
        StreamProducer, ProducerSummary, dict[str, list[Sample]]]:
    """Run a producer with `settings`, then read every device topic back from the broker."""
    cfg = ProducerConfig.model_validate({"metrics": False, **settings})
    producer = StreamProducer(kafka_cfg, cfg, registry=registry)
    summary = producer.run()
    assert summary.ok, summary.failures[:5]
    samples: dict[str, list[Sample]] = {d: [] for d in producer.ids}
    for msg in read_to_end(kafka_cfg, producer.topics):
        sample = decode(msg.value(), msg.headers(), Sample)
        assert msg.topic() == kafka_cfg.topics.device(sample.device_id)
        assert dict(msg.headers() or [])[SIZE_HEADER] == str(sample.size).encode()
        samples[sample.device_id].append(sample)
    ledger = SeqLedger()
    for device, got in samples.items():
        for s in got:
            ledger.add(device, s.seq)
        account = ledger.account(device, len(got))
        assert account.exact, account  # seqs 0..n-1, each once: nothing lost, nothing doubled
    return producer, summary, samples


def achieved_rate(samples: list[Sample]) -> float:
    """Samples per second between a device's first and last production time."""
    times = sorted(s.produced_at for s in samples)
    return (len(times) - 1) / ((times[-1] - times[0]) / 1000.0)


def test_constant_rate_is_achieved_and_every_sample_read_back(kafka_cfg: KafkaConfig) -> None:
    registry = CollectorRegistry()
    _producer, summary, samples = run(kafka_cfg, registry, devices=4, duration_seconds=3.0,
                                      rate={"kind": "constant", "mean": 200})
    for device, got in samples.items():
        assert len(got) == pytest.approx(600, rel=0.05)
        assert achieved_rate(got) == pytest.approx(200, rel=0.05)
        assert registry.get_sample_value("streamtrain_producer_samples_sent_total", {"device": device}) == len(got)
        assert registry.get_sample_value("streamtrain_producer_samples_failed_total", {"device": device}) == 0
        bytes_sent = registry.get_sample_value("streamtrain_producer_sent_bytes_total", {"device": device})
        assert bytes_sent is not None and bytes_sent > 45 * 16 * 4 * len(got)
    assert summary.mean_rates == pytest.approx(np.full(4, 200.0), rel=0.05)
    assert registry.get_sample_value("streamtrain_producer_target_rate_samples_per_second", {"device": "0"}) == 200


@pytest.mark.parametrize(("kind", "mean", "std"), [("uniform", 120.0, 50.0), ("normal", 150.0, 40.0)])
def test_sampled_rates_are_achieved_per_device(kafka_cfg: KafkaConfig, kind: str, mean: float, std: float) -> None:
    producer, _summary, samples = run(kafka_cfg, devices=4, duration_seconds=3.0, seed=3,
                                      rate={"kind": kind, "mean": mean, "std": std})
    assert len(set(producer.base_rates.round(3).tolist())) == 4  # the devices really differ
    for d, device in enumerate(producer.ids):
        assert achieved_rate(samples[device]) == pytest.approx(producer.base_rates[d], rel=0.05)


def test_rate_schedule_is_followed(kafka_cfg: KafkaConfig) -> None:
    _p, _s, samples = run(kafka_cfg, devices=2, duration_seconds=3.0, rate={
        "mean": 60, "schedule": [{"at_seconds": 0, "factor": 1}, {"at_seconds": 1.5, "factor": 4}]})
    for got in samples.values():
        t0 = min(s.produced_at for s in got)
        early = sum(1 for s in got if s.produced_at - t0 < 1500)
        late = len(got) - early
        assert early == pytest.approx(1 + 60 * 1.5, abs=5)
        assert late == pytest.approx(240 * 1.5, rel=0.05)


def test_replayed_trace_is_followed(kafka_cfg: KafkaConfig, tmp_path: Path) -> None:
    trace = tmp_path / "trace.txt"
    trace.write_text("0.5\n2\n")
    _p, _s, samples = run(kafka_cfg, devices=1, duration_seconds=4.0, rate={"mean": 100, "trace": str(trace)})
    got = samples["0"]
    t0 = min(s.produced_at for s in got)
    per_second = Counter(int((s.produced_at - t0) // 1000) for s in got)
    assert [per_second[i] for i in range(4)] == pytest.approx([51, 200, 50, 200], abs=6)


@pytest.mark.parametrize(("size", "n"), [
    ({"kind": "fixed", "mean": 45}, 500),
    ({"kind": "normal", "mean": 45, "dif": 16}, 5000),
    ({"kind": "normal", "mean": 45, "dif": 32}, 5000),
    ({"kind": "lognormal", "mean": 45, "dif": 64}, 10000),
])
def test_sizes_read_back_match_mean_and_dif(kafka_cfg: KafkaConfig, size: dict[str, Any], n: int) -> None:
    _p, _s, samples = run(kafka_cfg, devices=2, duration_seconds=None, max_samples=n // 2, rate={"kind": "unlimited"},
                          size=size, synthetic={"features": 4})
    sizes = np.asarray([s.size for got in samples.values() for s in got])
    assert len(sizes) == n and sizes.min() >= 1
    assert all(s.shape == (s.size, 4) for got in samples.values() for s in got)
    dif = size.get("dif", 0)
    assert sizes.mean() == pytest.approx(45, abs=max(0.5, 3 * dif / np.sqrt(n)))
    assert sizes.std(ddof=1) == pytest.approx(dif, rel=0.15 if size["kind"] == "lognormal" else 0.05, abs=0.01)


def test_non_iid_devices_publish_only_their_labels(kafka_cfg: KafkaConfig) -> None:
    _p, _s, samples = run(kafka_cfg, devices=4, duration_seconds=None, max_samples=200, rate={"kind": "unlimited"},
                          synthetic={"classes": 8, "labels_per_device": 2})
    sets = device_label_sets(4, 8, 2)
    for d in range(4):
        assert {s.label for s in samples[str(d)]} == set(sets[d].tolist())


def test_injection_counts_on_the_topics(kafka_cfg: KafkaConfig) -> None:
    # 4 devices, alpha 0.5 -> 2 recipients, beta 0.25 of 16-sample rounds -> 4 samples; 4 rounds each
    _producer, summary, samples = run(kafka_cfg, devices=4, duration_seconds=None, max_samples=64,
                                      rate={"kind": "unlimited"}, synthetic={"labels_per_device": 1},
                                      injection={"alpha": 0.5, "beta": 0.25, "round_samples": 16})
    injected = [s for got in samples.values() for s in got if "injected_from" in s.metadata]
    assert len(injected) == 4 * 4 * 4 * 2
    for device, got in samples.items():
        own = [s for s in got if "injected_from" not in s.metadata]
        assert len(own) == 64
        assert all(s.metadata["injected_from"] != device for s in got if s in injected)
        assert {s.label for s in own} == {int(device)}  # non-IID: one class per device ...
        assert len({s.label for s in got}) > 1  # ... which injection mixes
    assert int(summary.final.injected.sum()) == len(injected)


def _write_classes(root: Path, counts: dict[int, int], rng: np.random.Generator) -> None:
    for cls, n in counts.items():
        (root / str(cls)).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            np.save(root / str(cls) / f"s{i}.npy", (rng.standard_normal((int(rng.integers(5, 20)), 3)) + cls)
                    .astype(np.float32))


def test_stratified_dataset_keeps_class_proportions_per_device(kafka_cfg: KafkaConfig, tmp_path: Path) -> None:
    _write_classes(tmp_path, {0: 48, 1: 24, 2: 8}, np.random.default_rng(0))
    (tmp_path / "1" / "corrupt.npy").write_bytes(b"\x93NUMPY\x01\x00broken")
    _p, summary, samples = run(kafka_cfg, devices=4, duration_seconds=None, rate={"kind": "unlimited"},
                               dataset={"path": str(tmp_path), "sharding": "stratified", "loop": False})
    assert [Path(s.path).name for s in summary.skipped_files] == ["corrupt.npy"]  # reported, rest published
    assert sum(len(v) for v in samples.values()) == 80
    for got in samples.values():
        assert Counter(s.label for s in got) == {0: 12, 1: 6, 2: 2}
        assert all(s.metadata["source"].startswith("s") for s in got)


def test_distribution_aware_dataset_broadcasts_sparse_neighbourhoods(kafka_cfg: KafkaConfig, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    rows = [rng.standard_normal((6, 3)) * 0.2 + c for c in (0.0, 10.0) for _ in range(24)]
    rows += [np.full((6, 3), 90.0), np.full((6, 3), 90.5)]  # a neighbourhood of 2 < 4 devices
    np.savez(tmp_path / "data.npz", x=np.stack(rows).astype(np.float32), y=np.array([0] * 24 + [1] * 24 + [2, 2]))
    _p, _s, samples = run(kafka_cfg, devices=4, duration_seconds=None, rate={"kind": "unlimited"},
                          dataset={"path": str(tmp_path), "sharding": "distribution-aware", "neighbourhoods": 3,
                                   "loop": False})
    for got in samples.values():
        assert sum(1 for s in got if s.label == 2) == 2  # every device has the sparse neighbourhood
        assert len(got) == 12 + 2
    assert sum(1 for got in samples.values() for s in got if s.label != 2) == 48  # dense ones split once


def test_produce_command_publishes_and_summarises(kafka_cfg: KafkaConfig) -> None:
    env = {"STREAMTRAIN_KAFKA__BOOTSTRAP_SERVERS": kafka_cfg.bootstrap_servers,
           "STREAMTRAIN_KAFKA__TOPIC_PREFIX": kafka_cfg.topic_prefix}
    result = CliRunner().invoke(app, ["produce", "--devices", "2", "--duration", "1.5", "--rate", "40",
                                      "--no-progress"], env=env)
    assert result.exit_code == 0, result.output
    assert "records delivered, 0 failed" in result.output
    got = list(read_to_end(kafka_cfg, [kafka_cfg.topics.device("0"), kafka_cfg.topics.device("1")]))
    assert len(got) == pytest.approx(2 * 61, abs=4)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_produce_stops_on_sigterm_or_sigint_and_flushes_every_record(kafka_cfg: KafkaConfig, signum: int) -> None:
    """Run until stopped (the service default); the signal ends the stream with every accepted record delivered,
    also when SIGINT was ignored at start, as a background job inherits it."""
    env = {**os.environ, "STREAMTRAIN_KAFKA__BOOTSTRAP_SERVERS": kafka_cfg.bootstrap_servers,
           "STREAMTRAIN_KAFKA__TOPIC_PREFIX": kafka_cfg.topic_prefix, "STREAMTRAIN_PRODUCER__METRICS": "false"}
    argv = module_command("streamtrain.producers", "produce", "--devices", "2", "--rate", "300", "--no-progress")
    proc = subprocess.Popen(argv,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    topics = [kafka_cfg.topics.device("0"), kafka_cfg.topics.device("1")]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(read_to_end(kafka_cfg, topics))) < 200:
        time.sleep(0.5)
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert ("stopped by interrupt" if signum == signal.SIGINT else "stopped by SIGTERM") in out
    delivered = int(re.search(r"([\d,]+) records delivered, 0 failed", out).group(1).replace(",", ""))  # type: ignore[union-attr]
    samples = [decode(m.value(), m.headers(), Sample) for m in read_to_end(kafka_cfg, topics)]
    assert len(samples) == delivered >= 200
    ledger = SeqLedger()
    for s in samples:
        ledger.add(s.device_id, s.seq)
    for device in ("0", "1"):
        assert ledger.account(device, sum(s.device_id == device for s in samples)).exact
