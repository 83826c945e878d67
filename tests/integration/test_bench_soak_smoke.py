"""`bench soak` end to end, small: 8 S2 streams, one rank, truncate then bounded, RSS of every process."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamtrain.benchmarks.soak import SoakResult, SoakSetup, run_soak
from streamtrain.config import KafkaConfig, StreamtrainConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # ~50 s: the services start, then 30 s of load


@pytest.mark.timeout(150)
def test_soak_samples_every_process_and_keeps_backlog_bounded(kafka_cfg: KafkaConfig, tmp_path: Path) -> None:
    setup = SoakSetup(minutes=0.5, devices=8, ranks=1, producer_procs=2, sample_every_s=1.0, start_timeout_s=90)
    doc = run_soak(StreamtrainConfig(kafka=kafka_cfg), setup, tmp_path, external=True)

    assert SoakResult.load(tmp_path / "soak.json") == doc
    assert (tmp_path / "soak.png").stat().st_size > 1000
    assert doc.setup.devices == 8 and doc.setup.ranks == 1
    assert [p.truncation for p in doc.phases] == ["truncate", "bounded"]
    # Every process the benchmark runs has RSS samples: producers, each phase's coordinator, the rank, itself.
    expected = {"bench", "producer-0", "producer-1", "coordinator-truncate", "coordinator-bounded", "rank-0"}
    assert expected <= set(doc.processes)
    n = len(doc.series.t)
    assert n >= 10
    for name in expected:
        proc = doc.processes[name]
        assert proc.samples >= n // 3 and proc.peak_rss_mb > 10
        assert len(doc.series.rss_mb[name]) == n
    assert "broker" not in doc.processes  # an external broker's memory is not ours to measure
    # The streams ran (about 2,400 samples/s) and the seven devices without a rank were consumed by truncation.
    assert doc.produced_records > 20_000
    assert doc.follower_commits > 0 and doc.follower_errors == 0
    truncate = doc.phases[0]
    assert truncate.retained_records_peak < doc.produced_records / 4
    assert truncate.retained_slope_records_per_min_second_half is not None
    assert truncate.lag_slope_records_per_min_second_half is not None
