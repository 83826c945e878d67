"""Prometheus metrics of the bridge, declared once (labels: `job`, and the source `topic` or target `device`).

Records are counted when their transaction commits, not when they are read: a transaction that aborts is
read again, and counting it twice would say more was bridged than the device topics hold. So, over committed
transactions, records in = samples out + rejected + skipped.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from streamtrain.metrics import MetricSet

__all__ = ["BridgeMetrics"]

_TRANSACTION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class BridgeMetrics:
    """The bridge's metrics on one registry, with a child per source topic and per device created up front.

    Args:
        registry: where to register (each bridge passes a fresh `CollectorRegistry()`).
        job: the value of every metric's `job` label.
        topics: the source topics.
        devices: the devices whose topics the bridge writes.
    """

    def __init__(self, registry: CollectorRegistry, job: str, topics: Sequence[str], devices: Sequence[str]) -> None:
        self.registry = registry
        self.job = job
        fleet = MetricSet(registry, "bridge", ("job",))
        source = MetricSet(registry, "bridge", ("job", "topic"))
        device = MetricSet(registry, "bridge", ("job", "device"))
        reasons = MetricSet(registry, "bridge", ("job", "topic", "reason"))
        partitions = MetricSet(registry, "bridge", ("job", "topic", "partition"))
        outcomes = MetricSet(registry, "bridge", ("job", "outcome"))
        self.records_in = source.counter("records_in", "Source records whose transaction committed.")
        self.samples_out = device.counter("samples_out", "Samples written to the device topic, committed.")
        self.rejected = reasons.counter("records_rejected", "Source records dead-lettered (committed), by the "
                                        "decoder's or the check's reason.")
        self.skipped = source.counter("records_skipped", "Source records the decoder skipped on purpose (returned "
                                      "None), committed.")
        self.source_lag = partitions.gauge("source_lag_records", "Records of a source partition not bridged yet: its "
                                           "end (last stable offset) minus the bridge's position.")
        self.transaction_seconds = fleet.histogram("transaction_seconds", "From a transaction's first record to its "
                                                   "commit (or abort).", _TRANSACTION_BUCKETS)
        self.transactions = outcomes.counter("transactions", "Transactions ended, by outcome (committed, aborted).")
        self.transaction_records = fleet.gauge("transaction_records", "Source records in the last committed "
                                               "transaction.")
        for topic in topics:
            self.records_in.labels(job, topic)
            self.skipped.labels(job, topic)
        for name in devices:
            self.samples_out.labels(job, name)
        for outcome in ("committed", "aborted"):
            self.transactions.labels(job, outcome)
