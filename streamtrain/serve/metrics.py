"""Prometheus metrics of `serve`, declared once (label `job`; `reason` on the counts of what was refused)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from streamtrain.metrics import MetricSet
from streamtrain.versions.freshness import ages_seconds
from streamtrain.wire import ProducedCount

__all__ = ["FRESHNESS_BUCKETS", "LATENCY_BUCKETS", "ServeMetrics"]

#: Request latency (produced to answered), seconds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Freshness (a sample produced to a version that trained it answering), seconds.
FRESHNESS_BUCKETS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 20.0, 60.0)


class ServeMetrics:
    """serve's metrics on one registry.

    Args:
        registry: Where to register (tests pass a fresh `CollectorRegistry()`).
        job: Value of the `job` label.
    """

    def __init__(self, registry: CollectorRegistry, job: str) -> None:
        self.registry = registry
        labels = {"job": job}
        metrics = MetricSet(registry, "serve", list(labels))
        self.version = metrics.gauge("model_version", "Number of the model version answering requests (0: none "
                                     "yet).").labels(**labels)
        self.version_step = metrics.gauge("model_step", "Training steps of the version answering requests.").labels(
            **labels)
        self.version_age = metrics.gauge("model_age_seconds", "Seconds since the version answering requests was "
                                         "written.").labels(**labels)
        self.requests = metrics.counter("requests", "Requests answered (a prediction delivered), errors "
                                        "included.").labels(**labels)
        self.errors = MetricSet(registry, "serve", [*labels, "reason"]).counter(
            "request_errors", "Requests answered with an error reason instead of an output, by reason.")
        self.latency = metrics.histogram("latency_seconds", "From a request's produced_at to its prediction being "
                                         "made.", LATENCY_BUCKETS).labels(**labels)
        self.batch_seconds = metrics.gauge("batch_seconds", "Forward time of the last batch of requests.").labels(
            **labels)
        self.switches = metrics.counter("version_switches", "Versions that passed the gate and took over.").labels(
            **labels)
        self.rejected = MetricSet(registry, "serve", [*labels, "reason"]).counter(
            "rejected_versions", "Announced versions serve did not take, by reason: gate (worse than the live one), "
            "misfit (model.json does not fit serve's settings), unreadable (a file missing or corrupt).")
        self.freshness = metrics.histogram("freshness_seconds", "Per trained sample: from its produced_at to the "
                                           "first answer by a version that trained it.", FRESHNESS_BUCKETS).labels(
            **labels)
        self._labels = labels

    def error(self, reason: str) -> None:
        self.errors.labels(**self._labels, reason=reason).inc()

    def reject(self, reason: str) -> None:
        self.rejected.labels(**self._labels, reason=reason).inc()

    def observe_freshness(self, counts: tuple[ProducedCount, ...], resolution_ms: int, answered_at_ms: int) -> None:
        """Observe each sample of `counts` (produced_at bins) as answered at `answered_at_ms`."""
        for age, n in ages_seconds(counts, resolution_ms, answered_at_ms):
            for _ in range(n):
                self.freshness.observe(age)
