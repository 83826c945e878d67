"""One training job on the shared test bed: its coordinator, trainer nodes and producer, its progress, its end.

Every job has its own name, topic prefix, consumer group, rendezvous id and checkpoints, so the jobs of
successive tests on the same three Kafka nodes never see each other. The ranks log every sample they
hand to a step (the trainer tests' seq-log collate plug-in), which is how progress is watched and, at
the end, how duplicates are counted.
"""

from __future__ import annotations

import itertools
import os
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from run_accounting import RunAccount, account_run, trained_counts

from streamtrain.cluster.bed import ClusterBed
from streamtrain.cluster.topology import TRAINER_HOSTS, ClusterSpec
from streamtrain.config import StreamtrainConfig
from streamtrain.wire import StepFeedback

SEQ_LOG_PLUGIN_DIR = Path(__file__).resolve().parents[1] / "integration" / "trainer"
Report = Callable[[dict[str, Any]], None]
"""The `report_figures` fixture: records a test's figures."""


class ClusterJob:
    """A job on `bed`, configured for tests: small CPU model, a fast coordinator, every sample logged.

    Args:
        bed: the test bed (its Kafka nodes running).
        tmp: the test's directory (seq logs).
        name: job name, also its topic prefix.
        spec: the bed's settings for this job (collective timeout, ...).
        trainer: extra `trainer.*` settings.
    """

    def __init__(self, bed: ClusterBed, tmp: Path, name: str, spec: ClusterSpec | None = None,
                 trainer: Mapping[str, Any] | None = None) -> None:
        self.bed, self.name = bed, name
        self.seq_dir = tmp / "seqs"
        self.seq_dir.mkdir(parents=True, exist_ok=True)
        path = os.pathsep.join(p for p in (str(SEQ_LOG_PLUGIN_DIR), os.environ.get("PYTHONPATH")) if p)
        self.spec = replace(spec or ClusterSpec(), trainer_env={"PYTHONPATH": path,
                                                                "TRAINER_TEST_SEQ_LOG": str(self.seq_dir)})
        self.devices = self.spec.devices
        self.config = StreamtrainConfig.model_validate({
            "job": name,
            "kafka": {"bootstrap_servers": bed.bootstrap, "topic_prefix": name, "replication_factor": 3},
            "trainer": {"num_classes": 4, "hidden_size": 16, "num_layers": 1, "log_every": 1,
                        "collate": "trainer_seq_log:collate", "plan_wait_seconds": 1.0, "data_wait_seconds": 0.2,
                        "startup_profile": False,  # the collate logs what it packs as trained: a profile packs only
                        **(trainer or {})},
            "coordinator": {"poll_interval_seconds": 0.5, "feedback_wait_seconds": 0.5, "kafka_timeout_seconds": 10.0},
            "producer": {"synthetic": {"classes": 4}},
        })

    def start(self, timeout: float = 300.0) -> None:
        """Start the coordinator, then both trainer nodes; return once every rank serves its metrics."""
        self.bed.configure(self.config, self.spec)
        self.bed.start("coordinator")
        self.bed.wait_coordinator(timeout)
        for host in TRAINER_HOSTS:
            self.bed.start(host)
        self.wait(lambda: all(self.bed.ranks_answering(h) == 2 for h in TRAINER_HOSTS), timeout,
                  "every rank of both trainer nodes answering")

    def produce(self, per_device: int, rate: float) -> None:
        """Start the producer host: `per_device` samples to every device at `rate` samples/s each."""
        self.bed.start("producer", self.bed.topology(self.config).producer(per_device, rate))

    def begin(self, per_device: int, rate: float, trained_first: int = 100) -> None:
        """Start the job and its streams; return once every device has trained `trained_first` samples."""
        self.start()
        self.produce(per_device, rate)
        self.wait_trained(dict.fromkeys(self.devices, trained_first), 180)

    # ---- progress ----------------------------------------------------------------------------------

    def trained(self) -> dict[str, int]:
        """Distinct samples trained so far, per device."""
        return trained_counts(self.seq_dir, self.devices)

    def wait(self, check: Callable[[], bool], timeout: float, what: str, interval: float = 0.5) -> float:
        """Wait for `check()`; fails naming `what`, with the services' log tails. Returns the seconds waited."""
        began = time.monotonic()
        while not check():
            if time.monotonic() - began > timeout:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; trained "
                                     f"{self.trained()}\n{self.log_tails()}")
            time.sleep(interval)
        return time.monotonic() - began

    def wait_trained(self, want: Mapping[str, int], timeout: float) -> float:
        """Wait until each device in `want` has at least that many distinct samples trained."""
        return self.wait(lambda: all(self.trained()[d] >= n for d, n in want.items()), timeout,
                         f"trained samples {dict(want)}")

    def log_tails(self, chars: int = 2500) -> str:
        parts = []
        for host in ("coordinator", *TRAINER_HOSTS, "producer"):
            path = self.bed.log_path(host)
            text = path.read_text(errors="replace")[-chars:] if path.exists() else ""
            parts.append(f"--- {host} (alive: {self.bed.alive(host)})\n{text}")
        return "\n".join(parts)

    # ---- the end -----------------------------------------------------------------------------------

    def finish(self, per_device: int, timeout: float = 300.0) -> RunAccount:
        """Wait until every produced sample is trained, stop the job cleanly, read it back and account for it."""
        self.wait_trained(dict.fromkeys(self.devices, per_device), timeout)
        self.wait(lambda: not self.bed.alive("producer"), 60, "the producer ending after its last sample")
        codes = self.bed.stop_job(timeout=90)
        assert codes["producer"] == 0, f"the producer failed deliveries (exit {codes['producer']}):\n{self.log_tails()}"
        return account_run(self.config, self.devices, self.seq_dir, dict.fromkeys(self.devices, per_device))

    def stop(self) -> None:
        """Stop whatever of the job still runs (a test that failed midway)."""
        self.bed.stop_job(timeout=30)


