"""Samples written to device topics by something other than streamtrain (a Java program, kcat, an older
streamtrain), trained by streamtrain's own services, every record accounted by its offset.

`train_outside_devices` is the one place these tests start streamtrain around such devices: today the
coordinator and `streamtrain train --local-ranks N` as processes (the fault tests' `FaultStack`); when
`streamtrain up --external` lands it is the natural replacement, and only this function changes.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from streamtrain.config import KafkaConfig
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin
from streamtrain.report.accounting import RecordFates

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "faults"))
from fault_helpers import FaultStack  # the whole-stack tests' services as processes, and their accounting

JOB = "outside"


def create_device_topics(kafka: KafkaConfig, devices: Sequence[str]) -> None:
    """Create the device topics as streamtrain would (one partition each) before an outside writer uses them."""
    ensure_topics(make_admin(kafka), [TopicSpec.from_config(kafka, kafka.topics.device(d)) for d in devices])


def train_outside_devices(kafka: KafkaConfig, tmp: Path, written: Mapping[str, int], *, features: int,
                          classes: int = 4, timeout: float = 150.0) -> dict[str, RecordFates]:
    """Train every sample already written to the device topics, stop, and account each record.

    Args:
        kafka: the broker and this test's topic prefix.
        tmp: the test's directory (logs, checkpoints, the trainers' seq logs).
        written: device → distinct seqs its topic holds; the run stops once every one was trained.
        features: the trainer's features per frame (the samples' shape[1]).
        classes: the trainer's classes (every label is below it).
        timeout: seconds to wait for the training.

    Returns:
        Device → what became of each record of its topic (trained, dead-lettered, ..., unaccounted).
    """
    stack = FaultStack(kafka, tmp, JOB, list(written), trainer={"num_features": features, "num_classes": classes})
    try:
        coordinator = stack.coordinator().start()
        trainer = stack.start_trainer()
        stack.wait_trained(written, timeout, watch=(coordinator, trainer))
        assert trainer.stop(60) == 0, trainer.tail()
        assert coordinator.stop(30) == 0, coordinator.tail()
    finally:
        stack.cleanup()
    accounts, _feedback = stack.account(written)
    return {device: account.fates for device, account in accounts.items()}


def assert_all_trained(fates: Mapping[str, RecordFates], written: Mapping[str, int]) -> None:
    """Every record of every device topic decoded and trained: none dead-lettered, pending or unaccounted."""
    for device, fate in fates.items():
        summary = (device, fate.summary())
        assert fate.records == written[device] and fate.undecodable == 0, summary
        assert fate.trained == fate.records and fate.dead_lettered == 0 and fate.truncated == 0, summary
        assert fate.unaccounted == 0 and fate.complete and fate.written_twice == 0, summary
