"""Prometheus metrics of the producers, declared once (labels: `device`)."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from streamtrain.metrics import MetricSet

__all__ = ["ProducerMetrics"]


class ProducerMetrics:
    """The producers' metrics on one registry, with a child per device created up front.

    Args:
        registry: where to register (tests pass a fresh `CollectorRegistry()`).
        devices: device ids, the values of the `device` label.
    """

    def __init__(self, registry: CollectorRegistry, devices: Sequence[str]) -> None:
        self.registry = registry
        device = MetricSet(registry, "producer", ("device",))
        process = MetricSet(registry, "producer")
        self.sent = device.counter("samples_sent", "Samples acknowledged by the broker (acks=all).")
        self.failed = device.counter("samples_failed", "Samples whose delivery failed for good (each one reported).")
        self.injected = device.counter("samples_injected", "Samples received from other devices by data injection.")
        self.bytes_sent = device.counter("sent_bytes", "Record value bytes acknowledged by the broker.")
        self.size_sent = device.counter("sample_size_sent", "Sum of acknowledged samples' sizes.")
        self.target_rate = device.gauge("target_rate_samples_per_second", "Rate the device is paced at now.")
        self.achieved_rate = device.gauge("achieved_rate_samples_per_second",
                                          "Acknowledged own samples per second over the last 5 s.")
        self.backpressure = process.counter("backpressure_waits",
                                            "Times the local queue was full and publishing waited for deliveries.")
        self.queued = process.gauge("queued_records", "Records waiting in the local queue for the broker.")
        self.broker_up = process.gauge("broker_up", "1 while the broker is reachable, 0 while it is reported down.")
        self.skipped_files = process.gauge("dataset_skipped_files", "Dataset files skipped as unusable.")
        self.broker_up.set(1)
        for d in devices:
            for metric in (self.sent, self.failed, self.injected, self.bytes_sent, self.size_sent,
                           self.target_rate, self.achieved_rate):
                metric.labels(device=d)