def step_times(feedback: list[StepFeedback]) -> list[float]:
    """When each rank reported a completed step (seconds since the epoch), in order."""
    return sorted(f.sent_at / 1000.0 for f in feedback)


#: A time without completed steps longer than this is a pause: longer than a report hold (trainer.hold_max_seconds) or a
#: late plan's wait (trainer.plan_wait_seconds), which a fault-free run also has.
PAUSE_S = 2.0


def resume_figures(feedback: list[StepFeedback], fault_at: float, window_s: float) -> dict[str, float]:
    """How training went through a fault at `fault_at` (epoch seconds), from the steps the ranks reported.

    Returns:
        next_step_s: from the fault to the first step completed after it;
        stall_s: the longest time without any completed step, from the last step before the fault to
            `window_s` after it;
        resumed_s: from the fault to the end of that stall when it was a pause (longer than `PAUSE_S`):
            training resumed; else training never stopped, and this is the next step.
    """
    times = step_times(feedback)
    before = [t for t in times if t <= fault_at]
    after = [t for t in times if fault_at < t <= fault_at + window_s]
    assert after, "no step completed after the fault"
    points = [before[-1] if before else fault_at, *after]
    stall, stall_end = max((b - a, b) for a, b in itertools.pairwise(points))
    resumed_at = stall_end if stall > PAUSE_S else after[0]
    return {"next_step_s": round(after[0] - fault_at, 2), "stall_s": round(stall, 2),
            "resumed_s": round(resumed_at - fault_at, 2)}


def accounting_figures(account: RunAccount) -> dict[str, Any]:
    """Samples lost and duplicated per device, and the bound on duplicates (the largest batch of a step)."""
    return {"lost": account.lost(), "duplicates": account.duplicates(), "largest_batch": account.largest_batch(),
            "trained": {d: f.trained for d, f in account.fates.items()}}


def assert_nothing_lost_duplicates_bounded(account: RunAccount) -> None:
    """0 acknowledged samples lost; each device retrained at most one step's batch."""
    assert all(n == 0 for n in account.lost().values()), account.fates
    bound = account.largest_batch()
    for device, dup in account.duplicates().items():
        assert dup <= bound[device], (device, dup, bound[device], account.fates[device])


def coordinator_gauge(bed: ClusterBed, name: str, device: str) -> float | None:
    """One per-device sample of the coordinator's /metrics (e.g. lag_records), or None when it does not answer."""
    try:
        with urllib.request.urlopen(f"{bed.coordinator_url}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"streamtrain_coordinator_{name}" and sample.labels.get("device") == device:
                return float(sample.value)
    return None


def restarts(bed: ClusterBed, host: str) -> int:
    """How many times a trainer node's ranks started after their first start (group restarts)."""
    text = bed.log_path(host).read_text(errors="replace").rsplit("===== start", 1)[-1]
    return max(0, text.count(": resuming at step") // 2 - 1)
