"""A node of a multi-node KRaft cluster: its settings are checked at start-up, and its server.properties
replicate as the three-broker compose file does."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from streamtrain.broker import BrokerState, EmbeddedBroker, new_cluster_id, replication_properties
from streamtrain.config import BrokerConfig

ROOT = Path(__file__).resolve().parents[2]
VOTERS = "1@10.9.0.11:9093,2@10.9.0.12:9093,3@10.9.0.13:9093"


def _node(tmp_path: Path, **kw: object) -> BrokerConfig:
    settings = {"data_dir": tmp_path, "host": "10.9.0.12", "port": 9092, "node_id": 2, "quorum_voters": VOTERS,
                "cluster_id": new_cluster_id(), **kw}
    return BrokerConfig.model_validate(settings)


def _properties(cfg: BrokerConfig) -> dict[str, str]:
    state = BrokerState(cfg.host, cfg.port, cfg.voters[cfg.node_id][1], cfg.cluster_id or new_cluster_id())
    text = EmbeddedBroker(cfg).server_properties(state)
    return dict(line.split("=", 1) for line in text.splitlines())


def test_a_node_of_three_listens_on_its_address_and_replicates_three_ways(tmp_path: Path) -> None:
    props = _properties(_node(tmp_path))
    assert props["node.id"] == "2" and props["controller.quorum.voters"] == VOTERS
    assert props["listeners"] == "PLAINTEXT://10.9.0.12:9092,CONTROLLER://10.9.0.12:9093"
    assert props["advertised.listeners"] == "PLAINTEXT://10.9.0.12:9092"
    assert props["default.replication.factor"] == "3" and props["min.insync.replicas"] == "2"
    assert props["offsets.topic.replication.factor"] == "3" and props["transaction.state.log.min.isr"] == "2"


def test_a_single_node_is_its_own_quorum_with_one_replica(tmp_path: Path) -> None:
    cfg = BrokerConfig(data_dir=tmp_path)
    props = dict(line.split("=", 1) for line in EmbeddedBroker(cfg).server_properties(
        BrokerState("127.0.0.1", 9092, 9093, new_cluster_id())).splitlines())
    assert props["node.id"] == "1" and props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert props["default.replication.factor"] == "1" and props["min.insync.replicas"] == "1"
    assert props["offsets.topic.replication.factor"] == "1"


def test_replication_is_in_step_with_the_multi_broker_compose_file() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.multi-broker.yml").read_text())
    env = compose["x-kafka-node-env"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    in_compose = {k.removeprefix("KAFKA_").lower().replace("_", "."): str(v) for k, v in env.items()}
    ours = replication_properties(3)
    assert {k: in_compose.get(k) for k in ours} == ours
    # ... and nothing replication-related in compose that the embedded cluster leaves out.
    assert {k for k in in_compose if "replica" in k or "isr" in k} == set(ours)


@pytest.mark.parametrize(("kw", "names"), [
    ({"node_id": 4}, "broker.node_id 4 is not in broker.quorum_voters"),
    ({"host": "10.9.0.99"}, "names node 2 at 10.9.0.12, but broker.host is 10.9.0.99"),
    ({"controller_port": 9999}, "broker.controller_port 9999 differs"),
    ({"cluster_id": None}, "needs broker.cluster_id"),
    ({"quorum_voters": "1@a:9093,x"}, "'x' is not id@host:port"),
    ({"quorum_voters": "2@10.9.0.12:9093,2@b:9093"}, "node 2 appears twice"),
    ({"cluster_id": "-bad"}, "cluster_id"),
    ({"security_protocol": "SASL_PLAINTEXT", "scram_users": {"u": "password1"}}, "single-node only"),
])
def test_a_node_that_cannot_join_fails_at_start_naming_the_setting(tmp_path: Path, kw: dict[str, object],
                                                                    names: str) -> None:
    with pytest.raises(ValidationError, match=names):
        _node(tmp_path, **kw)


def test_the_controller_port_comes_from_the_quorum(tmp_path: Path) -> None:
    cfg = _node(tmp_path, quorum_voters="1@10.9.0.11:9093,2@10.9.0.12:19093,3@10.9.0.13:9093")
    assert cfg.controller_port == 0 and cfg.voters[2] == ("10.9.0.12", 19093)
