"""The faults a multi-host deployment meets, one test each, on the test bed's real engines: every test runs a
job of four device streams (10 samples/s each) on two trainer nodes, breaks something mid-run, waits until
everything produced is trained, and accounts for every sample by reading the run back from Kafka: 0
acknowledged samples lost, at most one step's batch retrained per device, training resumed (and how long
that took: the figures each test reports).
"""

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
    restarts,
    resume_figures,
)

from streamtrain.cluster.bed import ClusterBed
from streamtrain.cluster.health import partition_leaders, wait_until
from streamtrain.cluster.topology import KAFKA_HOSTS, TRAINER_HOSTS

pytestmark = pytest.mark.faults

PER_DEVICE = 600
RATE = 10.0  # samples/s per device: a minute of streams, the fault and the recovery inside it
BROKER_DOWN_S = 10.0
CUT_S = 20.0
COORDINATOR_DOWN_S = 5.0
ROLLING_RATE, ROLLING_PER_DEVICE = 5.0, 1500  # 300 s of streams: three broker restarts of 30-90 s each fit inside


def test_sigkill_of_a_broker_host_and_its_return_lose_no_acknowledged_sample(
        bed: ClusterBed, tmp_path: Path, report_figures: Report) -> None:
    """SIGKILL of every process on a Kafka host mid-run, then the host's return: with three replicas and
    min.insync.replicas 2 the two other nodes carry on (leaders move, acks=all still succeeds), no
    service restarts, and the node rejoins and catches up its replicas."""
    job = ClusterJob(bed, tmp_path, "brokerkill")
    job.begin(PER_DEVICE, RATE)

    # The node leading the feedback topic: plans and feedback have to move to a new leader.
    feedback_topic = job.config.kafka.topics.feedback
    victim = KAFKA_HOSTS[partition_leaders(bed.bootstrap, [feedback_topic])[feedback_topic] - 1]
    fault_at = time.time()
    killed = bed.kill_host(victim)
    assert killed >= 1 and bed.processes(victim) == 0
    before = job.trained()
    job.wait_trained({d: n + 30 for d, n in before.items()}, 120)  # two nodes carry the job
    time.sleep(max(0.0, BROKER_DOWN_S - (time.time() - fault_at)))
    back_at = time.time()
    bed.start(victim)
    node = KAFKA_HOSTS.index(victim) + 1
    rejoined = wait_until(lambda: node in bed.broker_ids(), 180, f"{victim} back in the cluster")
    in_sync = bed.wait_brokers(180)

    account = job.finish(PER_DEVICE)
    figures = {"fault": "SIGKILL of every process on a broker host, returned after "
                        f"{back_at - fault_at:.0f} s", "host": victim, "processes_killed": killed,
               "rejoined_s": round(rejoined, 1), "replicas_in_sync_s": round(rejoined + in_sync, 1),
               **resume_figures(account.feedback, fault_at, 60), **accounting_figures(account)}
    report_figures(figures)
    assert_nothing_lost_duplicates_bounded(account)
    assert [restarts(bed, h) for h in TRAINER_HOSTS] == [0, 0]  # nobody else noticed enough to restart
    assert account.duplicates() == dict.fromkeys(job.devices, 0), figures


def test_a_trainer_host_cut_off_for_20_s_pauses_the_group_which_resumes_and_loses_nothing(
        bed: ClusterBed, tmp_path: Path, report_figures: Report) -> None:
    """A trainer host cut off the network (link down) for 20 s, then restored: shorter than the ranks'
    collective timeout, so the group only pauses (its collectives wait, TCP resends once the cable is
    back) and goes on with every rank; nothing is lost or retrained."""
    job = ClusterJob(bed, tmp_path, "trainercut")
    assert job.spec.collective_timeout_seconds > CUT_S + 15  # the cut, and TCP's resend back-off after it
    job.begin(PER_DEVICE, RATE)

    fault_at = time.time()
    bed.cut("trainer-2")
    time.sleep(CUT_S)
    bed.restore("trainer-2")
    restored_at = time.time()
    before = job.trained()
    job.wait_trained({d: n + 30 for d, n in before.items()}, 120)  # every device trains again

    account = job.finish(PER_DEVICE)
    figures = {"fault": f"trainer-2 cut off for {restored_at - fault_at:.0f} s (link down), then restored",
               **resume_figures(account.feedback, fault_at, 120), **accounting_figures(account),
               "group_restarts": [restarts(bed, h) for h in TRAINER_HOSTS]}
    report_figures(figures)
    assert_nothing_lost_duplicates_bounded(account)
    assert figures["group_restarts"] == [0, 0], figures
    assert figures["stall_s"] >= CUT_S * 0.8, figures  # the group did wait for the node it could not reach


