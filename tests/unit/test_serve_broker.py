"""serve's watch on its broker: an outage told once in a while, ridden through when short, given up when long."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError

from streamtrain.serve.broker import LOG_EVERY_S, BrokerGone, BrokerWatch, quiet_connection_failures


def test_an_outage_is_told_once_in_a_while_ridden_through_when_short_and_given_up_when_long(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    watch = BrokerWatch("k:9092", timeout_seconds=60.0, clock=lambda: now[0])
    answers = [False]
    with caplog.at_level(logging.INFO, logger="streamtrain.serve.broker"):
        watch.check(lambda: pytest.fail("no probe while the broker is there"))
        watch.on_error(KafkaError(KafkaError._TRANSPORT))  # one connection lost: librdkafka reconnects unasked
        assert watch.down_since is None
        for _ in range(3):
            watch.on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN))
        for _ in range(45):  # 45 s away, probed every 2 s, still there
            now[0] += 1.0
            watch.check(lambda: answers[0])
        answers[0] = True
        now[0] += 2.0
        watch.check(lambda: answers[0])
        assert watch.down_since is None and watch.outages == 1
        said = [r.getMessage() for r in caplog.records if r.name == "streamtrain.serve.broker"]
        assert len(said) == 3, said  # unreachable; still unreachable after 30 s; answers again
        assert "exits after 60 s without it (serve.broker_timeout_seconds)" in said[0]
        assert said[-1] == "serve: Kafka at k:9092 answers again after 47 s away"

        watch.on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN))
        with pytest.raises(BrokerGone, match=r"no Kafka broker at k:9092 answered for 6\d s"):
            for _ in range(int(LOG_EVERY_S * 3)):
                now[0] += 1.0
                watch.check(lambda: False)


def test_a_watch_without_a_timeout_waits_for_good() -> None:
    now = [0.0]
    watch = BrokerWatch("k:9092", timeout_seconds=0.0, clock=lambda: now[0])
    watch.on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN))
    for _ in range(1000):
        now[0] += 10.0
        watch.check(lambda: False)
    assert watch.down_since == 0.0


def test_librdkafkas_connection_failures_are_dropped_only_while_quieted(caplog: pytest.LogCaptureFixture) -> None:
    rdkafka = logging.getLogger("librdkafka")
    with caplog.at_level(logging.INFO, logger="librdkafka"):
        quiet_connection_failures()
        try:
            rdkafka.error("%s [%s] %s", "FAIL", "rdkafka#consumer-2", "Connect to ipv4#127.0.0.1:1 failed")
            rdkafka.warning("%s [%s] %s", "GETPID", "rdkafka#producer-1", "Failed to acquire idempotence PID")
        finally:
            quiet_connection_failures(False)
        rdkafka.error("%s [%s] %s", "FAIL", "rdkafka#consumer-2", "Connect to ipv4#127.0.0.1:1 failed")
    assert [r.args[0] for r in caplog.records if r.name == "librdkafka"] == ["GETPID", "FAIL"]
