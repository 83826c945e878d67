"""SIGKILL the coordinator while producers stream and two trainer ranks train: the ranks fall back to local
plans (counted as late plans), a restarted coordinator rebuilds its state from Kafka and the ranks follow
its plans again; at the end every produced seq is trained exactly once.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
from fault_helpers import FaultStack, assert_nothing_lost, scrape

from streamtrain.config import KafkaConfig

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.slow]  # 30-45 s each

DEVICES = ("0", "1")
PER_DEVICE = 400
OUTAGE_S = 4.0  # the ranks' plan wait is 1 s: a few steps on local plans
RATE = 25.0  # ~16 s of streaming: the kill, the outage and the restart all happen while data arrives


def test_sigkilled_coordinator_ranks_fall_back_then_follow_the_restarted_one(kafka_cfg: KafkaConfig,
                                                                             tmp_path: Path) -> None:
    stack = FaultStack(kafka_cfg, tmp_path, "ckill", DEVICES)
    try:
        coordinator = stack.coordinator().start()
        coordinator.wait_for(r"coordinating job", 60)
        trainer = stack.start_trainer()
        producer = stack.producer("producer", DEVICES, PER_DEVICE, RATE).start()
        stack.wait_trained(dict.fromkeys(DEVICES, 60), 90, watch=(coordinator, trainer))
        coordinator.kill()

        # Without a coordinator the ranks keep training on local plans, one plan wait per step.
        before = stack.trained_seqs()
        time.sleep(OUTAGE_S)
        stack.wait_trained({d: n + 1 for d, n in before.items()}, 30, watch=(trainer,))

        restart_log = coordinator.log.stat().st_size
        coordinator.start()
        coordinator.wait_for(r"rebuilt state from \d+ feedback", 60, since=restart_log)
        stack.wait_trained(dict.fromkeys(DEVICES, PER_DEVICE), 90, watch=(coordinator, trainer))
        assert producer.proc is not None and producer.proc.wait(30) == 0, producer.tail()  # a full run's status

        urls = stack.rank_metrics_urls(trainer)
        assert sorted(urls) == sorted(DEVICES), trainer.tail()
        late = {d: scrape(u)["streamtrain_trainer_plans_late_total"] for d, u in urls.items()}
        assert trainer.stop(60) == 0, trainer.tail()
        assert coordinator.stop(30) == 0, coordinator.tail()
    finally:
        stack.cleanup()

    fates, feedback = stack.account(dict.fromkeys(DEVICES, PER_DEVICE))
    assert_nothing_lost(fates)
    for device in DEVICES:
        steps = sorted((f.step, f.plan_step) for f in feedback if f.device_id == device)
        assert [s for s, _ in steps] == list(range(len(steps)))  # every step reported once
        local = [s for s, p in steps if p < 0]
        followed = [s for s, p in steps if p == s]
        assert len(local) + len(followed) == len(steps)  # a plan is either this step's or a local one
        assert late[device] == len(local)  # every local plan counted as late in the rank's metrics
        first, last = _longest_run(local)  # the outage ran on local plans ...
        assert last - first >= 2, steps
        assert [s for s in followed if s < first], steps  # ... between plans of the first coordinator ...
        assert len([s for s in followed if s > last]) >= 3, steps  # ... and plans of the restarted one


def _longest_run(steps: list[int]) -> tuple[int, int]:
    """First and last step of the longest run of consecutive steps."""
    best = (steps[0], steps[0])
    start = steps[0]
    for prev, cur in itertools.pairwise(steps):
        if cur != prev + 1:
            start = cur
        if cur - start > best[1] - best[0]:
            best = (start, cur)
    return best
