"""Prometheus helpers every service shares: one naming scheme, one registry per service, one endpoint.

Names are `streamtrain_<service>_<name>` in base units; counters get `_total` from prometheus-client.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["MetricSet", "serve_metrics"]


class MetricSet:
    """Declares one service's metrics on one registry, all with the same label names.

    Args:
        registry: where to register (each service instance, and each test, has its own).
        service: the `<service>` part of every name (producer, coordinator, trainer).
        labels: label names every metric of this set carries (e.g. ("job", "device")).
    """

    def __init__(self, registry: CollectorRegistry, service: str, labels: Sequence[str] = ()) -> None:
        self.registry = registry
        self.prefix = f"streamtrain_{service}"
        self.labels = list(labels)

    def counter(self, name: str, doc: str) -> Counter:
        return Counter(f"{self.prefix}_{name}", doc, self.labels, registry=self.registry)

    def gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(f"{self.prefix}_{name}", doc, self.labels, registry=self.registry)

    def histogram(self, name: str, doc: str, buckets: Sequence[float]) -> Histogram:
        return Histogram(f"{self.prefix}_{name}", doc, self.labels, buckets=buckets, registry=self.registry)


def serve_metrics(registry: CollectorRegistry, bind_address: str, port: int) -> int:
    """Serve `registry` on http://bind_address:port/metrics in a daemon thread; returns the bound port (0: free)."""
    server, _thread = start_http_server(port, bind_address, registry=registry)
    return int(server.server_port)
