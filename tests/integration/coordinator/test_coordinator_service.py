"""The coordinator service on the real broker; the test plays the trainers (feedback, offset commits).

Device topics hold real samples; feedback goes in by hand; plans are read back from the
assignments topic. Covers: plans for the next step from the reported index, truncation per policy
with DeleteRecords moving the log start offset, dead-lettered feedback, /status and /metrics, and a
restart that rebuilds state from Kafka and continues with the next step.
"""

from __future__ import annotations

import json
import time

import pytest
from coordinator_it_helpers import JOB, Plans, Trainers, config, get, low_watermark, produce_samples, running

from streamtrain.config import KafkaConfig
from streamtrain.dead_letters import REASON_HEADER
from streamtrain.kafka import read_to_end
from streamtrain.wire import Assignment

pytestmark = pytest.mark.integration

FAST = 15  # per report, within the bounded policy's 20: never truncated


@pytest.mark.parametrize("ahead", [1, 0])
def test_plans_truncation_delete_records_status_and_restart(kafka_cfg: KafkaConfig, ahead: int) -> None:
    # "slow" holds 100 samples but trains few per step: bounded truncation keeps its newest 20.
    sizes = produce_samples(kafka_cfg, {"fast": 2 * FAST, "slow": 100})
    cfg = config(kafka_cfg, devices=("fast", "slow"), truncation="bounded", max_lag_samples=20,
                 delete_records=True, policy="ett-stream", plan_ahead=ahead)
    trainers, plans = Trainers(kafka_cfg), Plans(kafka_cfg)
    slow_topic = kafka_cfg.topics.device("slow")
    # What each trainer holds (reported, not trained, not dropped): lowest offset and depth follow.
    held = {"fast": set(range(FAST)), "slow": set(range(100))}
    ranks = {"fast": 0, "slow": 1}

    def train(step: int, plan: Assignment | None, new: dict[str, range]) -> None:
        for device, rank in ranks.items():
            part = plan.for_device(device) if plan else None
            if part is not None:
                held[device] -= set(part.offsets) | {o for o in held[device] if o < (part.truncate_before or 0)}
            held[device] |= set(new.get(device, ()))
            trainers.report(step, device, rank, [(o, sizes[device][o]) for o in new.get(device, ())],
                            lowest=min(held[device], default=100), depth=len(held[device]),
                            seconds=0.1 if device == "fast" else 0.4)

    def named(plan: Assignment, device: str) -> set[int]:
        part = plan.for_device(device)
        assert part is not None
        return set(part.offsets)

    try:
        with running(cfg) as service:
            train(0, None, {"fast": range(FAST), "slow": range(100)})
            p1 = plans.wait(1)
            fast, slow = p1.for_device("fast"), p1.for_device("slow")
            assert fast is not None and slow is not None and p1.job == JOB and p1.policy == "ett-stream"
            assert fast.offsets and set(fast.offsets) <= set(range(FAST)) and fast.truncate_before is None
            assert slow.truncate_before == 80 and slow.offsets and min(slow.offsets) >= 80
            if ahead:
                # Made at once from the state after plan 1: what plan 1 takes and truncates is not its to name.
                p2 = plans.wait(2)
                assert p2.basis_step == p1.basis_step == 0
                for d in ranks:
                    assert not named(p2, d) & named(p1, d) and min(named(p2, d) | {99}) >= (
                        p1.for_device(d).truncate_before or 0)  # type: ignore[union-attr]

            # The trainers skip the truncated records and commit past them: DeleteRecords follows.
            trainers.commit("slow", 80)
            deadline = time.monotonic() + 15
            while low_watermark(kafka_cfg, slow_topic) < 80:
                assert time.monotonic() < deadline, "log start offset did not move"
                time.sleep(0.2)
            assert low_watermark(kafka_cfg, slow_topic) == 80  # never past the committed offset

            # A record no one can read goes to the dead-letter topic; the service carries on.
            trainers.producer.produce(kafka_cfg.topics.feedback, value=b"\x00garbage", headers=[])
            train(1, p1, {"fast": range(FAST, 2 * FAST)})
            nxt = plans.wait(2 + ahead)
            p2 = plans.seen[2]
            for d in ranks:
                # Only what is held and no plan still to run names: nothing twice.
                assert named(nxt, d) <= held[d] - (named(p2, d) if ahead else set())

            deadline = time.monotonic() + 10
            while True:  # /status is refreshed on a period, not at every plan
                _ctype, body = get(service.port, "/status")
                status = json.loads(body)
                if status["last_plan"]["step"] == 2 + ahead or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            by_id = {d["device"]: d for d in status["devices"]}
            assert set(by_id) == {"fast", "slow"} and status["last_plan"]["step"] == 2 + ahead
            assert status["plan_ahead"] == ahead and status["last_plan"]["basis_step"] == 1
            assert by_id["slow"]["model"]["a"] > 0 and by_id["slow"]["log_start_offset"] == 80
            assert {"lag_records", "arrival_rate", "pending"} <= set(by_id["fast"])
            ctype, metrics = get(service.port, "/metrics")
            assert ctype.startswith("text/plain")
            assert "streamtrain_coordinator_plan_latency_seconds_count" in metrics.decode()
            reg = service.metrics.registry
            assert reg.get_sample_value("streamtrain_coordinator_truncated_samples_total",
                                        {"job": JOB, "device": "slow"}) == 80
            assert reg.get_sample_value("streamtrain_coordinator_deleted_records_total",
                                        {"job": JOB, "device": "slow"}) == 80
            assert reg.get_sample_value("streamtrain_coordinator_dead_lettered_records_total",
                                        {"job": JOB, "reason": "corrupt"}) == 1
            # The split of step 1's wall period along its slowest rank ("slow", 0.4 s of compute).
            assert reg.get_sample_value("streamtrain_coordinator_step_wall_seconds",
                                        {"job": JOB, "part": "compute"}) == pytest.approx(0.4)
        letters = list(read_to_end(kafka_cfg, [kafka_cfg.topics.dead_letter]))
        assert [dict(m.headers() or [])[REASON_HEADER] for m in letters] == [b"corrupt"]

        # Restart: state comes back from Kafka; the next plan is the one after the last published, from what is
        # still held and not named by a plan still to run.
        with running(cfg) as service:
            assert service.fleet.next_plan_step == 3 + ahead
            train(2, p2, {})
            p_last = plans.wait(3 + ahead)
            for d in ranks:
                assert named(p_last, d) <= held[d] - (named(nxt, d) if ahead else set())
                if held[d] - (named(nxt, d) if ahead else set()):
                    assert named(p_last, d)  # ett-stream never leaves a device with pending samples idle
    finally:
        trainers.close()
        plans.close()


