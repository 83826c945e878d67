"""Elastic membership: a trainer node away for longer than the collective timeout. The other node's agent
restarts its ranks without it (torchrun `--nnodes 1:2`, c10d rendezvous) and they train their own
devices; the coordinator declares the absent devices absent and plans only for the present; the absent
devices' streams wait in Kafka, their lag growing in the coordinator's metrics. Back on the network,
the node rejoins at the next rendezvous and its devices catch up. Nothing is lost."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from cluster_job import (
    ClusterJob,
    Report,
    accounting_figures,
    assert_nothing_lost_duplicates_bounded,
    coordinator_gauge,
    resume_figures,
)

from streamtrain.cluster.bed import ClusterBed
from streamtrain.cluster.topology import ClusterSpec

pytestmark = pytest.mark.faults

PER_DEVICE = 1200
RATE = 5.0  # 240 s of streams: the node's absence and return happen while they flow
COLLECTIVE_TIMEOUT_S = 30.0
STAYING, LEAVING = ("0", "1"), ("2", "3")
CAUGHT_UP_LAG = 25  # records: about five seconds of a stream


def test_a_node_away_past_the_timeout_leaves_the_group_which_goes_on_then_rejoins_and_catches_up(
        bed: ClusterBed, tmp_path: Path, report_figures: Report) -> None:
    job = ClusterJob(bed, tmp_path, "elastic", ClusterSpec(collective_timeout_seconds=COLLECTIVE_TIMEOUT_S))
    assert job.spec.node_devices(0) == STAYING and job.spec.node_devices(1) == LEAVING
    job.begin(PER_DEVICE, RATE, trained_first=60)

    def coordinator(key: str) -> Any:
        status = bed.coordinator_status()
        return None if status is None else status.get(key)

    cut_at = time.time()
    bed.cut("trainer-2")
    absent_s = job.wait(lambda: coordinator("absent_devices") == list(LEAVING), 240,
                        "the coordinator declaring trainer-2's devices absent")
    before = job.trained()
    alone_s = job.wait(lambda: all(job.trained()[d] >= before[d] + 40 for d in STAYING), 240,
                       "trainer-1's ranks training on alone")
    # Plans cover the present devices only; the absent devices' streams wait, their lag growing in the metrics.
    plan = coordinator("last_plan")
    assert [d["device"] for d in plan["devices"]] == list(STAYING), plan
    lag_then = {d: coordinator_gauge(bed, "lag_records", d) for d in LEAVING}
    time.sleep(3.0)
    lag_now = {d: coordinator_gauge(bed, "lag_records", d) for d in LEAVING}
    assert all(lag_now[d] is not None and lag_now[d] > (lag_then[d] or 0) > 0 for d in LEAVING), (lag_then, lag_now)
    assert [coordinator_gauge(bed, "device_present", d) for d in LEAVING] == [0.0, 0.0]
    assert all(job.trained()[d] == before[d] for d in LEAVING)  # nobody trains them meanwhile

    restored_at = time.time()
    bed.restore("trainer-2")
    back_s = job.wait(lambda: coordinator("absent_devices") == [], 300, "trainer-2's devices back in the plans")
    backlog = max(v or 0 for v in lag_now.values())

    def caught_up() -> bool:
        lags = [coordinator_gauge(bed, "lag_records", d) for d in LEAVING]
        return all(lag is not None and lag <= CAUGHT_UP_LAG for lag in lags)

    caught_up_s = back_s + job.wait(caught_up, 300, f"trainer-2's devices catching up (lag <= {CAUGHT_UP_LAG})")
    account = job.finish(PER_DEVICE, timeout=400)

    fb = account.feedback
    first_back = min(f.sent_at / 1000.0 for f in fb if f.device_id in LEAVING and f.sent_at / 1000.0 > restored_at)
    absent_from, absent_to = cut_at + absent_s, restored_at + back_s
    during = [a for a in account.assignments if absent_from < a.created_at / 1000.0 < absent_to - 5]
    figures = {
        "fault": f"trainer-2 cut off for {restored_at - cut_at:.0f} s (collective timeout "
                 f"{COLLECTIVE_TIMEOUT_S:.0f} s), then restored",
        "declared_absent_s": round(absent_s, 1),
        "survivors": resume_figures([f for f in fb if f.device_id in STAYING], cut_at, 300),
        "survivors_trained_alone_s": round(absent_s + alone_s, 1),
        "lag_of_absent_devices": lag_now,
        "rejoined_first_step_s": round(first_back - restored_at, 1),
        "back_in_plans_s": round(back_s, 1),
        "caught_up_s": round(caught_up_s, 1),
        "backlog_when_back": backlog,
        "plans_while_absent": len(during),
        **accounting_figures(account),
    }
    report_figures(figures)
    assert_nothing_lost_duplicates_bounded(account)
    assert during and all({d.device_id for d in a.devices} == set(STAYING) for a in during), figures
