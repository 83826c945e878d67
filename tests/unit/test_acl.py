"""The roles' ACLs as data: exactly what each role needs, how applying compares with the cluster, the names."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from streamtrain import scram
from streamtrain.acl import Acl, plan_acls, role_acls
from streamtrain.authz import principal_of, refusal
from streamtrain.config import ConfigError, KafkaConfig, StreamtrainConfig, load_config

CFG = StreamtrainConfig(job="cams", kafka=KafkaConfig(topic_prefix="st"))


def _rights(acls: list[Acl], user: str) -> set[tuple[str, str, str]]:
    return {(a.operation, a.resource_type, a.resource + ("*" if a.pattern == "PREFIXED" else ""))
            for a in acls if a.principal == f"User:{user}"}


def test_each_role_gets_exactly_what_its_service_uses() -> None:
    acls = role_acls(CFG, ["0", "1"])
    assert all(a.permission == "ALLOW" and a.host == "*" for a in acls)
    assert _rights(acls, "streamtrain-producer-0") == {("WRITE", "TOPIC", "st.device.0")}
    assert _rights(acls, "streamtrain-producer-1") == {("WRITE", "TOPIC", "st.device.1")}
    assert _rights(acls, "streamtrain-trainer") == {
        ("READ", "TOPIC", "st.device.0"), ("READ", "TOPIC", "st.device.1"), ("READ", "TOPIC", "st.assignments"),
        ("WRITE", "TOPIC", "st.feedback"), ("WRITE", "TOPIC", "st.dead-letter"), ("READ", "GROUP", "cams.trainers"),
        ("WRITE", "TOPIC", "st.models")}
    assert _rights(acls, "streamtrain-serve") == {
        ("READ", "TOPIC", "st.requests"), ("READ", "TOPIC", "st.models"), ("WRITE", "TOPIC", "st.predictions"),
        ("READ", "GROUP", "cams.serve")}
    # An application asking serve: its requests in, the predictions out, nothing else.
    assert _rights(acls, "streamtrain-client") == {("WRITE", "TOPIC", "st.requests"),
                                                   ("READ", "TOPIC", "st.predictions")}
    assert _rights(acls, "streamtrain-coordinator") == {
        ("READ", "TOPIC", "st.feedback"), ("READ", "TOPIC", "st.assignments"), ("WRITE", "TOPIC", "st.assignments"),
        ("WRITE", "TOPIC", "st.dead-letter"), ("DESCRIBE", "TOPIC", "st.device.0"), ("DELETE", "TOPIC", "st.device.0"),
        ("DESCRIBE", "TOPIC", "st.device.1"), ("DELETE", "TOPIC", "st.device.1"),
        ("DESCRIBE", "GROUP", "cams.trainers")}
    assert _rights(acls, "streamtrain-admin") == {
        ("CREATE", "TOPIC", "st.*"), ("DESCRIBE_CONFIGS", "TOPIC", "st.*"), ("READ", "TOPIC", "st.*"),
        ("DESCRIBE", "GROUP", "cams.trainers"), ("ALTER", "BROKER", "kafka-cluster"),
        ("DESCRIBE", "BROKER", "kafka-cluster")}
    # Only the coordinator may write plans or delete records; nobody but the trainers writes feedback.
    writers = {a.principal for a in acls if a.operation == "WRITE" and a.resource == "st.assignments"}
    assert writers == {"User:streamtrain-coordinator"}
    assert {a.principal for a in acls if a.operation == "DELETE"} == {"User:streamtrain-coordinator"}
    assert {a.principal for a in acls if a.resource == "st.feedback" and a.operation == "WRITE"} == {
        "User:streamtrain-trainer"}
    # Only the trainers announce model versions; only serve writes predictions.
    assert {a.principal for a in acls if a.resource == "st.models" and a.operation == "WRITE"} == {
        "User:streamtrain-trainer"}
    assert {a.principal for a in acls if a.resource == "st.predictions" and a.operation == "WRITE"} == {
        "User:streamtrain-serve"}
    assert {a.role for a in acls} == {"producer", "trainer", "coordinator", "serve", "client", "admin"}


def test_the_bridge_role_is_granted_only_its_sources_devices_group_and_transactions() -> None:
    assert not any(a.role == "bridge" for a in role_acls(CFG, ["0"]))  # no sources: no bridge, no rights
    sources = ({"topic": "web.events", "decoder": "json"}, {"topic": "sensors.raw", "decoder": "raw"})
    cfg = CFG.model_copy(update={"bridge": CFG.bridge.model_validate({"sources": sources})})
    acls = role_acls(cfg, ["0", "1"])
    assert _rights(acls, "streamtrain-bridge") == {
        ("READ", "TOPIC", "web.events"), ("READ", "TOPIC", "sensors.raw"), ("WRITE", "TOPIC", "st.device.0"),
        ("WRITE", "TOPIC", "st.device.1"), ("WRITE", "TOPIC", "st.dead-letter"), ("READ", "GROUP", "cams.bridge"),
        ("WRITE", "TRANSACTIONAL_ID", "cams.bridge.*")}
    # The admin reads the sources and the bridge's offsets back (accounting); nobody else gains anything.
    assert _rights(acls, "streamtrain-admin") - _rights(role_acls(CFG, ["0", "1"]), "streamtrain-admin") == {
        ("READ", "TOPIC", "web.events"), ("READ", "TOPIC", "sensors.raw"), ("DESCRIBE", "GROUP", "cams.bridge")}
    for role in ("streamtrain-trainer", "streamtrain-coordinator", "streamtrain-producer-0"):
        assert _rights(acls, role) == _rights(role_acls(CFG, ["0", "1"]), role)
    stale = Acl("User:streamtrain-bridge", "READ", "TOPIC", "LITERAL", "web.old")  # a source no longer bridged
    assert plan_acls(acls, [*acls, stale], cfg).extra == []  # not this job's resource: left alone
    extra = Acl("User:streamtrain-bridge", "WRITE", "TRANSACTIONAL_ID", "LITERAL", "cams.bridge.9")
    assert plan_acls(acls, [*acls, extra], cfg).extra == [extra]


def test_one_producer_principal_for_a_host_writes_every_device() -> None:
    cfg = CFG.model_copy(update={"acl": CFG.acl.model_copy(update={"producer": "edge-host-7"})})
    acls = role_acls(cfg, ["a", "b", "c"])
    assert _rights(acls, "edge-host-7") == {("WRITE", "TOPIC", f"st.device.{d}") for d in "abc"}


def test_without_devices_there_is_nothing_to_grant() -> None:
    with pytest.raises(ValueError, match="--devices"):
        role_acls(CFG, [])


def test_applying_compares_with_the_cluster_and_leaves_others_alone() -> None:
    wanted = role_acls(CFG, ["0"])
    unrelated = Acl("User:someone-else", "WRITE", "TOPIC", "LITERAL", "st.assignments")  # foreign: not ours to prune
    stale = Acl("User:streamtrain-trainer", "READ", "TOPIC", "LITERAL", "st.device.9")  # a device dropped
    elsewhere = Acl("User:streamtrain-trainer", "READ", "TOPIC", "LITERAL", "other.device.0")  # another job's
    present = wanted[:5]
    plan = plan_acls(wanted, [*present, unrelated, stale, elsewhere], CFG)
    assert plan.present == sorted(present) and plan.create == sorted(wanted[5:])
    assert plan.extra == [stale] and plan.extra[0].role == "trainer"
    again = plan_acls(wanted, wanted, CFG)
    assert not again.create and not again.extra and len(again.present) == len(wanted)


def test_role_names_are_checked_and_the_broker_names_are_reserved() -> None:
    with pytest.raises(ConfigError, match="reserved"):
        load_config(env={"STREAMTRAIN_ACL__TRAINER": "streamtrain-broker"})
    with pytest.raises(ConfigError, match="different principals"):
        load_config(env={"STREAMTRAIN_ACL__TRAINER": "streamtrain-coordinator"})
    with pytest.raises(ConfigError, match="letters, digits"):
        load_config(env={"STREAMTRAIN_ACL__ADMIN": "root admin"})
    with pytest.raises(ConfigError, match="shorter than 8") as err:
        load_config(env={"STREAMTRAIN_ACL__PASSWORDS": '{"streamtrain-admin": "sh0rt"}'})
    assert "sh0rt" not in str(err.value)
    with pytest.raises(ConfigError, match="streamtrain-controller"):
        load_config(env={"STREAMTRAIN_BROKER__SCRAM_USERS": '{"streamtrain-controller": "a-long-password"}'})
    for own in (scram.BROKER_USER, scram.CONTROLLER_USER):  # the super users' names cannot be taken by a role
        with pytest.raises(ConfigError):
            load_config(env={"STREAMTRAIN_ACL__COORDINATOR": own})


def test_a_refusal_names_the_principal_the_resource_and_the_permission() -> None:
    kafka = KafkaConfig(bootstrap_servers="h:9092", security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
                        sasl_username="streamtrain-producer-0", sasl_password="pw-12345678")
    refused = refusal(kafka, KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), "WRITE", "st.assignments")
    assert refused is not None
    text = str(refused)
    assert "refused User:streamtrain-producer-0 WRITE on topic st.assignments" in text
    assert "TOPIC_AUTHORIZATION_FAILED" in text and "streamtrain acl" in text and "pw-12345678" not in text
    assert refused.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    group = refusal(kafka, KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED), "READ", "cams.trainers")
    assert group is not None and "READ on group cams.trainers" in str(group)
    assert refusal(kafka, KafkaError(KafkaError._TIMED_OUT), "WRITE", "x") is None
    assert refusal(kafka, None, "WRITE", "x") is None
    assert principal_of(KafkaConfig()) == "User:ANONYMOUS (no kafka.sasl_username)"
