"""The test bed's command lines, checked without root: each parses as a real streamtrain command with real
settings, torchrun's flags parse with torchrun's own parser, and names fit Linux's interface-name limit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed.run as torchrun
from typer.testing import CliRunner

from streamtrain.cli import app
from streamtrain.cluster.netns import PREFIX, Network, RunRecord, new_run_id, process_start_time
from streamtrain.cluster.topology import HOSTS, KAFKA_HOSTS, TRAINER_HOSTS, ClusterSpec, Topology
from streamtrain.config import StreamtrainConfig, load_config, parse_assignment

SERVICE_MODULES = {"streamtrain.cli", "streamtrain.producers", "streamtrain.coordinator", "streamtrain.trainer"}


def _topology(**spec: object) -> Topology:
    addresses = {h: f"10.213.7.{octet}" for h, octet in HOSTS.items()}
    return Topology(addresses, ClusterSpec(**spec), StreamtrainConfig(job="cams"), Path("/srv/bed"), "x" * 22)  # type: ignore[arg-type]


def _service_args(argv: list[str]) -> list[str]:
    """The streamtrain arguments of a host's command: after `-m <service module>` (torchrun's too)."""
    at = max(i for i, a in enumerate(argv) if a == "-m" and argv[i + 1] in SERVICE_MODULES)
    return argv[at + 2:]


@pytest.mark.parametrize("host", list(HOSTS))
def test_every_host_runs_a_real_streamtrain_command_with_real_settings(host: str) -> None:
    args = _service_args(_topology().command(host))
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    load_config(env={}, overrides=dict(parse_assignment(s) for s in sets))  # raises naming a bad setting
    # With --help, click still parses every argument first: an unknown flag fails (exit 2) before help.
    result = CliRunner().invoke(app, [*args, "--help"])
    assert result.exit_code == 0, f"{host}: {args}\n{result.output}"
    assert CliRunner().invoke(app, [*args, "--no-such-flag", "--help"]).exit_code == 2


def test_clients_get_the_three_brokers_and_topics_three_replicas() -> None:
    topology = _topology()
    assert topology.bootstrap == "10.213.7.11:9092,10.213.7.12:9092,10.213.7.13:9092"
    for host in ("producer", "coordinator", *TRAINER_HOSTS):
        args = _service_args(topology.command(host))
        assert f"kafka.bootstrap_servers={topology.bootstrap}" in args and "kafka.replication_factor=3" in args
    broker = _service_args(topology.command("kafka-2"))
    assert broker[broker.index("--quorum-voters") + 1] == "1@10.213.7.11:9093,2@10.213.7.12:9093,3@10.213.7.13:9093"
    assert broker[broker.index("--node-id") + 1] == "2" and broker[broker.index("--host") + 1] == "10.213.7.12"


def test_two_elastic_torchrun_nodes_each_train_their_own_devices() -> None:
    topology = _topology(collective_timeout_seconds=30.0)
    for node, host in enumerate(TRAINER_HOSTS):
        argv = topology.command(host)
        assert argv[1:3] == ["-m", "torch.distributed.run"]
        parsed = torchrun.parse_args(argv[3:])  # torchrun's own parser
        assert parsed.nnodes == "1:2" and parsed.nproc_per_node == "2" and parsed.rdzv_backend == "c10d"
        assert parsed.rdzv_endpoint == "10.213.7.41:29400" and parsed.rdzv_id == "cams"
        assert f"is_host={int(node == 0)}" in parsed.rdzv_conf and "read_timeout=3600" in parsed.rdzv_conf
        assert parsed.local_addr == topology.addresses[host]
        assert parsed.module and parsed.training_script == "streamtrain.trainer"
        args = parsed.training_script_args
        assert args[args.index("--node-devices") + 1] == ",".join(("0", "1") if node == 0 else ("2", "3"))
        assert "trainer.collective_timeout_seconds=30.0" in args
        assert "trainer.checkpoint_dir=/srv/bed/checkpoints/cams" in args  # one directory every node shares
        env = topology.environment(host)
        assert env["GLOO_SOCKET_IFNAME"] == "eth0" and env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert "GLOO_SOCKET_IFNAME" not in topology.environment("coordinator")


def test_spec_survives_the_state_file() -> None:
    spec = ClusterSpec(devices=("a", "b"), rate=3.0, trainer_env={"X": "1"})
    assert ClusterSpec.from_dict(spec.to_dict()) == spec
    assert spec.node_devices(0) == ("a",) and spec.node_devices(1) == ("b",)


def test_names_fit_linux_interface_names_and_are_the_runs_own() -> None:
    for _ in range(50):
        network = Network(new_run_id())
        assert len(network.bridge) <= 15 and network.bridge.startswith(PREFIX)
        assert len(f"{PREFIX}{network.run_id}v{len(HOSTS) - 1}") <= 15
        assert network.namespace("kafka-1").startswith(f"{PREFIX}{network.run_id}-")
    assert set(KAFKA_HOSTS) | set(TRAINER_HOSTS) <= set(HOSTS)


def test_a_run_is_stale_once_its_owner_is_gone(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    own = RunRecord("abcde", os.getpid(), None, str(tmp_path))
    assert not own.owner_alive()  # the same pid but not the same start: a recycled pid is not the owner
    assert RunRecord("abcde", os.getpid(), process_start_time(os.getpid()), str(tmp_path)).owner_alive()
    assert not RunRecord("abcde", gone.pid, None, str(tmp_path)).owner_alive()
    assert RunRecord("abcde", None, None, str(tmp_path)).owner_alive()  # `cluster up`: lives with its directory
    assert not RunRecord("abcde", None, None, str(tmp_path / "deleted")).owner_alive()