def test_the_coordinator_host_killed_and_restarted_loses_nothing_and_plans_again(
        bed: ClusterBed, tmp_path: Path, report_figures: Report) -> None:
    """The coordinator host killed (SIGKILL of every process on it) and restarted: the ranks go on with
    local plans meanwhile, the restarted coordinator rebuilds its state from Kafka and plans again."""
    job = ClusterJob(bed, tmp_path, "coordkill")
    job.begin(PER_DEVICE, RATE)

    fault_at = time.time()
    killed = bed.kill_host("coordinator")
    assert killed >= 1 and not bed.alive("coordinator")
    time.sleep(COORDINATOR_DOWN_S)
    before = job.trained()
    job.wait_trained({d: n + 10 for d, n in before.items()}, 120)  # ranks train on local plans meanwhile
    restarted_at = time.time()
    bed.start("coordinator")
    serving = bed.wait_coordinator(120)

    account = job.finish(PER_DEVICE)
    planned = sorted(a.created_at / 1000.0 for a in account.assignments if a.created_at / 1000.0 > restarted_at)
    figures = {"fault": f"SIGKILL of every process on the coordinator host, restarted after "
                        f"{restarted_at - fault_at:.0f} s", "processes_killed": killed,
               "coordinator_serving_s": round(serving, 1),
               "first_plan_after_restart_s": round(planned[0] - restarted_at, 1) if planned else None,
               **resume_figures(account.feedback, fault_at, 60), **accounting_figures(account)}
    report_figures(figures)
    assert_nothing_lost_duplicates_bounded(account)
    assert [restarts(bed, h) for h in TRAINER_HOSTS] == [0, 0]
    assert account.duplicates() == dict.fromkeys(job.devices, 0), figures
    # The restarted coordinator planned again, and the ranks followed its plans, not local ones, at the end.
    assert planned, "no plan after the coordinator's restart"
    last = {}
    for fb in account.feedback:
        last.setdefault(fb.device_id, []).append(fb)
    for device, fbs in last.items():
        tail = sorted(fbs, key=lambda f: f.step)[-10:]
        assert sum(f.plan_step == f.step for f in tail) >= 7, (device, [(f.step, f.plan_step) for f in tail])


def test_a_rolling_restart_of_the_three_brokers_loses_nothing_and_retrains_nothing(
        bed: ClusterBed, tmp_path: Path, report_figures: Report) -> None:
    """A rolling restart of the three Kafka nodes (each stopped cleanly, started, and back in sync before the
    next) while the job streams and trains: nothing lost, nothing retrained, no service restarted."""
    job = ClusterJob(bed, tmp_path, "rolling")
    job.begin(ROLLING_PER_DEVICE, ROLLING_RATE, trained_first=50)

    fault_at = time.time()
    per_broker: dict[str, dict[str, Any]] = {}
    for host in KAFKA_HOSTS:
        began = time.time()
        per_broker[host] = {"began": began, **{k: round(v, 1) for k, v in bed.restart_broker(host).items()},
                            "stream_still_running": bed.alive("producer")}
    done_at = time.time()
    # At least the first two restarts happened while the streams flowed (the third one too, unless the machine
    # is slow enough that the five minutes of streams ran out first).
    assert all(per_broker[h]["stream_still_running"] for h in KAFKA_HOSTS[:2]), per_broker

    account = job.finish(ROLLING_PER_DEVICE)
    for restart in per_broker.values():  # each node's restart, from its stop to its replicas in sync
        restart.update(resume_figures(account.feedback, restart.pop("began"), restart["in_sync_seconds"]))
    figures = {"fault": "rolling restart of kafka-1, kafka-2, kafka-3 (SIGTERM, start, wait in sync)",
               "restart_s": round(done_at - fault_at, 1), "per_broker": per_broker,
               **resume_figures(account.feedback, fault_at, done_at - fault_at), **accounting_figures(account)}
    report_figures(figures)
    assert_nothing_lost_duplicates_bounded(account)
    assert [restarts(bed, h) for h in TRAINER_HOSTS] == [0, 0]
    assert account.duplicates() == dict.fromkeys(job.devices, 0), figures
