"""Prometheus metrics of the producers, declared once (labels: `device`)."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["ProducerMetrics"]

_NS = "streamtrain_producer"


class ProducerMetrics:
    """The producers' metrics on one registry, with a child per device created up front.

    Args:
        registry: where to register (tests pass a fresh `CollectorRegistry()`).
        devices: device ids, the values of the `device` label.
    """

    def __init__(self, registry: CollectorRegistry, devices: Sequence[str]) -> None:
        self.registry = registry
        def device_counter(name: str, doc: str) -> Counter:
            return Counter(f"{_NS}_{name}", doc, ["device"], registry=registry)

        def device_gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"{_NS}_{name}", doc, ["device"], registry=registry)

        self.sent = device_counter("samples_sent", "Samples acknowledged by the broker (acks=all).")
        self.failed = device_counter("samples_failed", "Samples whose delivery failed for good (each one reported).")
        self.injected = device_counter("samples_injected", "Samples received from other devices by data injection.")
        self.bytes_sent = device_counter("sent_bytes", "Record value bytes acknowledged by the broker.")
        self.size_sent = device_counter("sample_size_sent", "Sum of acknowledged samples' sizes.")
        self.target_rate = device_gauge("target_rate_samples_per_second", "Rate the device is paced at now.")
        self.achieved_rate = device_gauge("achieved_rate_samples_per_second",
                                          "Acknowledged own samples per second over the last 5 s.")
        self.backpressure = Counter(f"{_NS}_backpressure_waits",
                                    "Times the local queue was full and publishing waited for deliveries.",
                                    registry=registry)
        self.queued = Gauge(f"{_NS}_queued_records", "Records waiting in the local queue for the broker.",
                            registry=registry)
        self.broker_up = Gauge(f"{_NS}_broker_up", "1 while the broker is reachable, 0 while it is reported down.",
                               registry=registry)
        self.skipped_files = Gauge(f"{_NS}_dataset_files_skipped", "Dataset files skipped as unusable.",
                                   registry=registry)
        self.broker_up.set(1)
        for d in devices:
            for metric in (self.sent, self.failed, self.injected, self.bytes_sent, self.size_sent,
                           self.target_rate, self.achieved_rate):
                metric.labels(device=d)
