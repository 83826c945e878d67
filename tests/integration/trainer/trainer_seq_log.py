"""A collate plug-in for the end-to-end trainer tests: the default packing, plus a log of what it packed.

Set `trainer.collate=trainer_seq_log:collate` (with this directory on PYTHONPATH) and
TRAINER_TEST_SEQ_LOG=<dir> (not STREAMTRAIN_*, which `--local-ranks` does not pass on): every rank
process appends one line `<device_id> <seq>` per sample it hands to a step to `<dir>/<pid>.log`,
before the step's forward pass. A seq in these logs was given to a step; one logged twice was
trained twice (or given to a step that died with its rank).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from confluent_kafka import TopicPartition

from streamtrain.config import KafkaConfig
from streamtrain.config.trainer import TrainerConfig
from streamtrain.kafka import make_consumer, read_to_end
from streamtrain.models.batching import PackedBatch, collate_packed
from streamtrain.models.plugins import PROBE_DEVICE
from streamtrain.report.accounting import SeqLedger
from streamtrain.wire import Sample, StepFeedback

ENV = "TRAINER_TEST_SEQ_LOG"


def collate(samples: Sequence[Sample], config: TrainerConfig) -> PackedBatch:
    """`collate_packed`, after appending the samples' (device, seq) to this process's log (not the start-up
    probe's: those never reach a step)."""
    if samples and samples[0].device_id != PROBE_DEVICE:
        lines = "".join(f"{s.device_id} {s.seq}\n" for s in samples).encode()
        fd = os.open(Path(os.environ[ENV]) / f"{os.getpid()}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, lines)  # one write per step: a SIGKILL cannot leave half a batch
        finally:
            os.close(fd)
    return collate_packed(samples, config)


def read_ledger(log_dir: Path, devices: Iterable[str] | None = None) -> SeqLedger:
    """Every (device, seq) the logs in `log_dir` name, counted (optionally only the given devices)."""
    wanted = set(devices) if devices is not None else None
    ledger = SeqLedger()
    for path in sorted(log_dir.glob("*.log")):
        for line in path.read_text().splitlines():
            device, seq = line.split()
            if wanted is None or device in wanted:
                ledger.add(device, int(seq))
    return ledger


def train_settings(kafka: KafkaConfig, job: str, checkpoint_dir: Path, **extra: object) -> list[str]:
    """`--set` arguments of a small, fast CPU trainer on `kafka` that logs its seqs with this plug-in."""
    sets: dict[str, object] = {
        "job": job, "kafka.bootstrap_servers": kafka.bootstrap_servers, "kafka.topic_prefix": kafka.topic_prefix,
        "metrics.port": 0, "trainer.device": "cpu", "trainer.torch_threads": 1, "trainer.hidden_size": 16,
        "trainer.num_layers": 1, "trainer.plan_wait_seconds": 0.05, "trainer.data_wait_seconds": 0.2,
        "trainer.log_every": 5,
        "trainer.checkpoint_dir": str(checkpoint_dir), "trainer.collate": "trainer_seq_log:collate",
        "trainer.startup_profile": False,  # the collate logs what it packs as trained: a profile packs, not trains
        **extra,
    }
    return [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]


def rank_environment(log_dir: Path) -> dict[str, str]:
    """Environment of a trainer command: this directory importable, seqs logged to `log_dir`."""
    here = str(Path(__file__).resolve().parent)
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, ENV: str(log_dir), "PYTHONUNBUFFERED": "1"}


def committed_offsets(kafka: KafkaConfig, group: str, devices: Sequence[str]) -> dict[str, int]:
    """The trainers' committed offset of each device topic (negative when none)."""
    consumer = make_consumer(kafka, group)
    try:
        parts = consumer.committed([TopicPartition(kafka.topics.device(d), 0) for d in devices], timeout=30)
    finally:
        consumer.close()
    return {d: int(tp.offset) for d, tp in zip(devices, parts, strict=True)}


def high_watermarks(kafka: KafkaConfig, devices: Sequence[str]) -> dict[str, int]:
    """Records in each device topic (its end offset)."""
    consumer = make_consumer(kafka, "watermarks")
    try:
        return {d: int(consumer.get_watermark_offsets(TopicPartition(kafka.topics.device(d), 0), timeout=30)[1])
                for d in devices}
    finally:
        consumer.close()


def feedback_records(kafka: KafkaConfig) -> list[StepFeedback]:
    """Every StepFeedback on the feedback topic."""
    from feedback_records import step_feedback  # here: the ranks import this module as a plug-in, without tests/

    return step_feedback(read_to_end(kafka, [kafka.topics.feedback]))
