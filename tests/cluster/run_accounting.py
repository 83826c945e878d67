"""The cluster tests' one use of the project's accounting: every produced record of a run, in one bin.

Everything is read back from Kafka by `streamtrain.report.ledger.collect_records` (device topics, committed offsets,
feedback, plans, dead letters) and binned by record (topic, partition, offset) by
`streamtrain.report.ledger.tally_devices`,
as `streamtrain up` and the fault tests do. The seq logs of the trainer tests' collate plug-in add what the
ranks handed to their steps, crashed steps included, so a sample trained twice is seen even when the feedback
of its first training died with its node. Only this module knows how accounting is done.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from streamtrain.config import StreamtrainConfig
from streamtrain.report.accounting import RecordFates
from streamtrain.report.ledger import collect_records, tally_devices
from streamtrain.wire import Assignment, StepFeedback

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "trainer"))
from trainer_seq_log import read_ledger  # the trainer tests' helper


@dataclass(frozen=True)
class RunAccount:
    """What became of every record, and the run's feedback and plans as Kafka holds them."""

    fates: dict[str, RecordFates]
    seqs_missing: dict[str, int]
    """Per device: samples its producer acknowledged (seqs 0..n-1) that the topic does not hold."""
    trained_twice: dict[str, int]
    """Per device: hand-overs of a sample to a step beyond its first, from the ranks' seq logs."""
    feedback: list[StepFeedback]
    assignments: list[Assignment]

    def lost(self) -> dict[str, int]:
        """Per device: acknowledged samples neither trained, truncated nor dead-lettered (missing from the topic,
        processed past with no fate, named but never held, or still pending at the end)."""
        return {d: f.unaccounted + f.pending + self.seqs_missing[d] for d, f in self.fates.items()}

    def duplicates(self) -> dict[str, int]:
        """Per device: trainings of a sample beyond its first (by the seq logs or the feedback, whichever saw
        more), and records written twice to the topic."""
        return {d: max(self.trained_twice[d], f.retrained) + f.written_twice for d, f in self.fates.items()}

    def largest_batch(self) -> dict[str, int]:
        """Per device: the most samples one of its steps trained (the bound on what a crash may retrain)."""
        return {d: max((fb.samples for fb in self.feedback if fb.device_id == d), default=0) for d in self.fates}


def account_run(config: StreamtrainConfig, devices: Sequence[str], seq_dir: Path,
                produced: Mapping[str, int]) -> RunAccount:
    """Read the run back and account for every record, and for `produced[d]` samples (seqs 0..n-1) of each."""
    run = collect_records(config, devices, timeout=60)
    ledger = read_ledger(seq_dir, devices)
    fates, missing, twice = {}, {}, {}
    for tally in tally_devices(config, run):
        device, records = tally.device, run.records[tally.device]
        fates[device] = tally.fates
        held = np.unique(records.seqs[records.decoded])
        missing[device] = produced[device] - int(np.isin(np.arange(produced[device]), held).sum())
        twice[device] = sum(c - 1 for c in ledger.counts(device).values() if c > 1)
    return RunAccount(fates, missing, twice, run.feedback, run.assignments)


def trained_counts(seq_dir: Path, devices: Sequence[str]) -> dict[str, int]:
    """Distinct samples handed to a step so far, per device."""
    ledger = read_ledger(seq_dir, devices)
    return {d: sum(1 for c in ledger.counts(d).values() if c) for d in devices}
