"""The cluster tests' one use of the project's accounting: every produced sample of a run, in one bin.

Everything is read back from Kafka by `stack.ledger.collect_records` (device topics, committed offsets,
feedback, plans, dead letters) and set against what the ranks handed to their steps (the seq logs of
the trainer tests' collate plug-in) by `streamtrain.accounting.account_device`. Only this module knows
how accounting is done, so moving to another form of it (by record: topic, partition, offset) is an
edit here, not in every test.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from stack.ledger import collect_records
from streamtrain.accounting import SeqFates, account_device
from streamtrain.config import StreamtrainConfig
from streamtrain.wire import Assignment, StepFeedback

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "trainer"))
from trainer_seq_log import read_ledger  # the trainer tests' helper


@dataclass(frozen=True)
class RunAccount:
    """What became of every sample, and the run's feedback and plans as Kafka holds them."""

    fates: dict[str, SeqFates]
    feedback: list[StepFeedback]
    assignments: list[Assignment]

    def lost(self) -> dict[str, int]:
        """Per device: acknowledged samples neither trained, truncated nor dead-lettered (missing from the topic,
        skipped past, or still pending at the end)."""
        return {d: len(f.lost) + len(f.missing) + len(f.pending) + f.undecodable + len(f.foreign)
                for d, f in self.fates.items()}

    def duplicates(self) -> dict[str, int]:
        """Per device: trainings of a sample beyond its first (and samples written twice to the topic)."""
        return {d: f.duplicates + f.topic_duplicates for d, f in self.fates.items()}

    def largest_batch(self) -> dict[str, int]:
        """Per device: the most samples one of its steps trained (the bound on what a crash may retrain)."""
        return {d: max((fb.samples for fb in self.feedback if fb.device_id == d), default=0) for d in self.fates}


def account_run(config: StreamtrainConfig, devices: Sequence[str], seq_dir: Path,
                produced: Mapping[str, int]) -> RunAccount:
    """Read the run back and account for `produced[d]` samples (seqs 0..n-1) of each device."""
    run = collect_records(config, devices, timeout=60)
    ledger = read_ledger(seq_dir, devices)
    topics = config.kafka.topics
    fates = {}
    for device in devices:
        topic = topics.device(device)
        fates[device] = account_device(
            device, [(r.offset, r.seq) for r in run.records[device]], ledger,
            dead_offsets={d.offset for d in run.dead_letters if d.topic == topic},
            truncated=sum(f.dropped for f in run.feedback if f.device_id == device),
            committed=run.committed.get((topic, 0)), expected=produced[device])
    return RunAccount(fates, run.feedback, run.assignments)


def trained_counts(seq_dir: Path, devices: Sequence[str]) -> dict[str, int]:
    """Distinct samples handed to a step so far, per device."""
    ledger = read_ledger(seq_dir, devices)
    return {d: sum(1 for c in ledger.counts(d).values() if c) for d in devices}
