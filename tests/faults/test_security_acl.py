"""Kafka's authorizer on the real broker: each role may do its job and nothing else, refusals say who lacked what.

One SASL/SCRAM broker with ACLs on (super users: only the broker and its controller), a user per role, and one
user with no rights at all. `streamtrain acl apply` (the CLI, in its own process) grants the roles their ACLs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
from fuzzing import forged_feedback, forged_plans
from prometheus_client import CollectorRegistry

from streamtrain import DeliveryError, DeviceProducer, scram
from streamtrain.acl import role_acls
from streamtrain.authz import AuthorizationError
from streamtrain.bridge.service import Bridge
from streamtrain.broker import EmbeddedBroker, find_kafka_libs
from streamtrain.config import BrokerConfig, KafkaConfig, StreamtrainConfig
from streamtrain.coordinator.inputs import OffsetProbe
from streamtrain.kafka import TopicSpec, ensure_topics, make_admin, make_consumer, make_producer, read_to_end
from streamtrain.report.source_accounting import collect_sources, tally_sources
from streamtrain.runtime.commands import CLI_MODULE, module_command
from streamtrain.wire import Sample, encode

pytestmark = pytest.mark.faults

PREFIX = f"acl{uuid.uuid4().hex[:8]}"
ROLES = ("streamtrain-admin", "streamtrain-coordinator", "streamtrain-trainer", "streamtrain-producer-0",
         "streamtrain-producer-1", "streamtrain-bridge", "mallory")
PASSWORDS = {user: f"{user}-{uuid.uuid4().hex}" for user in ROLES}
STARTING = {KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
            KafkaError._TIMED_OUT}


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    broker = EmbeddedBroker(BrokerConfig(data_dir=tmp_path_factory.mktemp("acl"), heap="512m",
                                         security_protocol="SASL_PLAINTEXT", scram_users=PASSWORDS))
    broker.start()
    try:
        done = _cli(broker, "acl", "apply", "--devices", "0,1", "--topics", "--as-broker", str(broker.data_dir))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        yield broker
    finally:
        broker.stop(timeout=30)


def _as(broker: EmbeddedBroker, user: str) -> KafkaConfig:
    return KafkaConfig(bootstrap_servers=broker.bootstrap, topic_prefix=PREFIX, security_protocol="SASL_PLAINTEXT",
                       sasl_mechanism="SCRAM-SHA-512", sasl_username=user, sasl_password=PASSWORDS[user])


def _cli(broker: EmbeddedBroker, *args: str, user: str | None = None,
         env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STREAMTRAIN_KAFKA__TOPIC_PREFIX": PREFIX, "STREAMTRAIN_KAFKA__BOOTSTRAP_SERVERS":
           broker.bootstrap, "COLUMNS": "200", **(env_extra or {})}
    if user is not None:
        env |= {"STREAMTRAIN_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT", "STREAMTRAIN_KAFKA__SASL_MECHANISM":
                "SCRAM-SHA-512", "STREAMTRAIN_KAFKA__SASL_USERNAME": user, "STREAMTRAIN_KAFKA__SASL_PASSWORD":
                PASSWORDS[user]}
    return subprocess.run(module_command(CLI_MODULE, *args), env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def _produce(kafka: KafkaConfig, topic: str, records: list[tuple[bytes, list]]) -> None:
    producer = make_producer(kafka)
    for value, headers in records:
        producer.produce(topic, value=value, headers=headers)
    producer.flush(30)


def _end(broker: EmbeddedBroker, topic: str) -> int:
    consumer = make_consumer(_as(broker, "streamtrain-admin"), f"{PREFIX}.probe")
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        consumer.close()


def _commit(consumer: Consumer, tp: TopicPartition) -> None:
    """Commit, riding out a fresh broker's group coordinator that is still loading."""
    deadline = time.monotonic() + 60
    while True:
        try:
            consumer.commit(offsets=[tp], asynchronous=False)
            return
        except KafkaException as exc:
            if exc.args[0].code() not in STARTING or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_acl_apply_is_idempotent_and_show_lists_every_role(acl_broker: EmbeddedBroker) -> None:
    again = _cli(acl_broker, "acl", "apply", "--devices", "0,1", "--as-broker", str(acl_broker.data_dir))
    assert again.returncode == 0, again.stderr[-3000:]
    wanted = role_acls(StreamtrainConfig(kafka=KafkaConfig(topic_prefix=PREFIX)), ["0", "1"])
    assert f"nothing to change: all {len(wanted)} ACLs already present" in again.stdout
    as_json = _cli(acl_broker, "acl", "apply", "--devices", "0,1", "--json", user="streamtrain-admin")
    assert as_json.returncode == 0, as_json.stderr[-3000:]
    result = json.loads(as_json.stdout)
    assert result["changed"] is False and {row["status"] for row in result["acls"]} == {"present"}
    shown = _cli(acl_broker, "acl", "show", "--devices", "0,1", "--json", user="streamtrain-admin")
    assert shown.returncode == 0, shown.stderr[-3000:]
    rows = json.loads(shown.stdout)
    assert len(rows) == len(wanted) and {r["status"] for r in rows} == {"ok"}
    assert {r["role"] for r in rows} == {"admin", "coordinator", "trainer", "producer", "serve", "client"}
    table = _cli(acl_broker, "acl", "show", "--devices", "0,1", user="streamtrain-admin")
    assert f"topic {PREFIX}.assignments" in table.stdout and "User:streamtrain-coordinator" in table.stdout


