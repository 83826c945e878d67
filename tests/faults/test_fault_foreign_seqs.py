"""A device topic whose samples come from a producer that numbers them its own way (seqs from 2·10^9, with
gaps), with some undecodable records: the run is accounted record by record in seconds, in bounded memory,
with nothing unaccounted (trained, dead-lettered, or pending: not processed yet), and the read stops
promptly when asked to (Ctrl-C)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from fault_helpers import REPO, Service

from streamtrain.config import KafkaConfig, StreamtrainConfig
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin, make_producer, produce
from streamtrain.report.ledger import ReadInterrupted, collect_records
from streamtrain.wire import Sample, encode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "trainer"))
from trainer_seq_log import committed_offsets, rank_environment, train_settings  # the trainer tests' helper

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.slow]

JOB = "foreign"
RECORDS = 100_000
GARBAGE = 25  # undecodable records among them (the trainer dead-letters them)
STEPS = 12
BATCH = 256
#: Peak resident memory the report may take for RECORDS records.
REPORT_RSS_LIMIT_MB = 500

_REPORT = textwrap.dedent("""
    import json, resource, sys, time
    from streamtrain.report.ledger import collect_records, tally_devices
    from streamtrain.report.figures import build_report, build_series
    from streamtrain.config import StreamtrainConfig
    def peak_rss_mb():
        # VmHWM: the peak of this program's own memory (getrusage's ru_maxrss may keep the forking parent's).
        status = open("/proc/self/status").read()
        return int(status.split("VmHWM:")[1].split()[0]) / 1024
    cfg = StreamtrainConfig.model_validate_json(sys.argv[1])
    began = time.monotonic()
    run = collect_records(cfg, ["0"], timeout=120)
    report = build_report(run, tally_devices(cfg, run)).model_dump()
    build_series(run)
    took = time.monotonic() - began
    print(json.dumps({**{k: v for k, v in report.items() if k.startswith(("samples_", "records_"))},
                      "dead_letter_reasons": report["dead_letter_reasons"], "seconds": took,
                      "cpu_seconds": resource.getrusage(resource.RUSAGE_SELF).ru_utime, "peak_rss_mb": peak_rss_mb()}))
""")


def _produce_foreign(kafka: KafkaConfig) -> int:
    """RECORDS records into device 0's topic: samples numbered from 2e9 with random gaps, and some garbage."""
    topic = kafka.topics.device("0")
    ensure_topics(make_admin(kafka), [TopicSpec.from_config(kafka, topic)])
    rng = np.random.default_rng(5)
    seqs = 2_000_000_000 + np.cumsum(rng.integers(1, 1000, size=RECORDS))
    garbage = set(rng.choice(RECORDS, size=GARBAGE, replace=False).tolist())
    producer = make_producer(kafka, **{"linger.ms": 20})
    payload = rng.standard_normal((2, 16)).astype(np.float32)
    for i, seq in enumerate(seqs.tolist()):
        if i in garbage:
            produce(producer, topic, b"\x00not avro", [("st-schema", b"0000")])
        else:
            produce(producer, topic, *encode(Sample.from_array("0", seq, payload, label=i % 4)))
    assert producer.flush(120) == 0
    return RECORDS


def test_foreign_numbering_is_accounted_in_seconds_and_bounded_memory(kafka_cfg: KafkaConfig, tmp_path: Path) -> None:
    _produce_foreign(kafka_cfg)
    (tmp_path / "seqs").mkdir()
    sets = train_settings(kafka_cfg, JOB, tmp_path / "ckpt", **{
        "trainer.num_classes": 4, "trainer.local_batch": BATCH, "trainer.checkpoint_every": 1,
        "trainer.max_steps": STEPS, "trainer.collate": "streamtrain.models.batching:collate_packed"})
    trainer = Service("trainer", [*sets, "train", "--local-ranks", "1", "--devices", "0"], tmp_path / "trainer.log",
                      rank_environment(tmp_path / "seqs")).start()
    try:
        assert trainer.proc is not None and trainer.proc.wait(240) == 0, trainer.tail()  # STEPS local-plan steps
    finally:
        trainer.cleanup()
    committed = committed_offsets(kafka_cfg, f"{JOB}.trainers", ["0"])["0"]
    assert 0 < committed < RECORDS  # some trained, most left in the topic

    cfg = StreamtrainConfig(job=JOB, kafka=kafka_cfg)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMTRAIN_")}
    out = subprocess.run([sys.executable, "-c", _REPORT, cfg.model_dump_json()], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["samples_produced"] == RECORDS and report["samples_unaccounted"] == 0, report
    # Local plans train oldest first: everything below the committed offset was trained or dead-lettered (and
    # garbage the rank had read past the commit is dead-lettered already); the rest is pending, not lost.
    assert 0 < report["samples_trained"] <= STEPS * BATCH and report["samples_duplicated"] == 0, report
    assert report["samples_trained"] + report["samples_dead_lettered"] >= committed, report
    assert report["samples_trained"] + report["samples_dead_lettered"] + report["samples_pending"] == RECORDS
    garbage_seen = report["samples_dead_lettered"]  # those below the point the rank read to
    assert 0 <= garbage_seen <= GARBAGE and report["dead_letter_reasons"] == (
        {"unknown-schema": garbage_seen} if garbage_seen else {}), report
    assert report["records_written_twice"] == 0
    assert report["seconds"] < 60, report  # the records' numbering plays no part in the time
    assert report["peak_rss_mb"] < REPORT_RSS_LIMIT_MB, report
    print(f"report of {RECORDS:,} records: {report['seconds']:.1f} s ({report['cpu_seconds']:.1f} s of CPU), "
          f"peak RSS {report['peak_rss_mb']:.0f} MB")

    # Asked to stop (a Ctrl-C), the read stops within about a poll, whatever is left to read.
    calls = 0

    def stop() -> bool:
        nonlocal calls
        calls += 1
        return calls > 3

    began = time.monotonic()
    with pytest.raises(ReadInterrupted):
        collect_records(cfg, ["0"], timeout=120, stop=stop)
    assert time.monotonic() - began < 10
