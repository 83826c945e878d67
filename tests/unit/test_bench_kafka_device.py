"""`bench kafka`'s DeviceProducer comparison: judged on the median of the repeats' ratios, absent from older
results."""

from __future__ import annotations

from pathlib import Path

from benchmarks.kafka import KafkaResult, kafka_targets, render_kafka

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "bench" / "kafka.json"


def _with_device(result: KafkaResult, bare: list[float], device: list[float]) -> KafkaResult:
    return result.model_copy(update={"records_per_s": {**result.records_per_s, "bare_loop": bare,
                                                       "device_producer": device}})


def test_the_pair_is_judged_on_the_median_of_each_repeats_ratio() -> None:
    base = KafkaResult.load(COMMITTED)
    # Repeat 2's load slowed both sides: its ratio (0.9) counts like the others, its absolute rates do not.
    met = _with_device(base, [50_000.0, 20_000.0, 50_000.0], [45_000.0, 18_000.0, 46_000.0])
    assert met.device_vs_bare() == 0.9
    text = render_kafka(met)
    assert "| `DeviceProducer.send` of the same samples | 45,000 |" in text
    assert "| confluent-kafka `produce` loop, `Sample`s encoded beforehand | 50,000 |" in text
    assert "| 0.90\N{MULTIPLICATION SIGN} | **met** |" in text
    (target,) = kafka_targets(_with_device(base, [50_000.0], [25_000.0]))
    assert target.met is False and target.measured == "0.50\N{MULTIPLICATION SIGN}"


def test_a_result_from_before_the_pair_renders_without_it() -> None:
    committed = KafkaResult.load(COMMITTED)
    result = committed.model_copy(update={"records_per_s": {"kafka_perf_tool": committed.records_per_s[
        "kafka_perf_tool"]}})
    assert result.device_vs_bare() is None and kafka_targets(result) == []
    assert "DeviceProducer" not in render_kafka(result)
