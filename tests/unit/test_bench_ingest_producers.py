"""`bench ingest`'s producers: each pair judged on the median of the repeats' ratios, a producer not measured
judged as not measured (never as met)."""

from __future__ import annotations

from pathlib import Path

from streamtrain.benchmarks.ingest import IngestResult, ingest_targets, render_ingest

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "bench" / "ingest.json"
TIMES = "\N{MULTIPLICATION SIGN}"


def _with(result: IngestResult, **rates: list[float]) -> IngestResult:
    return result.model_copy(update={"records_per_s": rates})


def _target(result: IngestResult, starts: str) -> tuple[str, bool | None]:
    target = next(t for t in ingest_targets(result) if t.goal.startswith(starts))
    return target.measured, target.met


def test_the_committed_result_measured_every_producer_in_every_repeat() -> None:
    result = IngestResult.load(COMMITTED)
    assert set(result.records_per_s) == {"kafka_perf_tool", "bare_loop", "device_producer", "replay_producers"}
    assert all(len(v) == result.repeats and min(v) > 0 for v in result.records_per_s.values())
    assert result.ratio("device_producer", "bare_loop") is not None


def test_each_pair_is_judged_on_the_median_of_each_repeats_ratio() -> None:
    base = IngestResult.load(COMMITTED)
    # Repeat 2's load slowed both sides: its ratio (0.9) counts like the others, its absolute rates do not.
    met = _with(base, kafka_perf_tool=[40_000.0, 16_000.0, 40_000.0], bare_loop=[50_000.0, 20_000.0, 50_000.0],
                device_producer=[44_000.0, 18_000.0, 46_000.0], replay_producers=[10_000.0, 12_000.0, 30_000.0])
    assert met.ratio("device_producer", "bare_loop") == 0.9
    assert _target(met, "`DeviceProducer`") == (f"0.90{TIMES}", True)
    # 0.25, 0.75, 0.75: the median of the ratios (0.75) passes; the ratio of the medians (0.3) would not.
    assert _target(met, "unpaced replay") == (f"0.75{TIMES}", True)
    text = render_ingest(met)
    assert "| `DeviceProducer.send` of the same samples | 44,000 | 1.10\N{MULTIPLICATION SIGN} |" in text
    assert "| confluent-kafka `produce` loop, `Sample`s encoded beforehand | 50,000 |" in text
    slow = _with(base, bare_loop=[50_000.0], device_producer=[25_000.0])
    assert _target(slow, "`DeviceProducer`") == (f"0.50{TIMES}", False)


def test_a_producer_not_measured_is_not_judged() -> None:
    result = _with(IngestResult.load(COMMITTED), kafka_perf_tool=[40_000.0])
    assert result.ratio("device_producer", "bare_loop") is None
    assert _target(result, "`DeviceProducer`") == ("not measured", None)
    assert _target(result, "unpaced replay") == ("not measured", None)
    assert "DeviceProducer" not in render_ingest(result).split("| producer |", 1)[1]


def test_kafka_s_tool_gets_the_python_producers_settings_and_their_batch_size() -> None:
    from streamtrain.benchmarks.ingest import perf_settings
    from streamtrain.config import KafkaConfig

    assert perf_settings(KafkaConfig()) == {"acks": "all", "enable.idempotence": "true", "linger.ms": "5",
                                            "compression.type": "lz4", "batch.size": "1000000"}
