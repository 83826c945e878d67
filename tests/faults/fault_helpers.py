"""What the whole-stack fault tests share: the services as real CLI processes, and the accounting at the end.

Each service runs as `python -m streamtrain.cli ...` in its own session (so a SIGKILL reaches the
process group: the `--local-ranks` launcher and its ranks, or one service alone). `account` reads the
run back from Kafka exactly as the run report does (device topics, dead letters, feedback, committed
offsets) and puts every record in one bin by its offset: trained, truncated, dead-lettered, pending or
lost. The trainer also logs every (device, seq) it hands to a step through the seq-log collate plug-in
of the trainer tests: the witness of what was really trained, against which the feedback is checked,
and which counts the samples a crash made a rank train twice.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from streamtrain.config import KafkaConfig, StreamtrainConfig
from streamtrain.report.accounting import RecordFates
from streamtrain.report.ledger import collect_records, tally_devices
from streamtrain.wire import StepFeedback, expand_ranges

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "trainer"))
from trainer_seq_log import rank_environment, read_ledger, train_settings  # the trainer tests' helper

from streamtrain.runtime.commands import CLI_MODULE, module_command

REPO = Path(__file__).resolve().parents[2]


class Service:
    """One CLI process (own session) with its output in `log`."""

    def __init__(self, name: str, args: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> None:
        self.name, self.args, self.log = name, list(args), log
        self.env = dict(env) if env is not None else {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> Service:
        with self.log.open("ab") as out:
            out.write(f"\n===== start {self.starts + 1} of {self.name} =====\n".encode())
            out.flush()
            self.proc = subprocess.Popen(module_command(CLI_MODULE, *self.args), cwd=REPO,
                                         env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        """Send `sig` to the service's whole process group (a launcher and its ranks alike)."""
        os.killpg(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the process group and reap the process."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (to the main process only: a launcher forwards it) and wait; returns the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not stop within {timeout} s:\n{self.tail()}") from None

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.signal(signal.SIGCONT)
                self.signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(30)

    def tail(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def wait_for(self, pattern: str, timeout: float, since: int = 0) -> re.Match[str]:
        """Wait for `pattern` in the log (from character `since`); fails if the process exits first."""
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, self.log.read_text(errors="replace")[since:])
            if found:
                return found
            code = self.proc.returncode if self.proc else None
            assert self.alive(), f"{self.name} exited with {code}:\n{self.tail()}"
            assert time.monotonic() < deadline, f"no {pattern!r} from {self.name} in {timeout} s:\n{self.tail()}"
            time.sleep(0.1)


