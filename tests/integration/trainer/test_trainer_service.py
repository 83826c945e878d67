"""`streamtrain train --local-ranks 2` on the real broker: plans, local fallback, feedback, offsets,
dead letters, SIGTERM with a checkpoint, and a restart that trains nothing twice.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Producer, TopicPartition
from feedback_records import is_profile, profiles, step_feedback

from streamtrain.config import KafkaConfig
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin, make_consumer, make_producer, read_to_end
from streamtrain.runtime.commands import CLI_MODULE, module_command
from streamtrain.trainer.checkpoint import load_checkpoint
from streamtrain.wire import (
    Assignment,
    DeadLetter,
    DevicePlan,
    ModelVersion,
    Sample,
    StepFeedback,
    decode,
    encode,
    expand_ranges,
)

pytestmark = pytest.mark.integration

DEVICES = ("d0", "d1")
JOB = "svc"


def _setup(kafka: KafkaConfig) -> Producer:
    t = kafka.topics
    names = [*(t.device(d) for d in DEVICES), t.feedback, t.assignments, t.dead_letter]
    ensure_topics(make_admin(kafka), [TopicSpec.from_config(kafka, n) for n in names])
    return make_producer(kafka)


def _sizes(device: str, n: int) -> list[int]:
    return [2 + (3 * i + 5 * DEVICES.index(device)) % 7 for i in range(n)]


def _produce_samples(producer: Producer, kafka: KafkaConfig, device: str, n: int) -> None:
    rng = np.random.default_rng(DEVICES.index(device))
    for seq, size in enumerate(_sizes(device, n)):
        label = seq % 3
        array = (rng.normal(size=(size, 16)) + label).astype(np.float32)
        value, headers = encode(Sample.from_array(device, seq, array, label=label))
        producer.produce(kafka.topics.device(device), value=value, headers=headers)
    assert producer.flush(30) == 0


def _publish(producer: Producer, kafka: KafkaConfig, plan: Assignment) -> None:
    value, headers = encode(plan)
    producer.produce(kafka.topics.assignments, value=value, headers=headers)
    assert producer.flush(30) == 0


def _train(kafka: KafkaConfig, tmp: Path, *args: str, plan_wait: float = 0.5,
           overrides: dict[str, object] | None = None) -> subprocess.Popen[bytes]:
    sets = {
        "job": JOB, "kafka.bootstrap_servers": kafka.bootstrap_servers, "kafka.topic_prefix": kafka.topic_prefix,
        "trainer.device": "cpu", "trainer.torch_threads": 1, "trainer.hidden_size": 16, "trainer.num_layers": 1,
        "trainer.num_classes": 3, "trainer.local_batch": 3, "trainer.data_wait_seconds": 0.5, "trainer.log_every": 1,
        "trainer.checkpoint_every": 2, "trainer.checkpoint_dir": str(tmp / "ckpt"), "metrics.port": 0,
        "coordinator.use_profiles": False,  # no coordinator plans from the ranks' profiles here: do not wait for one
        **(overrides or {}),
    }
    cmd = module_command(CLI_MODULE, "train", "--local-ranks", "2", "--devices", ",".join(DEVICES), "--plan-wait",
                         str(plan_wait), *args, sets=sets)
    log = (tmp / f"train-{time.monotonic_ns()}.log").open("wb")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _finish(proc: subprocess.Popen[bytes], tmp: Path, timeout: float = 90) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    finally:
        if proc.returncode not in (0, None):
            for log in sorted(tmp.glob("train-*.log")):
                print(log.read_text()[-6000:])


def _feedback(kafka: KafkaConfig) -> list[StepFeedback]:
    return step_feedback(read_to_end(kafka, [kafka.topics.feedback]))


def _committed(kafka: KafkaConfig) -> dict[str, int]:
    consumer = make_consumer(kafka, f"{JOB}.trainers")
    try:
        parts = consumer.committed([TopicPartition(kafka.topics.device(d), 0) for d in DEVICES], timeout=30)
    finally:
        consumer.close()
    return {DEVICES[i]: tp.offset for i, tp in enumerate(parts)}


def test_ranks_follow_plans_fall_back_and_account_for_every_offset(kafka_cfg: KafkaConfig, tmp_path: Path) -> None:
    producer = _setup(kafka_cfg)
    for device in DEVICES:
        _produce_samples(producer, kafka_cfg, device, 30)
    d0 = kafka_cfg.topics.device("d0")
    producer.produce(d0, value=b"not avro at all")  # offset 30: no single-object marker, no header
    bad_label = Sample.from_array("d0", 30, np.zeros((3, 16), np.float32), label=7)  # 7 >= num_classes
    value, headers = encode(bad_label)
    producer.produce(d0, value=value, headers=headers)  # offset 31
    assert producer.flush(30) == 0
    _publish(producer, kafka_cfg, Assignment("other-job", 0, "x", 0.0, 1, 1.0, (DevicePlan("d0", 0.0, 1.0, count=9),)))
    _publish(producer, kafka_cfg, Assignment(JOB, 0, "test", 0.0, 7, 1.0, (
        DevicePlan("d0", 0.0, 1.0, offsets=(0, 1, 2)), DevicePlan("d1", 0.0, 1.0, count=4))))
    _publish(producer, kafka_cfg, Assignment(JOB, 1, "test", 0.0, 4, 1.0, (
        DevicePlan("d0", 0.0, 1.0, offsets=(5, 6), truncate_before=5), DevicePlan("d1", 0.0, 1.0, size_budget=10))))

    # Plan 1 truncates: the ranks obey that only under a truncation policy that could ask for it.
    proc = _train(kafka_cfg, tmp_path, "--steps", "4", plan_wait=3.0, overrides={"coordinator.truncation": "truncate"})
    assert _finish(proc, tmp_path) == 0

    feedback = {(f.device_id, f.step): f for f in _feedback(kafka_cfg)}
    assert sorted(feedback) == [(d, s) for d in DEVICES for s in range(4)]
    assert all(f.job == JOB for f in feedback.values())
    assert [feedback["d0", s].plan_step for s in range(4)] == [0, 1, -1, -1]
    # d0: plan 0 trains 0-2; plan 1 drops 3-4 and trains 5-6; local plans repeat the last count (2).
    assert [feedback["d0", s].samples for s in range(4)] == [3, 2, 2, 2]
    assert [feedback["d0", s].dropped for s in range(4)] == [0, 2, 0, 0]
    assert [feedback["d0", s].lowest_unprocessed_offset for s in range(4)] == [3, 7, 9, 11]
    sizes = _sizes("d0", 30)
    assert feedback["d0", 0].total_size == sum(sizes[:3])
    # d1: 4 by count, then the oldest within a size budget of 10, then that count again.
    d1_sizes = _sizes("d1", 30)
    budget_count = next(k for k in range(1, 30) if sum(d1_sizes[4:4 + k + 1]) > 10)
    assert [feedback["d1", s].samples for s in range(4)] == [4, budget_count, budget_count, budget_count]
    for f in feedback.values():
        assert f.step_seconds > 0 and f.compute_seconds >= 0 and f.memory_bytes > 0 and f.rank == DEVICES.index(
            f.device_id)
        assert f.loss is not None and np.isfinite(f.loss)
        assert f.buffer_depth == len([p for p in range(f.lowest_unprocessed_offset, 30)])
    first_new = feedback["d0", 0].new_samples
    assert [p.offset for p in first_new] == list(range(3, 30)) and first_new[0].size == sizes[3]
    # Before step 0 each rank profiled its model on its first samples (all 30: the backlog there was) and said so.
    started = {p.device_id: p for p in profiles(read_to_end(kafka_cfg, [kafka_cfg.topics.feedback]))}
    assert sorted(started) == list(DEVICES)
    for device, p in started.items():
        assert (p.job, p.rank, len(p.sizes)) == (JOB, DEVICES.index(device), 3)
        assert p.mean_sample_size == pytest.approx(np.mean(_sizes(device, 30)))
        assert p.slope > 0 and p.problem() is None and 0 < p.profile_seconds < 30

    committed = _committed(kafka_cfg)
    for device in DEVICES:
        trained = sum(feedback[device, s].samples + feedback[device, s].dropped for s in range(4))
        assert committed[device] == feedback[device, 3].lowest_unprocessed_offset == trained
    checkpoint = load_checkpoint(tmp_path / "ckpt")
    assert checkpoint is not None and checkpoint.step == 4 and checkpoint.offsets == committed

    records = read_to_end(kafka_cfg, [kafka_cfg.topics.dead_letter])
    letters = [decode(m.value(), m.headers(), DeadLetter) for m in records]
    assert sorted((dl.offset, dl.reason) for dl in letters) == [(30, "corrupt"), (31, "untrainable")]
    assert all(dl.topic == d0 and dl.service == "trainer" for dl in letters)


def test_plans_no_coordinator_could_make_are_rejected_and_each_rank_falls_back_alone(kafka_cfg: KafkaConfig,
                                                                                    tmp_path: Path) -> None:
    producer = _setup(kafka_cfg)
    for device in DEVICES:
        _produce_samples(producer, kafka_cfg, device, 20)
    plans = [
        # step 0: d0's part is fine; d1's truncates, which persist (the default policy) never does
        Assignment(JOB, 0, "forged", 0.1, 7, 1.0, (DevicePlan("d0", 0.1, 0.5, offsets=(0, 1, 2)),
                                                   DevicePlan("d1", 0.1, 0.5, count=4, truncate_before=3))),
        Assignment(JOB, 1, "forged", 0.1, 4, 1.0, (DevicePlan("d0", 0.1, math.nan, count=2),  # NaN weight
                                                   DevicePlan("d1", 0.1, 0.5, count=2))),
        Assignment(JOB, 2, "forged", 0.1, 4, 1.0, (DevicePlan("d0", 0.1, 0.5, offsets=(5, 10_000)),  # past the end
                                                   DevicePlan("d1", 0.1, 0.5, count=2))),
        Assignment(JOB, 1_000_000, "forged", 0.1, 4, 1.0, (DevicePlan("d0", 0.1, 0.5, count=1),)),  # far ahead
    ]
    for plan in plans:
        _publish(producer, kafka_cfg, plan)

    proc = _train(kafka_cfg, tmp_path, "--steps", "3", plan_wait=3.0)
    assert _finish(proc, tmp_path, timeout=180) == 0  # two ranks importing torch on a busy 2-core machine

    feedback = {(f.device_id, f.step): f for f in _feedback(kafka_cfg)}
    assert sorted(feedback) == [(d, s) for d in DEVICES for s in range(3)]  # every rank ran every step together
    assert [feedback["d0", s].plan_step for s in range(3)] == [0, -1, -1]
    assert [feedback["d1", s].plan_step for s in range(3)] == [-1, -1, 2]
    assert feedback["d0", 0].samples == 3 and feedback["d1", 2].samples == 2
    assert sum(f.dropped for f in feedback.values()) == 0  # nothing was truncated
    for f in feedback.values():  # the offset floor is the first record no step up to this one trained
        trained = {int(o) for s in range(f.step + 1) for o in expand_ranges(feedback[f.device_id, s].trained_offsets)}
        assert len(trained) == sum(feedback[f.device_id, s].samples for s in range(f.step + 1))
        assert f.lowest_unprocessed_offset == min(set(range(len(trained) + 1)) - trained), f

    letters = [decode(m.value(), m.headers(), DeadLetter)
               for m in read_to_end(kafka_cfg, [kafka_cfg.topics.dead_letter])]
    assert sorted((dl.offset, dl.reason) for dl in letters) == [
        (0, "plan-truncation"), (1, "plan-non-finite"), (2, "plan-offsets"), (3, "plan-step-window")]
    assert all(dl.topic == kafka_cfg.topics.assignments and dl.service == "trainer" for dl in letters)
    by_offset = {dl.offset: dl.detail for dl in letters}
    assert "device d1" in by_offset[0] and "persist" in by_offset[0] and "offset 10000" in by_offset[2]


def test_sigterm_checkpoints_and_a_restart_trains_nothing_twice(kafka_cfg: KafkaConfig, tmp_path: Path) -> None:
    producer = _setup(kafka_cfg)
    for device in DEVICES:
        _produce_samples(producer, kafka_cfg, device, 60)
    proc = _train(kafka_cfg, tmp_path, "--steps", "0", plan_wait=0.05)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and len(_feedback(kafka_cfg)) < 6:
        assert proc.poll() is None
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    assert _finish(proc, tmp_path) == 0

    first = _feedback(kafka_cfg)
    checkpoint = load_checkpoint(tmp_path / "ckpt")
    assert checkpoint is not None
    assert checkpoint.step == 1 + max(f.step for f in first)
    committed = _committed(kafka_cfg)
    assert checkpoint.offsets == committed
    for device in DEVICES:
        assert committed[device] == sum(f.samples for f in first if f.device_id == device) > 0

    proc = _train(kafka_cfg, tmp_path, "--steps", str(checkpoint.step + 3), plan_wait=0.05)
    assert _finish(proc, tmp_path) == 0
    later = [f for f in _feedback(kafka_cfg) if f not in first]
    assert sorted({f.step for f in later}) == list(range(checkpoint.step, checkpoint.step + 3))
    final = _committed(kafka_cfg)
    for device in DEVICES:
        # Every offset below the final commit was trained exactly once over both runs.
        assert final[device] == sum(f.samples for f in [*first, *later] if f.device_id == device)
        assert final[device] > committed[device]


def test_an_idle_group_waits_for_data_instead_of_spinning_through_empty_steps(
        kafka_cfg: KafkaConfig, tmp_path: Path) -> None:
    """Plans that assign nothing to ranks with empty buffers: each empty step is followed by an idle wait of
    trainer.idle_wait_seconds; once samples are buffered the ranks step without waiting."""
    producer = _setup(kafka_cfg)
    for step in range(6):
        _publish(producer, kafka_cfg, Assignment(JOB, step, "test", 0.0, 0, 1.0, tuple(
            DevicePlan(d, 0.0, 1.0, count=0) for d in DEVICES)))
    proc = _train(kafka_cfg, tmp_path, "--steps", "6", plan_wait=3.0,
                  overrides={"trainer.idle_wait_seconds": 1.5})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(f.step >= 1 for f in _feedback(kafka_cfg)):
        time.sleep(0.1)
    for device in DEVICES:  # buffered from here on: the next idle waits end at once
        _produce_samples(producer, kafka_cfg, device, 10)
    assert _finish(proc, tmp_path) == 0

    sent: dict[tuple[str, int], float] = {}  # (device, step) -> broker timestamp of its feedback, s
    for m in read_to_end(kafka_cfg, [kafka_cfg.topics.feedback]):
        if is_profile(m):
            continue
        fb = decode(m.value(), m.headers(), StepFeedback)
        sent[fb.device_id, fb.step] = m.timestamp()[1] / 1000
    assert sorted(sent) == [(d, s) for d in DEVICES for s in range(6)]
    for device in DEVICES:
        gaps = [sent[device, s + 1] - sent[device, s] for s in range(5)]
        assert gaps[0] >= 1.4, gaps  # empty buffers everywhere: the group waited before step 1
        assert gaps[-1] < 1.0, gaps  # samples buffered: no idle wait although the plans still assign nothing


def test_a_drained_group_holds_its_report_until_the_plans_target(kafka_cfg: KafkaConfig, tmp_path: Path) -> None:
    """Line rate: a plan that takes every sample the coordinator knew of leaves steps short for want of data,
    so the ranks hold their reports until the plan's target and report what arrived meanwhile. A plan that
    leaves reported samples behind (a backlog), or whose truncation dropped some (a stream that outruns
    training), is reported at once, whatever its target. The model version due after a held step goes out in
    the hold, before the report; one after a step reported at once goes out after it."""
    producer = _setup(kafka_cfg)
    for device in DEVICES:
        _produce_samples(producer, kafka_cfg, device, 20)
    target = 3.0
    # Step 0's report lists all 20; step 1 leaves 4-19 behind; step 2 truncates 4-15 and takes the rest;
    # step 3 takes what the test produces after step 2 (20-23), all there is.
    plans = [(range(0, 2), None), (range(2, 4), None), (range(16, 20), 16), (range(20, 24), None)]
    for step, (offsets, before) in enumerate(plans):
        _publish(producer, kafka_cfg, Assignment(JOB, step, "test", target, 2 * len(offsets), 1.0, tuple(
            DevicePlan(d, 0.01, 0.5, offsets=tuple(offsets), truncate_before=before) for d in DEVICES)))
    proc = _train(kafka_cfg, tmp_path, "--steps", "4", plan_wait=3.0,
                  overrides={"trainer.hold_max_seconds": 5.0, "trainer.checkpoint_every": 100,
                             "trainer.data_wait_seconds": 10, "versions.dir": str(tmp_path / "versions"),
                             "versions.publish_every_seconds": 0.01,  # a version after every step
                             "coordinator.truncation": "truncate"})  # step 2's truncation: obeyed under truncate
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(f.step >= 2 for f in _feedback(kafka_cfg)):
        time.sleep(0.1)
    for device in DEVICES:
        _produce_samples(producer, kafka_cfg, device, 4)  # offsets 20-23 (the stream restarts its seq: no matter)
    assert _finish(proc, tmp_path) == 0

    sent: dict[tuple[str, int], float] = {}  # (device, step) -> broker timestamp of its feedback, s
    reports: dict[tuple[str, int], StepFeedback] = {}
    for m in read_to_end(kafka_cfg, [kafka_cfg.topics.feedback]):
        if is_profile(m):
            continue
        fb = decode(m.value(), m.headers(), StepFeedback)
        sent[fb.device_id, fb.step] = m.timestamp()[1] / 1000
        reports[fb.device_id, fb.step] = fb
    assert sorted(sent) == [(d, s) for d in DEVICES for s in range(4)]
    for device in DEVICES:
        r = [reports[device, s] for s in range(4)]
        # Step 0 held (nothing reported yet): its report lists every untrained sample fetched meanwhile.
        assert [p.offset for p in r[0].new_samples] == list(range(2, 20))
        assert [x.samples for x in r] == [2, 2, 4, 4] and r[2].dropped == 12
        assert sent[device, 1] - sent[device, 0] < 0.8 * target  # step 1 left 4-19 behind: no hold
        assert sent[device, 2] - sent[device, 1] < 0.8 * target  # step 2 truncated 4-15: no hold
        # Step 3 took all there was: held to the target, and the held time is neither step nor data wait.
        assert sent[device, 3] - sent[device, 2] >= 0.9 * target
        assert r[3].step_seconds + r[3].data_wait_seconds < 0.6 * target
    announced = {v.step: m.timestamp()[1] / 1000 for m in read_to_end(kafka_cfg, [kafka_cfg.topics.models])
                 if (v := decode(m.value(), m.headers(), ModelVersion))}
    assert sorted(announced) == [1, 2, 3, 4]  # a version after each step (its step: the steps it trained)
    for device in DEVICES:
        assert announced[1] < sent[device, 0] and announced[4] < sent[device, 3]  # held steps: out in the hold
        assert announced[2] > sent[device, 1] and announced[3] > sent[device, 2]  # reported at once: after


def test_a_restart_skips_what_was_trained_out_of_order_above_the_commit(kafka_cfg: KafkaConfig,
                                                                        tmp_path: Path) -> None:
    producer = _setup(kafka_cfg)
    for device in DEVICES:
        _produce_samples(producer, kafka_cfg, device, 20)
    # Plans that train d0 out of order: its commit stays at 2 while 4, 5 and 7 are trained already.
    _publish(producer, kafka_cfg, Assignment(JOB, 0, "test", 0.0, 7, 1.0, (
        DevicePlan("d0", 0.0, 1.0, offsets=(0, 1, 4, 5)), DevicePlan("d1", 0.0, 1.0, count=3))))
    _publish(producer, kafka_cfg, Assignment(JOB, 1, "test", 0.0, 2, 1.0, (
        DevicePlan("d0", 0.0, 1.0, offsets=(7,)), DevicePlan("d1", 0.0, 1.0, count=1))))
    # Nothing here depends on timing: wait as long as rank start-up takes on a busy machine.
    assert _finish(_train(kafka_cfg, tmp_path, "--steps", "2", plan_wait=3.0), tmp_path, timeout=300) == 0
    checkpoint = load_checkpoint(tmp_path / "ckpt")
    assert checkpoint is not None and checkpoint.offsets["d0"] == _committed(kafka_cfg)["d0"] == 2
    assert checkpoint.done_ahead["d0"] == [(4, 6), (7, 8)]

    # The restart resumes at 2 on local plans (oldest first): 2, 3, 6, 8, ... and never 4, 5 or 7 again.
    assert _finish(_train(kafka_cfg, tmp_path, "--steps", "5", plan_wait=0.05), tmp_path, timeout=300) == 0
    d0 = sorted((f.step, [int(o) for o in expand_ranges(f.trained_offsets)]) for f in _feedback(kafka_cfg)
                if f.device_id == "d0")
    first = [o for step, offsets in d0 if step < 2 for o in offsets]
    second = [o for step, offsets in d0 if step >= 2 for o in offsets]
    assert first == [0, 1, 4, 5, 7] and len(second) > 3, d0
    assert second == [o for o in range(2, 20) if o not in (4, 5, 7)][:len(second)], d0
