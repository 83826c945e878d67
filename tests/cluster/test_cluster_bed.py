"""The test bed itself: seven hosts with their own addresses, a three-node Kafka cluster replicating three ways,
four ranks training across two torchrun nodes from the three-broker bootstrap list, `cluster status`, and
the sweep that removes what a killed run left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_job import ClusterJob, accounting_figures

from streamtrain.cluster.bed import ClusterBed
from streamtrain.cluster.health import partition_leaders
from streamtrain.cluster.netns import Network, namespace_pids, netns_unavailable, new_run_id, process_start_time, sweep
from streamtrain.cluster.topology import HOSTS, KAFKA_HOSTS, TRAINER_HOSTS
from streamtrain.config import KafkaConfig
from streamtrain.kafka import list_topics, make_admin, topic_config
from streamtrain.runtime.commands import CLI_MODULE, module_command

pytestmark = pytest.mark.integration

PER_DEVICE = 150


def test_four_ranks_on_two_torchrun_nodes_train_from_a_three_node_cluster_and_lose_nothing(
        bed: ClusterBed, tmp_path: Path) -> None:
    addresses = {h: bed.address(h) for h in HOSTS}
    assert len(set(addresses.values())) == len(HOSTS)
    assert all(a.rsplit(".", 1)[0] == bed.network.gateway.rsplit(".", 1)[0] for a in addresses.values())
    assert bed.broker_ids() == {1, 2, 3}

    job = ClusterJob(bed, tmp_path, "smoke")
    job.start()
    job.produce(PER_DEVICE, rate=30.0)
    account = job.finish(PER_DEVICE, timeout=240)

    # Every client was given the three brokers (the coordinator's command line, as the process runs it).
    assert f"kafka.bootstrap_servers={bed.bootstrap}" in bed.services["coordinator"].argv
    # The job's topics: three replicas, all in sync, min.insync.replicas 2 from the brokers' defaults.
    admin = make_admin(KafkaConfig(bootstrap_servers=bed.bootstrap))
    meta = list_topics(admin, 10)
    device_topic = job.config.kafka.topics.device("0")
    partition = meta.topics[device_topic].partitions[0]
    assert len(partition.replicas) == 3 and sorted(partition.isrs) == sorted(partition.replicas)
    assert topic_config(admin, device_topic)["min.insync.replicas"] == "2"
    assert partition_leaders(bed.bootstrap, [device_topic])[device_topic] in {1, 2, 3}
    # Two torchrun nodes, one c10d rendezvous: a world of four, each node's ranks training its own devices.
    for node, host in enumerate(TRAINER_HOSTS):
        log = bed.log_path(host).read_text(errors="replace")
        assert log.count("/4 joined") == 2, log[-3000:]
        for device in bed.spec.node_devices(node):
            assert f"({device}): resuming at step" in log
    # A fault-free run: everything trained once.
    assert account.lost() == dict.fromkeys(job.devices, 0), accounting_figures(account)
    assert account.duplicates() == dict.fromkeys(job.devices, 0), accounting_figures(account)


def _status(bed: ClusterBed) -> tuple[int, dict[str, object]]:
    done = subprocess.run(module_command(CLI_MODULE, "cluster", "status", "--dir", str(bed.state_dir), "--json"),
                          capture_output=True, text=True, timeout=120, check=False)
    return done.returncode, json.loads(done.stdout)


def test_cluster_status_shows_every_host_and_fails_while_a_cable_is_out(bed: ClusterBed) -> None:
    code, report = _status(bed)
    assert code == 0, report
    hosts = {h["name"]: h for h in report["hosts"]}  # type: ignore[attr-defined]
    assert set(hosts) == set(HOSTS) and all(h["link_up"] for h in hosts.values())
    assert all(hosts[h]["service_alive"] for h in KAFKA_HOSTS)
    assert report["kafka"] == {"brokers": [1, 2, 3], "under_replicated": []}
    bed.cut("producer")
    try:
        code, report = _status(bed)
        assert code == 1
        assert not {h["name"]: h for h in report["hosts"]}["producer"]["link_up"]  # type: ignore[attr-defined]
    finally:
        bed.restore("producer")


def test_the_sweep_removes_a_bed_whose_owner_died_and_spares_a_live_one(tmp_path: Path,
                                                                       cluster_bed: ClusterBed) -> None:
    if (reason := netns_unavailable()) is not None:
        pytest.skip(reason)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # an owner that has exited: a test session killed outright
    network = Network(new_run_id())
    hosts = network.create({"a": 11, "b": 12}, owner_pid=gone.pid, state_dir=tmp_path)
    sleeper = subprocess.Popen(["ip", "netns", "exec", hosts["a"].namespace, "sleep", "300"],
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while namespace_pids(hosts["a"].namespace) != [sleeper.pid]:  # `ip netns exec` enters, then runs sleep
            assert time.monotonic() < deadline and sleeper.poll() is None, namespace_pids(hosts["a"].namespace)
            time.sleep(0.05)
        removed = sweep()
        assert network.run_id in removed and cluster_bed.network.run_id not in removed
        assert sleeper.wait(10) == -9  # the process in the dead owner's namespace was killed
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
        assert f"stc{network.run_id}" not in listed and network.bridge not in links
        assert f"stc{network.run_id}v0" not in links
        assert not Path(f"/run/streamtrain-cluster/{network.run_id}.json").exists()
        assert cluster_bed.processes("kafka-1") >= 1 and process_start_time(os.getpid()) is not None
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        network.destroy()