def test_a_principal_without_rights_can_neither_list_nor_grant(acl_broker: EmbeddedBroker) -> None:
    for args in (("acl", "show", "--devices", "0"), ("acl", "apply", "--devices", "0")):
        done = _cli(acl_broker, *args, user="mallory")
        assert done.returncode == 1
        assert "refused User:mallory DESCRIBE on cluster kafka-cluster" in " ".join(done.stderr.split())


def test_forged_plans_and_feedback_from_other_principals_are_refused_by_the_broker(
        acl_broker: EmbeddedBroker) -> None:
    assignments, feedback = f"{PREFIX}.assignments", f"{PREFIX}.feedback"
    before = (_end(acl_broker, assignments), _end(acl_broker, feedback))
    plans = [(r.value, r.headers) for r in forged_plans(3, "job", ("0", "1"))]
    reports = [(r.value, r.headers) for r in forged_feedback(3, "job", "0")]
    cases = [  # (who, where, what): none of them may write there
        ("streamtrain-producer-0", assignments, plans), ("streamtrain-producer-0", feedback, reports),
        ("streamtrain-trainer", assignments, plans), ("streamtrain-coordinator", feedback, reports),
        ("mallory", assignments, plans), ("streamtrain-producer-0", f"{PREFIX}.device.1", plans),
    ]
    for user, topic, records in cases:
        with pytest.raises(AuthorizationError) as refused:
            _produce(_as(acl_broker, user), topic, records)
        assert f"refused User:{user} WRITE on topic {topic} (TOPIC_AUTHORIZATION_FAILED)" in str(refused.value)
        assert PASSWORDS[user] not in str(refused.value)
    assert (_end(acl_broker, assignments), _end(acl_broker, feedback)) == before  # nothing got through


def test_a_device_producer_logs_in_writes_its_own_device_and_is_stopped_on_any_other(
        acl_broker: EmbeddedBroker) -> None:
    kafka = _as(acl_broker, "streamtrain-producer-0")
    with DeviceProducer(kafka, device="0") as own:  # the SCRAM login comes from the same KafkaConfig
        own.send(np.ones((3, 2), dtype=np.float32), label=1)
    assert own.delivered == 1
    other = DeviceProducer(kafka, device="1")
    other.send(np.ones((3, 2), dtype=np.float32), label=1)
    refused = f"refused User:streamtrain-producer-0 WRITE on topic {PREFIX}.device.1"
    with pytest.raises(AuthorizationError, match=refused):
        other.flush(30)
    with pytest.raises(DeliveryError, match="1 sample"):  # and the sample is counted as failed, not dropped
        other.close()


