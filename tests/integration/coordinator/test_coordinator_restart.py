"""`streamtrain coordinate` as a process: SIGKILLed between steps, restarted, it plans the next step."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from coordinator_it_helpers import JOB, Plans, Trainers, produce_samples

from streamtrain.cli_support import module_command
from streamtrain.config import KafkaConfig

pytestmark = [pytest.mark.integration, pytest.mark.faults]

REPO = Path(__file__).resolve().parents[3]


@contextmanager
def coordinator_process(kafka_cfg: KafkaConfig, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "STREAMTRAIN_KAFKA__BOOTSTRAP_SERVERS": kafka_cfg.bootstrap_servers,
           "STREAMTRAIN_KAFKA__TOPIC_PREFIX": kafka_cfg.topic_prefix, "STREAMTRAIN_JOB": JOB}
    cmd = module_command("coordinator", "coordinate", "--policy", "chronica", "--port", "0", sets={
        "coordinator.devices": ["cam"], "coordinator.poll_interval_seconds": 0.2, "coordinator.global_batch": 8,
        "coordinator.feedback_wait_seconds": 5})
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def test_sigkilled_coordinator_resumes_at_the_step_after_the_last_feedback(kafka_cfg: KafkaConfig,
                                                                          tmp_path: Path) -> None:
    sizes = produce_samples(kafka_cfg, {"cam": 40})
    held = set(range(40))
    trainers, plans = Trainers(kafka_cfg), Plans(kafka_cfg)
    log = tmp_path / "coordinator.log"

    def report(step: int, new: range = range(0)) -> None:
        trainers.report(step, "cam", 0, [(o, sizes["cam"][o]) for o in new], lowest=min(held, default=40),
                        depth=len(held))

    try:
        with coordinator_process(kafka_cfg, log) as proc:
            report(10, range(40))
            p11 = plans.wait(11, timeout=60)  # includes the process's start-up
            proc.kill()
            proc.wait(10)
        first = set(p11.for_device("cam").offsets)  # type: ignore[union-attr]
        assert first and p11.policy == "chronica"
        held -= first
        # The trainer ran step 11 while no coordinator was up; its feedback waits in Kafka.
        report(11)
        with coordinator_process(kafka_cfg, log) as proc:
            p12 = plans.wait(12, timeout=60)
            assert proc.poll() is None
            second = set(p12.for_device("cam").offsets)  # type: ignore[union-attr]
            assert second and second <= held  # nothing trained before the crash is planned again
            held -= second
            report(12)
            plans.wait(13)
        # A fresh coordinator may publish its warm-start plan for step 0 before it reads the first
        # feedback (trainers past step 0 ignore it); every other plan is the next step's, once.
        assert sorted(plans.seen) in ([11, 12, 13], [0, 11, 12, 13]), log.read_text()[-3000:]
    finally:
        trainers.close()
        plans.close()
