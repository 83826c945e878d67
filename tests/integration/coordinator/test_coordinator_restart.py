"""`streamtrain coordinate` as a process: SIGKILLed between steps, restarted, it plans the next step (and,
with plans made a step ahead, the one after the plan it had already published)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from coordinator_it_helpers import JOB, Plans, Trainers, produce_samples

from streamtrain.config import KafkaConfig
from streamtrain.runtime.commands import module_command

pytestmark = [pytest.mark.integration, pytest.mark.faults]

REPO = Path(__file__).resolve().parents[3]


@contextmanager
def coordinator_process(kafka_cfg: KafkaConfig, log: Path, ahead: int) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "STREAMTRAIN_KAFKA__BOOTSTRAP_SERVERS": kafka_cfg.bootstrap_servers,
           "STREAMTRAIN_KAFKA__TOPIC_PREFIX": kafka_cfg.topic_prefix, "STREAMTRAIN_JOB": JOB}
    cmd = module_command("streamtrain.coordinator", "coordinate", "--policy", "chronica", "--port", "0", sets={
        "coordinator.devices": ["cam"], "coordinator.poll_interval_seconds": 0.2, "coordinator.global_batch": 8,
        "coordinator.feedback_wait_seconds": 5, "coordinator.plan_ahead": ahead})
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


@pytest.mark.parametrize("ahead", [0, 1])
def test_sigkilled_coordinator_resumes_with_the_plan_after_the_last_one(kafka_cfg: KafkaConfig, tmp_path: Path,
                                                                        ahead: int) -> None:
    sizes = produce_samples(kafka_cfg, {"cam": 40})
    held = set(range(40))
    trainers, plans = Trainers(kafka_cfg), Plans(kafka_cfg)
    log = tmp_path / "coordinator.log"

    def report(step: int, new: range = range(0)) -> None:
        trainers.report(step, "cam", 0, [(o, sizes["cam"][o]) for o in new], lowest=min(held, default=40),
                        depth=len(held))

    def offsets(step: int) -> set[int]:
        part = plans.wait(step, timeout=60).for_device("cam")  # the first wait includes the process's start-up
        assert part is not None and part.offsets
        return set(part.offsets)

    try:
        with coordinator_process(kafka_cfg, log, ahead) as proc:
            report(10, range(40))
            # Step 10's feedback: the plan for step 11, which the ranks need now, and with plans made ahead the
            # one for step 12 from the state after it (plan 11's samples taken): disjoint, both from step 10.
            out = [offsets(s) for s in range(11, 12 + ahead)]
            proc.kill()
            proc.wait(10)
        assert plans.seen[11].policy == "chronica" and plans.seen[11 + ahead].basis_step == 10
        assert not ahead or not out[0] & out[1]
        held -= out[0]
        # The trainer ran step 11 while no coordinator was up; its feedback waits in Kafka.
        report(11)
        with coordinator_process(kafka_cfg, log, ahead) as proc:
            # The restarted coordinator replays plans and feedback and plans the step after its last plan:
            # nothing trained, nothing still in flight, is planned again.
            nxt = 12 + ahead
            again = offsets(nxt)
            assert proc.poll() is None and plans.seen[nxt].basis_step == 11
            in_flight = out[1] if ahead else set()  # plan 12, published before the crash
            assert again and again <= held - in_flight
            held -= out[1] if ahead else again  # what step 12 trains
            report(12)
            plans.wait(nxt + 1)
        # A fresh coordinator may publish its warm-start plan (step 0) before it reads the first feedback
        # (trainers past that step ignore it); every other plan is published once.
        later = list(range(11, nxt + 2))
        assert sorted(plans.seen) in (later, [0, *later]), log.read_text()[-3000:]
    finally:
        trainers.close()
        plans.close()