def test_reads_deletes_commits_and_topic_creation_beyond_a_role_are_refused(acl_broker: EmbeddedBroker) -> None:
    with pytest.raises(AuthorizationError, match=rf"User:streamtrain-producer-0 DESCRIBE on topic {PREFIX}\.feedb"):
        list(read_to_end(_as(acl_broker, "streamtrain-producer-0"), [f"{PREFIX}.feedback"], timeout=20))
    # The coordinator may see a device topic's offsets, not its samples.
    _produce(_as(acl_broker, "streamtrain-producer-0"), f"{PREFIX}.device.0",
             [encode(Sample.from_array("0", 0, np.ones((3, 4), np.float32), label=1))])
    with pytest.raises(AuthorizationError, match=rf"User:streamtrain-coordinator READ on topic {PREFIX}\.device\.0"):
        list(read_to_end(_as(acl_broker, "streamtrain-coordinator"), [f"{PREFIX}.device.0"], timeout=20))
    trainer = _as(acl_broker, "streamtrain-trainer")
    with pytest.raises(AuthorizationError, match=rf"User:streamtrain-trainer CREATE on topic {PREFIX}\.device\.9"):
        ensure_topics(make_admin(trainer), [TopicSpec.from_config(trainer, trainer.topics.device("9"))], timeout=20)
    probe = OffsetProbe(make_admin(trainer), "job.trainers", timeout=10)
    with pytest.raises(KafkaException) as deleted:
        probe.delete_before(f"{PREFIX}.device.0", 1)
    assert deleted.value.args[0].code() == 29  # TOPIC_AUTHORIZATION_FAILED: only the coordinator deletes records
    # session.timeout.ms bounds how long librdkafka holds a commit waiting for a group coordinator it is refused
    # (45 s by default, then "waiting for coordinator"): the refusal itself comes as the error event polled below.
    committer = make_consumer(_as(acl_broker, "streamtrain-producer-1"), "streamtrain.trainers",
                              **{"session.timeout.ms": 6000})
    try:  # not a trainer: may not commit in the trainers' group (librdkafka says so as an error event)
        with pytest.raises(KafkaException):
            committer.commit(offsets=[TopicPartition(f"{PREFIX}.device.1", 0, 0)], asynchronous=False)

        def refused(e: Message | None) -> bool:
            error = e.error() if e is not None else None
            return error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED

        events: list[Message | None] = []
        while len(events) < 20 and not any(map(refused, events)):  # up to 10 s as before, or until the refusal
            events.append(committer.poll(0.5))
        assert any(map(refused, events))
    finally:
        committer.close()


def test_each_role_can_do_its_own_job(acl_broker: EmbeddedBroker) -> None:
    device0 = f"{PREFIX}.device.0"
    samples = [encode(Sample.from_array("0", seq, np.ones((3, 4), np.float32), label=1)) for seq in range(5)]
    start = _end(acl_broker, device0)
    _produce(_as(acl_broker, "streamtrain-producer-0"), device0, samples)
    trainer = _as(acl_broker, "streamtrain-trainer")
    assert len(list(read_to_end(trainer, [device0], timeout=30))) == start + 5
    committer = make_consumer(trainer, "streamtrain.trainers")
    try:
        _commit(committer, TopicPartition(device0, 0, start + 2))
    finally:
        committer.close()
    coordinator = _as(acl_broker, "streamtrain-coordinator")
    probe = OffsetProbe(make_admin(coordinator), "streamtrain.trainers", 10,
                        reader=make_consumer(coordinator, "streamtrain.trainers"))
    try:
        assert probe.offsets({"0": device0})["0"].committed == start + 2
        assert probe.delete_before(device0, start + 1) == start + 1
    finally:
        probe.close()
    _produce(coordinator, f"{PREFIX}.assignments", [(r.value, r.headers) for r in forged_plans(1, "job", ("0",))])
    admin = _as(acl_broker, "streamtrain-admin")
    assert len(list(read_to_end(admin, [f"{PREFIX}.assignments", device0], timeout=30))) >= 5


def test_prune_removes_a_right_granted_by_hand(acl_broker: EmbeddedBroker) -> None:
    admin = make_admin(_as(acl_broker, "streamtrain-admin"))
    extra = AclBinding(ResourceType.TOPIC, f"{PREFIX}.assignments", ResourcePatternType.LITERAL,
                       "User:streamtrain-trainer", "*", AclOperation.WRITE, AclPermissionType.ALLOW)
    for future in admin.create_acls([extra]).values():
        future.result(timeout=30)
    shown = json.loads(_cli(acl_broker, "acl", "show", "--devices", "0,1", "--json", user="streamtrain-admin").stdout)
    assert [(r["status"], r["operation"], r["resource"]) for r in shown if r["status"] != "ok"] == [
        ("extra", "WRITE", f"{PREFIX}.assignments")]
    _produce(_as(acl_broker, "streamtrain-trainer"), f"{PREFIX}.assignments",
             [(r.value, r.headers) for r in forged_plans(1, "job", ("0",))])  # the hand-made right works...
    done = _cli(acl_broker, "acl", "apply", "--devices", "0,1", "--prune", user="streamtrain-admin")
    assert done.returncode == 0 and "removed 1" in done.stdout, done.stdout + done.stderr
    with pytest.raises(AuthorizationError):  # ...and is gone
        _produce(_as(acl_broker, "streamtrain-trainer"), f"{PREFIX}.assignments",
                 [(r.value, r.headers) for r in forged_plans(1, "job", ("0",))])


