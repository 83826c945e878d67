"""How `serve` lives through a broker that goes away: it waits, says so once in a while, and gives up after
`serve.broker_timeout_seconds`.

librdkafka reconnects on its own and logs every failed attempt (hundreds of lines in twenty seconds, from each of
serve's three clients). `BrokerWatch` takes the clients' error callbacks instead: the first "all brokers down"
starts the clock; from then on the loop probes the broker every few seconds (a metadata request), logs one line
every `LOG_EVERY_S` with how long it has been away, and raises `BrokerGone` once the timeout has passed, so serve
exits non-zero and whatever supervises it (compose's `restart: unless-stopped`, systemd, Kubernetes) restarts it,
the outage visible as a restart. Nothing is lost: a request's offset is committed only once its prediction is
delivered, and requests wait in Kafka. `quiet_connection_failures` drops librdkafka's own per-attempt lines in
this process (the watch says it once).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaError

__all__ = ["LOG_EVERY_S", "PROBE_EVERY_S", "BrokerGone", "BrokerWatch", "quiet_connection_failures"]

logger = logging.getLogger(__name__)

#: Seconds between two probes of an absent broker, and between two log lines about it.
PROBE_EVERY_S = 2.0
LOG_EVERY_S = 30.0

#: Errors that mean no broker can be reached (a single connection's loss is retried by librdkafka unasked).
BROKER_DOWN = frozenset({KafkaError._ALL_BROKERS_DOWN})

#: librdkafka's log facility of connection failures and disconnects.
_FAIL_FACILITY = "FAIL"


class BrokerGone(RuntimeError):
    """No broker answered for longer than `serve.broker_timeout_seconds`."""


class _ConnectionFailures(logging.Filter):
    """Drops librdkafka's per-attempt connection failure lines (the watch reports the outage itself)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.args and isinstance(record.args, tuple) and record.args[0] == _FAIL_FACILITY)


_QUIET = _ConnectionFailures()


def quiet_connection_failures(on: bool = True) -> None:
    """Drop (or, `on=False`, keep again) librdkafka's connection failure lines in this process."""
    rdkafka = logging.getLogger("librdkafka")
    if on:
        rdkafka.addFilter(_QUIET)
    else:
        rdkafka.removeFilter(_QUIET)


class BrokerWatch:
    """Whether Kafka is reachable, from the clients' errors and probes while it is not.

    Args:
        where: The bootstrap servers (for the log).
        timeout_seconds: Seconds without a broker before `check` raises `BrokerGone` (0: never).
        clock: time.monotonic (tests pass their own).
    """

    def __init__(self, where: str, timeout_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.where = where
        self.timeout_seconds = timeout_seconds
        self.clock = clock
        self.down_since: float | None = None
        self._probed = 0.0
        self._logged = 0.0
        self.outages = 0

    def on_error(self, err: KafkaError) -> None:
        """A client's error callback: "all brokers down" starts the clock (other errors are logged at debug)."""
        if err.code() in BROKER_DOWN:
            if self.down_since is None:
                now = self.clock()
                self.down_since, self._probed, self._logged = now, now, now
                self.outages += 1
                logger.warning("serve: Kafka at %s is unreachable (%s); requests wait in Kafka, serve waits for it "
                               "%s", self.where, err.str(), self._until())
        else:
            logger.debug("serve: Kafka client: %s", err.str())

    def _until(self) -> str:
        return (f"and exits after {self.timeout_seconds:g} s without it (serve.broker_timeout_seconds)"
                if self.timeout_seconds else "for as long as it takes (serve.broker_timeout_seconds=0)")

    def check(self, probe: Callable[[], bool]) -> None:
        """Between batches: while the broker is away, probe it every `PROBE_EVERY_S`, log every `LOG_EVERY_S`.

        Args:
            probe: Whether a broker answers now (a metadata request with a short timeout).

        Raises:
            BrokerGone: the broker has been away longer than the timeout.
        """
        if self.down_since is None:
            return
        now = self.clock()
        if now - self._probed < PROBE_EVERY_S:
            return
        self._probed = now
        away = now - self.down_since
        if probe():
            logger.info("serve: Kafka at %s answers again after %.0f s away", self.where, away)
            self.down_since = None
            return
        if self.timeout_seconds and away > self.timeout_seconds:
            raise BrokerGone(f"no Kafka broker at {self.where} answered for {away:.0f} s "
                             f"(serve.broker_timeout_seconds={self.timeout_seconds:g}); exiting so that serve is "
                             "restarted (requests wait in Kafka, none is lost)")
        if now - self._logged >= LOG_EVERY_S:
            self._logged = now
            logger.warning("serve: Kafka at %s still unreachable after %.0f s; waiting %s", self.where, away,
                           self._until())
