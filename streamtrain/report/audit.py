"""Audit a deployment `up` did not start: what became of every record of every device topic, from Kafka alone.

The same accounting as a local run's report (`ledger.collect_records` and `tally_devices`): the device topics,
the trainers' committed offsets, the feedback (what each step trained and truncation dropped) and the dead-letter
topic put each record in one bin — trained, truncated, dead-lettered, pending (at or above the committed offset:
resumable) or unaccounted (processed past with no record of its fate). The versions' lineage comes from the models
topic: per device, the offset below which the newest version trained everything.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from streamtrain.config import StreamtrainConfig
from streamtrain.kafka import read_to_end
from streamtrain.report.ledger import DeviceTally, collect_records, tally_devices
from streamtrain.wire import ModelVersion, WireError, decode

__all__ = ["Audit", "audit_deployment"]


@dataclass(frozen=True)
class Audit:
    """One deployment's accounting, per device, and its newest model version."""

    job: str
    tallies: list[DeviceTally]
    newest_version: ModelVersion | None
    """The newest version the models topic announces for the job (None: none yet)."""
    versions: int
    """Versions announced for the job."""
    unreadable: int
    """Records of the feedback, plan or dead-letter topics that did not decode (warned about while reading)."""

    @property
    def unaccounted(self) -> int:
        return sum(t.fates.unaccounted for t in self.tallies)

    @property
    def trained(self) -> int:
        return sum(t.fates.trained for t in self.tallies)

    @property
    def records(self) -> int:
        return sum(t.fates.records for t in self.tallies)

    def failures(self) -> list[str]:
        """Why the audit fails (empty: it passes): a record unaccounted for, or records but none trained."""
        out = [f"device {t.device}: {t.fates.unaccounted:,} records unaccounted for (offsets "
               f"{[int(o) for o in t.fates.lost[:5]]}{'...' if len(t.fates.lost) > 5 else ''} processed past with "
               "no record of being trained, truncated or dead-lettered)"
               for t in self.tallies if t.fates.unaccounted]
        if self.records and not self.trained:
            out.append(f"{self.records:,} records in the device topics and none trained")
        return out

    def summary(self) -> dict[str, Any]:
        """The audit as JSON: per device the bins (as a run report holds them) and the newest version's lineage."""
        lineage = self.newest_version.offsets if self.newest_version is not None else {}
        return {
            "job": self.job, "records": self.records, "trained": self.trained, "unaccounted": self.unaccounted,
            "versions": self.versions,
            "newest_version": None if self.newest_version is None else {
                "version": self.newest_version.version, "step": self.newest_version.step, "lineage": lineage},
            "unreadable": self.unreadable,
            "devices": [{**t.summary(), "in_newest_version": lineage.get(t.device)} for t in self.tallies],
            "failures": self.failures(),
        }


def newest_version(cfg: StreamtrainConfig, timeout: float) -> tuple[ModelVersion | None, int]:
    """The newest version the models topic announces for the job, and how many it announces."""
    newest: ModelVersion | None = None
    count = 0
    for msg in read_to_end(cfg.kafka, [cfg.kafka.topics.models], timeout):
        with contextlib.suppress(WireError):
            version = decode(msg.value(), msg.headers(), ModelVersion)
            if version.job == cfg.job:
                count += 1
                newest = version if newest is None or version.version > newest.version else newest
    return newest, count


def audit_deployment(cfg: StreamtrainConfig, devices: Sequence[str], timeout: float = 60.0,
                     stop: Callable[[], bool] | None = None) -> Audit:
    """Read the deployment's topics and offsets back and account for every record of `devices`' topics.

    Args:
        cfg: How to reach the cluster (a principal that may read every topic under the prefix and describe the
            trainers' group: the admin role), the job and the topic prefix.
        devices: The devices whose topics to account.
        timeout: Seconds each topic may take to deliver its records.
        stop: Checked while reading (Ctrl-C).

    Raises:
        ledger.ReadInterrupted, TimeoutError, KafkaException: as `collect_records`.
    """
    run = collect_records(cfg, devices, timeout, stop=stop)
    # A deployment goes on while it is read: what it trained after the device topics were read is not counted.
    tallies = tally_devices(cfg, run, running=True)
    newest, count = newest_version(cfg, timeout)
    return Audit(cfg.job, tallies, newest, count, run.unreadable)
