"""`streamtrain up --secure --truncation persist` end to end, with forgeries written as the broker's super user.

The one identity the ACLs cannot stop (the broker's own) writes what the issue saw ruin a persist run: plans
that truncate far past the high watermark or at all, with NaN weights, for a step a million ahead, with offsets
past the end for one device only; feedback with NaN, negative and impossible timings and a step a million
ahead; and a sample claiming another device in a device topic. The ranks reject the plans (each rank its own
part; the step lines up), the coordinator the feedback, the rank of device 0 dead-letters the foreign sample
without training it; the run discards nothing and accounts for every sample.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import TopicPartition
from feedback_records import step_feedback

from streamtrain.broker import EmbeddedBroker
from streamtrain.config import BrokerConfig, KafkaConfig
from streamtrain.kafka import make_consumer, make_producer, read_to_end
from streamtrain.runtime.commands import CLI_MODULE, module_command
from streamtrain.wire import Assignment, DeadLetter, DevicePlan, Sample, StepFeedback, decode, encode, now_ms

pytestmark = pytest.mark.faults

JOB = "streamtrain"  # `up`'s default job, whose plans the ranks follow


def _children(pid: int) -> dict[int, str]:
    out = {}
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
    return out


def _wait(what: str, done: Callable[[], bool], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s; up's output:\n{log.read_text()[-4000:]}"
        time.sleep(0.5)


def _feedback(kafka: KafkaConfig) -> list[StepFeedback]:
    return [f for f in step_feedback(read_to_end(kafka, [kafka.topics.feedback], timeout=30)) if f.job == JOB]


def _ends(kafka: KafkaConfig, devices: tuple[str, ...]) -> dict[str, int]:
    consumer = make_consumer(kafka, "forger-probe")
    try:
        return {d: int(consumer.get_watermark_offsets(TopicPartition(kafka.topics.device(d), 0), timeout=10)[1])
                for d in devices}
    finally:
        consumer.close()


def test_forged_plans_feedback_and_samples_change_nothing_in_a_secure_persist_run(tmp_path: Path) -> None:
    out, log = tmp_path / "run", tmp_path / "up.log"
    cmd = module_command(CLI_MODULE, "up", "--secure", "--truncation", "persist", "--devices", "2", "--duration", "150",
                         "--no-prometheus", "--no-live", "--out", str(out))
    up = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"})
    try:
        _wait("the stack up", lambda: "stack up:" in log.read_text() or up.poll() is not None, 300, log)
        assert up.poll() is None, log.read_text()[-4000:]
        assert "security: SASL/SCRAM with ACLs" in log.read_text()
        # The forger: the broker's own super user (no ACL applies to it).
        kafka = EmbeddedBroker(BrokerConfig(data_dir=out / "kafka")).own_identity(KafkaConfig(topic_prefix=JOB))
        devices = ("0", "1")
        _wait("steps under way", lambda: len({f.step for f in _feedback(kafka)}) >= 5, 120, log)
        (coordinator,) = [pid for pid, cmdline in _children(up.pid).items() if " coordinate " in cmdline]
        forger = make_producer(kafka)

        # Plans only: with the coordinator paused, nothing replaces the forged ones before their steps run.
        os.kill(coordinator, signal.SIGSTOP)
        try:
            time.sleep(1.0)
            last = max(f.step for f in _feedback(kafka))
            ends = _ends(kafka, devices)
            far = {d: e + 1_000_000 for d, e in ends.items()}
            forged = [
                Assignment(JOB, last + 2, "forged", 0.1, 2, 1.0, tuple(
                    DevicePlan(d, 0.1, 0.5, count=1, truncate_before=far[d]) for d in devices)),
                Assignment(JOB, last + 3, "forged", 0.1, 2, 1.0, tuple(
                    DevicePlan(d, 0.1, 0.5, count=1, truncate_before=1) for d in devices)),
                Assignment(JOB, last + 4, "forged", 0.1, 2, 1.0, (
                    DevicePlan("0", 0.1, 0.5, count=1), DevicePlan("1", 0.1, 0.5, offsets=(far["1"],)))),
                Assignment(JOB, last + 5, "forged", 0.1, 2, 1.0, tuple(
                    DevicePlan(d, 0.1, float("nan"), count=1) for d in devices)),
                Assignment(JOB, last + 1_000_000, "forged", 0.1, 2, 1.0, tuple(
                    DevicePlan(d, 0.1, 0.5, count=1) for d in devices)),
            ]
            for plan in forged:
                value, headers = encode(plan)
                forger.produce(kafka.topics.assignments, value=value, headers=headers)
            assert forger.flush(30) == 0
            _wait("the ranks past the forged steps", lambda: all(
                max((f.step for f in _feedback(kafka) if f.device_id == d), default=-1) >= last + 5 for d in devices),
                90, log)
        finally:
            os.kill(coordinator, signal.SIGCONT)
        reports = {(f.device_id, f.step): f for f in _feedback(kafka)}
        for step in (last + 2, last + 3):  # both parts rejected: both ranks ran their local plans
            assert reports["0", step].plan_step == reports["1", step].plan_step == -1
        assert reports["0", last + 4].plan_step == last + 4 and reports["1", last + 4].plan_step == -1
        assert all(f.dropped == 0 for f in reports.values())

        # Feedback: none of it may steer the coordinator, nor count as a step's report.
        step = last + 6
        base = StepFeedback(JOB, step, "0", 0, step, 0, 0, 0.1, 0.0, 0.0, 0.1, 1 << 20, 0, 0, sent_at=now_ms())
        bad = [(replace(base, **changes), reason) for changes, reason in [
            ({"compute_seconds": float("nan")}, "feedback-non-finite"),
            ({"data_wait_seconds": -2.0}, "feedback-negative"),
            ({"compute_seconds": 9.0, "step_seconds": 1.0}, "feedback-impossible"),
            ({"step": step + 1_000_000, "plan_step": step + 1_000_000}, "feedback-step-window"),
        ]]
        for record, _reason in bad:
            value, headers = encode(record)
            forger.produce(kafka.topics.feedback, value=value, headers=headers)
        # A sample claiming device 1, in device 0's topic.
        where: list[int] = []
        foreign = Sample.from_array("1", 0, np.ones((5, 16), np.float32), label=1)
        value, headers = encode(foreign)
        forger.produce(kafka.topics.device("0"), value=value, headers=headers,
                       on_delivery=lambda err, msg: where.append(msg.offset()))
        assert forger.flush(30) == 0 and len(where) == 1
        expected = Counter({"plan-truncation": 4, "plan-offsets": 1, "plan-non-finite": 1, "plan-step-window": 1,
                            "device-mismatch": 1, **{reason: 1 for _record, reason in bad}})

        def letters() -> list[DeadLetter]:
            return [decode(m.value(), m.headers(), DeadLetter)
                    for m in read_to_end(kafka, [kafka.topics.dead_letter], timeout=30)]

        _wait("every forgery dead-lettered", lambda: Counter(dl.reason for dl in letters()) == expected, 60, log)
        found = letters()
        (mismatch,) = [dl for dl in found if dl.reason == "device-mismatch"]
        assert (mismatch.topic, mismatch.offset) == (kafka.topics.device("0"), where[0])
        assert {dl.service for dl in found if dl.reason.startswith("feedback-")} == {"coordinator"}
        assert {dl.service for dl in found if dl.reason.startswith("plan-")} == {"trainer"}
        # Steps go on after the forged feedback (its step a million ahead stalled nothing), and the foreign
        # sample was never buffered, so never planned or trained, but processed: device 0 committed past it.
        _wait("training after the forgeries", lambda: max(f.step for f in _feedback(kafka)) >= step + 5, 60, log)
        # Device 0 may still be working off records older than the foreign one: wait until it is past it.
        _wait("device 0 past the foreign sample", lambda: max(
            f.lowest_unprocessed_offset for f in _feedback(kafka) if f.device_id == "0") > where[0], 120, log)
        zero = [f for f in _feedback(kafka) if f.device_id == "0"]
        assert all(p.offset != where[0] for f in zero for p in f.new_samples)

        # Every forgery's fate is seen: stop the run now rather than sit out the rest of --duration. SIGINT stops
        # it in the same order as the end of --duration (producers flushed, backlog drained, the report read back
        # from Kafka), so the accounting below covers the whole run; --duration only bounds a run that hangs.
        up.send_signal(signal.SIGINT)
        assert up.wait(300) == 0, log.read_text()[-4000:]
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            up.wait(120)
    report = json.loads((out / "report.json").read_text())
    assert report["truncation"] == "persist"
    assert report["samples_truncated"] == 0  # persist: nothing discarded, whatever the forged plans said
    assert report["samples_unaccounted"] == 0, report
    assert report["samples_dead_lettered"] == 1  # the foreign sample, and no real one