def test_truncate_policy_keeps_about_one_step_of_the_newest(kafka_cfg: KafkaConfig) -> None:
    sizes = produce_samples(kafka_cfg, {"cam": 60})
    cfg = config(kafka_cfg, truncation="truncate", feedback_wait_seconds=0.5)
    trainers, plans = Trainers(kafka_cfg), Plans(kafka_cfg)
    try:
        with running(cfg):
            trainers.report(4, "cam", 0, list(enumerate(sizes["cam"])), lowest=0, depth=60)
            plan = plans.wait(5)
            part = plan.for_device("cam")
            assert part is not None and part.truncate_before is not None
            # Nothing new arrives (rate ~0): about one step's worth of the newest samples is kept.
            assert 50 <= part.truncate_before <= 59 and part.offsets and min(part.offsets) >= part.truncate_before
    finally:
        trainers.close()
        plans.close()


def test_delete_trained_keeps_only_the_lag_on_the_broker(kafka_cfg: KafkaConfig) -> None:
    # A device whose trainer keeps up is never truncated: only delete_trained bounds its topic.
    produce_samples(kafka_cfg, {"cam": 50})
    topic = kafka_cfg.topics.device("cam")
    trainers = Trainers(kafka_cfg)
    try:
        keep = config(kafka_cfg, devices=("cam",), truncation="bounded", max_lag_samples=1000, delete_records=True)
        with running(keep):
            trainers.commit("cam", 30)
            time.sleep(2.0)  # ten offset polls
            assert low_watermark(kafka_cfg, topic) == 0  # trained, not truncated: kept by default
        drop = config(kafka_cfg, devices=("cam",), truncation="bounded", max_lag_samples=1000, delete_records=True,
                      delete_trained=True)
        with running(drop) as service:
            deadline = time.monotonic() + 15
            while low_watermark(kafka_cfg, topic) < 30:
                assert time.monotonic() < deadline, "log start offset did not move to the committed offset"
                time.sleep(0.2)
            assert low_watermark(kafka_cfg, topic) == 30  # exactly the committed offset, never past it
            assert service.metrics.registry.get_sample_value(
                "streamtrain_coordinator_deleted_records_total", {"job": JOB, "device": "cam"}) == 30
    finally:
        trainers.close()