def test_the_controller_listener_is_no_way_around_the_authorizer(acl_broker: EmbeddedBroker, tmp_path: Path) -> None:
    """The controller's port authenticates too: without its own credentials nobody reaches it (it would otherwise
    be a side door where any local user acts as a super user)."""
    state = json.loads((acl_broker.data_dir / "broker.json").read_text())
    controller = f"{state['host']}:{state['controller_port']}"
    secret = (acl_broker.data_dir / "broker-secret").read_text().strip()
    fast = "default.api.timeout.ms=8000\nrequest.timeout.ms=4000\n"

    def quorum(client: str) -> subprocess.CompletedProcess[str]:
        props = tmp_path / "client.properties"
        props.write_text(fast + client)
        props.chmod(0o600)
        return subprocess.run(["java", "-Xmx256m", "-cp", f"{find_kafka_libs()}/*",
                               "org.apache.kafka.tools.MetadataQuorumCommand", "--bootstrap-controller", controller,
                               "--command-config", str(props), "describe", "--status"],
                              capture_output=True, text=True, timeout=120, check=False)

    def plain(user: str, password: str) -> str:
        return ("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.jaas.config=org.apache.kafka.common."
                f'security.plain.PlainLoginModule required username="{user}" password="{password}";\n')

    assert quorum("").returncode != 0  # no credentials
    assert quorum(plain("streamtrain-admin", PASSWORDS["streamtrain-admin"])).returncode != 0  # a role's are not it
    own = quorum(plain(scram.CONTROLLER_USER, secret))
    assert own.returncode == 0 and "CurrentVoters" in own.stdout, own.stdout[-2000:] + own.stderr[-2000:]


def test_the_bridge_may_bridge_its_sources_exactly_once_and_do_nothing_else(acl_broker: EmbeddedBroker) -> None:
    """The bridge's ACLs (granted once bridge.sources names topics) are enough for its transactions (its
    transactional id, its group's offsets in them) and no more. Another job prefix: the other tests' ACL counts
    stay as they are."""
    prefix, source = f"{PREFIX}b", f"{PREFIX}-web-events"
    sources = [{"topic": source, "decoder": "json", "mapping": {"data": "v", "label": "y"}}]
    env = {"STREAMTRAIN_KAFKA__TOPIC_PREFIX": prefix, "STREAMTRAIN_BRIDGE__SOURCES": json.dumps(sources)}
    done = _cli(acl_broker, "acl", "apply", "--devices", "0,1", "--topics", "--as-broker", str(acl_broker.data_dir),
                env_extra=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    root = acl_broker.own_identity(KafkaConfig(bootstrap_servers=acl_broker.bootstrap, topic_prefix=prefix))
    ensure_topics(make_admin(root), [TopicSpec(source, 2)])  # the user's topic: not streamtrain's to create
    _produce(root, source, [(b'{"v": [[1, 2, 3, 4]], "y": 1}', []), (b"not json", [])])  # keyless: no device
    producer = make_producer(root)
    producer.produce(source, key=b"1", value=b'{"v": [[1, 2, 3, 4], [5, 6, 7, 8]], "y": 0}')
    producer.flush(30)

    def as_user(user: str) -> StreamtrainConfig:  # check_min_decoded: 2 of the 3 records are rejects on purpose
        kafka = _as(acl_broker, user).model_copy(update={"topic_prefix": prefix})
        return StreamtrainConfig.model_validate({"kafka": kafka.model_dump(mode="json") | {
            "sasl_password": PASSWORDS[user]}, "bridge": {"sources": sources, "devices": ["0", "1"],
                                                          "metrics": False, "check_min_decoded": 0.25}})

    bridge = Bridge(as_user("streamtrain-bridge"), CollectorRegistry())
    bridge.start()
    try:
        deadline = time.monotonic() + 60
        while bridge.metrics.registry.get_sample_value(
                "streamtrain_bridge_records_in_total", {"job": "streamtrain", "topic": source}) != 3:
            assert time.monotonic() < deadline, "the bridge did not bridge its 3 records"
            bridge.run_once(0.2)
    finally:
        bridge.close()
    tallies = tally_sources(collect_sources(as_user("streamtrain-admin"), timeout=30))  # the admin audits it
    assert sum(t.fates.trained for t in tallies) == 1 and sum(t.fates.dead_lettered for t in tallies) == 2
    assert all(t.exact and t.fates.complete for t in tallies), [t.summary() for t in tallies]
    bridge_kafka = as_user("streamtrain-bridge").kafka
    for topic in (f"{prefix}.assignments", f"{prefix}.feedback", source):  # no plans, no feedback, no source writes
        with pytest.raises(AuthorizationError, match=f"User:streamtrain-bridge WRITE on topic {topic}"):
            _produce(bridge_kafka, topic, [(b"x", [])])
    with pytest.raises(AuthorizationError, match=rf"User:streamtrain-bridge DESCRIBE on topic {PREFIX}\.feedback"):
        list(read_to_end(bridge_kafka, [f"{PREFIX}.feedback"], timeout=20))  # nor read anything but its sources