class FaultStack:
    """Producers, a coordinator and `--local-ranks` trainers of one job as processes, on `kafka`.

    Args:
        kafka: The broker and topic prefix of this test.
        tmp: The test's temporary directory (logs, seq logs, checkpoints).
        job: The job name.
        devices: Device ids; one rank each.
        coordinator: Extra `coordinator.*` settings.
        trainer: Extra `trainer.*` settings.
    """

    def __init__(self, kafka: KafkaConfig, tmp: Path, job: str, devices: Sequence[str],
                 coordinator: Mapping[str, object] | None = None, trainer: Mapping[str, object] | None = None) -> None:
        self.kafka, self.tmp, self.job, self.devices = kafka, tmp, job, tuple(devices)
        self.seq_dir = tmp / "seqs"
        self.seq_dir.mkdir(exist_ok=True)
        self.env = rank_environment(self.seq_dir)
        ids = ",".join(f'"{d}"' for d in self.devices)
        self.base = [x for k, v in {
            "job": job, "kafka.bootstrap_servers": kafka.bootstrap_servers, "kafka.topic_prefix": kafka.topic_prefix,
            "metrics.port": 0,
        }.items() for x in ("--set", f"{k}={v}")]
        coord = {"devices": f"[{ids}]", "poll_interval_seconds": 0.2, "feedback_wait_seconds": 0.5,
                 "kafka_timeout_seconds": 10.0, **(coordinator or {})}
        self.coordinator_args = [*self.base, *(x for k, v in coord.items() for x in ("--set", f"coordinator.{k}={v}")),
                                 "coordinate", "--port", "0"]
        trainer_sets = {"trainer.num_classes": 4, "trainer.local_batch": 16, "trainer.plan_wait_seconds": 1.0,
                        "trainer.checkpoint_every": 1, "trainer.log_every": 1,
                        **{f"trainer.{k}": v for k, v in (trainer or {}).items()}}
        self.trainer_args = [*train_settings(kafka, job, tmp / "ckpt", **trainer_sets),
                             "train", "--local-ranks", str(len(self.devices)), "--devices", ",".join(self.devices)]
        self.services: list[Service] = []

    def service(self, name: str, args: Sequence[str]) -> Service:
        svc = Service(name, args, self.tmp / f"{name}.log", self.env)
        self.services.append(svc)
        return svc

    def coordinator(self) -> Service:
        return self.service("coordinator", self.coordinator_args)

    def trainer(self) -> Service:
        return self.service("trainer", self.trainer_args)

    def start_trainer(self, timeout: float = 90.0) -> Service:
        """Start the ranks and wait until every one has joined and started consuming."""
        trainer = self.trainer().start()
        for rank in range(len(self.devices)):
            trainer.wait_for(rf"rank {rank} \(\S+\): resuming at step", timeout)
        return trainer

    def producer(self, name: str, devices: Sequence[str], per_device: int, rate: float, seed: int = 1) -> Service:
        """`streamtrain produce` of `per_device` samples to each of `devices` at `rate` samples/s each."""
        ids = ",".join(f'"{d}"' for d in devices)
        return self.service(name, [
            *self.base, "--set", f"producer.device_ids=[{ids}]", "--set", "producer.metrics=false",
            "--set", "producer.synthetic.classes=4",
            "produce", "--devices", str(len(devices)), "--max-samples", str(per_device), "--rate", str(rate),
            "--rate-kind", "constant", "--size-kind", "fixed", "--size", "8", "--duration", "120", "--seed", str(seed),
            "--no-progress"])

    def cleanup(self) -> None:
        for svc in self.services:
            svc.cleanup()

    # ---- progress ----------------------------------------------------------------------------------------

    def trained_seqs(self) -> dict[str, int]:
        """Distinct seqs handed to a step so far, per device."""
        ledger = read_ledger(self.seq_dir, self.devices)
        return {d: sum(1 for c in ledger.counts(d).values() if c) for d in self.devices}

    def wait_trained(self, want: Mapping[str, int], timeout: float, watch: Sequence[Service] = ()) -> None:
        """Wait until each device has at least `want[d]` distinct seqs trained; `watch` must stay alive."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.trained_seqs()
            if all(got[d] >= n for d, n in want.items()):
                return
            for svc in watch:
                assert svc.alive(), f"{svc.name} exited:\n{svc.tail()}"
            assert time.monotonic() < deadline, f"trained {got}, waiting for {dict(want)}:\n" + "\n".join(
                f"--- {s.name}\n{s.tail(3000)}" for s in self.services)
            time.sleep(0.2)

    def rank_metrics_urls(self, trainer: Service) -> dict[str, str]:
        """Each rank's /metrics URL, by device, from the trainer log of its latest start."""
        text = trainer.log.read_text(errors="replace").rsplit("===== start", 1)[-1]
        found = re.findall(r"rank \d+ \((\S+)\): metrics on (http://\S+/metrics)", text)
        return dict(found)

    # ---- the end -------------------------------------------------------------------------------------------

    def config(self) -> StreamtrainConfig:
        return StreamtrainConfig(job=self.job, kafka=self.kafka)

    def account(self, expected: Mapping[str, int]) -> tuple[dict[str, DeviceFate], list[StepFeedback]]:
        """Read the run back from Kafka (every record in one bin, by offset) and check it against the seq logs.

        Args:
            expected: Samples each device's producer sent (its seqs 0..n-1: these tests' producers number so).
        """
        cfg = self.config()
        run = collect_records(cfg, self.devices, timeout=60)
        ledger = read_ledger(self.seq_dir, self.devices)
        out = {}
        for tally in tally_devices(cfg, run):
            device, records = tally.device, run.records[tally.device]
            claimed = np.concatenate([expand_ranges(f.trained_offsets) for f in run.feedback if f.device_id == device]
                                     or [np.zeros(0, np.int64)])
            logged = ledger.counts(device)
            claimed_seqs = records.seqs[records.decoded & np.isin(records.offsets, claimed)]
            seqs = np.unique(records.seqs[records.decoded])
            out[device] = DeviceFate(
                device=device, expected=expected[device], fates=tally.fates,
                seqs_missing=expected[device] - int(np.isin(np.arange(expected[device]), seqs).sum()),
                trained_twice=sum(c - 1 for c in logged.values() if c > 1),
                claimed_not_logged=sum(1 for s in claimed_seqs.tolist() if not logged[s]))
        return out, run.feedback


def scrape(url: str) -> dict[str, float]:
    """One /metrics page as {sample name: value} (labels dropped: one rank per page)."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@dataclass(frozen=True)
class DeviceFate:
    """One device after a fault test: its records' fates by offset, and what its seq log says was trained."""

    device: str
    expected: int
    """Samples its producer sent."""
    fates: RecordFates
    seqs_missing: int
    """Seqs 0..expected-1 of the producer that are not in the topic (a sample never delivered)."""
    trained_twice: int
    """Trainings beyond the first, per the seq log (at-least-once after a crash)."""
    claimed_not_logged: int
    """Records the feedback says were trained whose seq the seq log never saw (the feedback would be lying)."""


def assert_nothing_lost(accounts: Mapping[str, DeviceFate], max_duplicates: int = 0) -> None:
    """Every record trained, truncated or dead-lettered, nothing pending; at most `max_duplicates` retrainings per
    device; and the feedback claims no training the seq logs did not see."""
    for acc in accounts.values():
        fates = acc.fates
        assert fates.complete, (acc, fates.summary(), fates.lost[:20], fates.unknown[:20])
        assert fates.records == acc.expected and acc.seqs_missing == 0 and fates.written_twice == 0, acc
        assert fates.trained + fates.truncated + fates.dead_lettered == fates.records, fates.summary()
        assert acc.claimed_not_logged == 0, acc
        assert acc.trained_twice <= max_duplicates and fates.retrained <= max_duplicates, (acc, fates.summary())
