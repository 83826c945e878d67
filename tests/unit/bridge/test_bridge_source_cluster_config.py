"""`bridge.source_cluster`: the sources' own cluster as settings (the fields of `kafka` that say how to reach a
cluster, named under their own path), where the bridge keeps its progress then (the source topics' twins on the
stack's cluster), and the rights its principal gets there. On two real brokers:
tests/integration/bridge/test_bridge_source_cluster.py."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition

from streamtrain.acl import role_acls
from streamtrain.bridge.progress import BridgeProgress
from streamtrain.config import ConfigError, StreamtrainConfig, config_environment, load_config

SOURCES = '[{"topic": "sensors", "decoder": "json"}]'
REMOTE = {"STREAMTRAIN_BRIDGE__SOURCES": SOURCES,
          "STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__BOOTSTRAP_SERVERS": "upstream-1:9093,upstream-2:9093",
          "STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
          "STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__SASL_MECHANISM": "SCRAM-SHA-512",
          "STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__SASL_USERNAME": "reader",
          "STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__SASL_PASSWORD": "s3cret-Source"}


def test_the_environment_sets_the_source_cluster_and_its_password_stays_masked() -> None:
    cfg = load_config(env=REMOTE)
    source = cfg.bridge.source_cluster
    assert source is not None and source.bootstrap_servers == "upstream-1:9093,upstream-2:9093"
    assert source.sasl_password is not None and source.sasl_password.get_secret_value() == "s3cret-Source"
    assert "s3cret-Source" not in repr(cfg) and "s3cret-Source" not in cfg.model_dump_json()
    assert source.redacted_client()["sasl.password"] == "***"
    assert cfg.kafka.bootstrap_servers == "127.0.0.1:9092"  # the stack's own cluster is untouched
    # A child process (up's services) gets it whole, and reads the same settings back.
    again = load_config(env=config_environment(cfg))
    assert again.bridge.source_cluster == source


def test_empty_values_are_unset_and_a_section_of_nothing_else_is_no_source_cluster() -> None:
    blank = {k: "" for k in REMOTE if "SOURCE_CLUSTER" in k}
    assert load_config(env={**blank, "STREAMTRAIN_BRIDGE__SOURCES": SOURCES}).bridge.source_cluster is None
    partly = load_config(env={**REMOTE, "STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__SSL_CA_LOCATION": ""})
    assert partly.bridge.source_cluster is not None and partly.bridge.source_cluster.ssl_ca_location is None


@pytest.mark.parametrize(("env", "words"), [
    ({"STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__SASL_PASSWORD": "x"},
     "bridge.source_cluster.bootstrap_servers: Field required"),
    ({**REMOTE, "STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__SASL_USERNAME": ""},
     "bridge.source_cluster.sasl_mechanism=SCRAM-SHA-512 needs bridge.source_cluster.sasl_username"),
    ({**REMOTE, "STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__TOPIC_PREFIX": "x"},
     "bridge.source_cluster.topic_prefix: unknown setting"),
    ({**REMOTE, "STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__SSL_CA_LOCATION": "/no/such/ca.pem"},
     "bridge.source_cluster.ssl_ca_location: /no/such/ca.pem is not a readable file"),
    ({**REMOTE, "STREAMTRAIN_BRIDGE__SOURCES": '[{"topic": "' + "t" * 240 + '"}]'},
     "bridge.sources.0.topic: the bridge keeps its progress"),
])
def test_a_bad_source_cluster_setting_is_named_under_its_own_path(env: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError, match="invalid configuration") as bad:
        load_config(env=env)
    assert words in str(bad.value), str(bad.value)
    assert "s3cret-Source" not in str(bad.value)


def test_on_one_cluster_the_group_commits_the_source_partitions_themselves() -> None:
    progress = BridgeProgress(load_config(env={"STREAMTRAIN_BRIDGE__SOURCES": SOURCES}))
    parts = [TopicPartition("sensors", 2, 41)]
    assert not progress.remote and progress.group_topics() == ["sensors"]
    assert progress.tracked(parts) == parts and progress.sources_of(parts) == parts
    assert progress.source.bootstrap_servers == progress.kafka.bootstrap_servers


def test_on_two_clusters_the_group_commits_the_source_offsets_under_the_twins_on_the_stacks_cluster() -> None:
    cfg = load_config(env={**REMOTE, "STREAMTRAIN_KAFKA__TOPIC_PREFIX": "cams"})
    progress = BridgeProgress(cfg)
    assert progress.remote and progress.group_topics() == ["cams.bridge-offsets.sensors"]
    (tracked,) = progress.tracked([TopicPartition("sensors", 2, 41)])
    assert (tracked.topic, tracked.partition, tracked.offset) == ("cams.bridge-offsets.sensors", 2, 41)
    (back,) = progress.sources_of([tracked, TopicPartition("cams.device.0", 0, 5)])  # not a twin: left out
    assert (back.topic, back.partition, back.offset) == ("sensors", 2, 41)
    assert "bridge.source_cluster.bootstrap_servers=upstream-1:9093" in progress.where


def test_reading_another_cluster_the_bridge_is_granted_its_twins_here_and_not_the_source_topics() -> None:
    one = load_config(env={"STREAMTRAIN_BRIDGE__SOURCES": SOURCES})
    two = load_config(env=REMOTE)

    def bridge_rights(cfg: StreamtrainConfig) -> set[tuple[str, str]]:
        return {(a.operation, a.resource) for a in role_acls(cfg, ["0"]) if a.role == "bridge"
                and a.resource_type == "TOPIC" and not a.resource.startswith(f"{cfg.kafka.topic_prefix}.device.")
                and a.resource != cfg.kafka.topics.dead_letter}

    assert bridge_rights(one) == {("READ", "sensors")}
    twin = two.kafka.topics.bridge_offsets("sensors")
    assert bridge_rights(two) == {("READ", twin), ("CREATE", twin), ("ALTER", twin)}
    assert not any(a.resource == "sensors" for a in role_acls(two, ["0"]))  # its cluster's ACLs are its owner's


def test_up_hands_its_bridge_the_source_cluster_in_its_environment_never_on_its_command_line() -> None:
    from streamtrain.config import parse_assignment
    from streamtrain.stack.bridging import bridge_spec

    source = {"bootstrap_servers": "upstream:9093", "security_protocol": "SASL_PLAINTEXT",
              "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "reader", "sasl_password": "s3cret-Source"}
    section = {"sources": [{"topic": "sensors"}], "devices": ["0"], "source_cluster": source}
    spec = bridge_spec(9600, section, {"kafka.bootstrap_servers": "stack:9092"}, [])
    assert not any("s3cret-Source" in arg for arg in spec.argv)
    sets = dict(parse_assignment(a) for a, flag in zip(spec.argv[1:], spec.argv, strict=False) if flag == "--set")
    assert set(spec.env) == {"STREAMTRAIN_BRIDGE__SOURCE_CLUSTER"}
    cfg = load_config(env=dict(spec.env), overrides=sets)  # as the child reads it: each setting flagged on its own
    assert cfg.bridge.source_cluster is not None and cfg.bridge.source_cluster.sasl_username == "reader"
    assert [s.topic for s in cfg.bridge.sources] == ["sensors"] and cfg.kafka.bootstrap_servers == "stack:9092"
