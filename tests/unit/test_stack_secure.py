"""`streamtrain up --secure`'s identities: a principal and a fresh password per role, passed by environment."""

from __future__ import annotations

from streamtrain.config import BrokerConfig, KafkaConfig, StreamtrainConfig, load_config
from streamtrain.stack.secure import Identities, secure_broker_config

CFG = StreamtrainConfig(job="cams", kafka=KafkaConfig(topic_prefix="st"))


def test_a_secure_stack_gives_every_role_its_own_fresh_password_through_the_environment() -> None:
    ids = Identities.generate(CFG, ["0", "1"])
    assert set(ids.passwords) == {"streamtrain-admin", "streamtrain-coordinator", "streamtrain-trainer",
                                  "streamtrain-producer-0", "streamtrain-producer-1"}
    assert len(set(ids.passwords.values())) == 5 and all(len(p) >= 24 for p in ids.passwords.values())
    assert Identities.generate(CFG, ["0", "1"]).passwords != ids.passwords
    env = ids.env(ids.producers["1"])
    assert env["STREAMTRAIN_KAFKA__SASL_USERNAME"] == "streamtrain-producer-1"
    assert load_config(env=env).kafka.sasl_password is not None  # a child loads it as its own setting
    broker = secure_broker_config(BrokerConfig(), ids)
    assert broker.acls and broker.security_protocol == "SASL_PLAINTEXT"
    assert set(broker.scram_users) == set(ids.passwords)
    kafka = ids.producer_kafka(CFG.kafka, "0")
    assert kafka.sasl_username == "streamtrain-producer-0" and kafka.topic_prefix == "st"
