"""`bench truncation` end to end, small: persist vs truncate on the real broker with real services."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamtrain.benchmarks.truncation import TruncationResult, TruncationSetup, against_persist, run_truncation
from streamtrain.config import KafkaConfig, StreamtrainConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # ~40 s: two coordinator + rank start-ups


@pytest.mark.timeout(150)
def test_truncate_retains_far_fewer_records_than_persist(kafka_cfg: KafkaConfig, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # Enough steps that the run outlasts the coordinator's 0.5 s lag poll (its DeleteRecords cadence) many times over.
    # b_max pinned: a smaller cap makes steps shorter and the run (in seconds) with them.
    setup = TruncationSetup(devices=1, steps=300, b_max=32, policies=("persist", "truncate"), hidden_size=16,
                            num_layers=1, heldout=200, sample_every_s=0.3, start_timeout_s=90, run_timeout_s=60)
    doc = run_truncation(StreamtrainConfig(kafka=kafka_cfg), setup, tmp_path, external=True)
    console = capsys.readouterr().out

    assert TruncationResult.load(tmp_path / "truncation.json") == doc
    assert (tmp_path / "truncation.png").stat().st_size > 1000
    cells, ratios = {c.policy: c for c in doc.cells}, against_persist(doc)
    assert list(cells) == ["persist", "truncate"]
    for cell in cells.values():
        assert cell.accuracy is not None and 0.0 <= cell.accuracy <= 1.0
        assert cell.final_loss is not None and ratios[cell.policy][0] is not None
        assert cell.trained_samples > 0
        curve = doc.series[cell.policy]
        assert len(curve.step) == len(curve.retained_records) == len(curve.buffer_depth) > 3
        assert curve.step[-1] >= setup.steps
        assert f"{cell.policy:<8} step {setup.steps:>4}/{setup.steps}: broker retains" in console  # its last line
    persist, truncate = cells["persist"], cells["truncate"]
    # Persistence keeps every record produced; truncation drops (and deletes on the broker) all but the newest.
    assert persist.retained_records_final == persist.produced_records > 500
    assert persist.truncated == 0 and persist.deleted_records == 0
    assert truncate.truncated > 0 and truncate.deleted_records > 0
    assert truncate.retained_records_final * 4 < persist.retained_records_final
    # The stored ratio is rounded to 0.1: the strict 4x is the raw counts' (above).
    assert (ratios["truncate"][0] or 0) >= 4
    assert truncate.buffer_depth_final < persist.buffer_depth_final or persist.buffer_depth_final == 0
