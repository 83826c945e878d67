"""`bench kafka`'s DeviceProducer comparison: rendered with its ratio and verdict, absent from older results."""

from __future__ import annotations

from pathlib import Path

from benchmarks.common import RenderContext
from benchmarks.kafka import KafkaResult, render_kafka

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "bench" / "kafka.json"


def _with_device(result: KafkaResult, bare: float, device: float) -> KafkaResult:
    return result.model_copy(update={
        "records_per_s": {**result.records_per_s, "bare_loop": [bare], "device_producer": [device]},
        "records_per_s_median": {**result.records_per_s_median, "bare_loop": bare, "device_producer": device},
        "device_producer_vs_bare_loop": device / bare})


def test_the_pair_is_rendered_with_its_ratio_against_the_target(tmp_path: Path) -> None:
    base = KafkaResult.load(COMMITTED)
    ctx = RenderContext(tmp_path, tmp_path)
    met = render_kafka(_with_device(base, 50_000.0, 45_000.0), ctx)
    assert "| `DeviceProducer.send` of the same samples | 45,000 |" in met
    assert "| confluent-kafka `produce` loop, `Sample`s encoded beforehand | 50,000 |" in met
    assert "back to back): 0.90\N{MULTIPLICATION SIGN} **met** (target: within 20%" in met
    assert "0.50\N{MULTIPLICATION SIGN} **not met**" in render_kafka(_with_device(base, 50_000.0, 25_000.0), ctx)


def test_a_result_from_before_the_pair_renders_without_it(tmp_path: Path) -> None:
    text = render_kafka(KafkaResult.load(COMMITTED), RenderContext(tmp_path, tmp_path))
    assert "DeviceProducer" not in text
