"""Prometheus helpers every service shares: one naming scheme, one registry per service, one endpoint.

Names are `streamtrain_<service>_<name>_<unit>` in base units (seconds, bytes; samples, records, ... for
counts; `_ratio` for dimensionless ratios); counters get `_total` from prometheus-client, and no other
metric may end in it (or in the `_count` / `_sum` / `_bucket` suffixes of histograms).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["RESERVED_SUFFIXES", "MetricSet", "serve_metrics"]

#: Suffixes Prometheus gives counters and histograms; a name of our own ending in one would be misread.
RESERVED_SUFFIXES = ("_total", "_count", "_sum", "_bucket", "_created")


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
        """A counter `streamtrain_<service>_<name>_total` (`name` without `_total`: the client adds it)."""
        return Counter(self._name(name), doc, self.labels, registry=self.registry)

    def gauge(self, name: str, doc: str) -> Gauge:
        """A gauge `streamtrain_<service>_<name>`."""
        return Gauge(self._name(name), doc, self.labels, registry=self.registry)

    def histogram(self, name: str, doc: str, buckets: Sequence[float]) -> Histogram:
        """A histogram `streamtrain_<service>_<name>` (with `_bucket`, `_sum`, `_count` series)."""
        return Histogram(self._name(name), doc, self.labels, buckets=buckets, registry=self.registry)

    def _name(self, name: str) -> str:
        if name.endswith(RESERVED_SUFFIXES):
            raise ValueError(f"metric name {name!r} ends in a suffix Prometheus reserves: "
                             f"{', '.join(RESERVED_SUFFIXES)}")
        return f"{self.prefix}_{name}"


def serve_metrics(registry: CollectorRegistry, bind_address: str, port: int) -> int:
    """Serve `registry` on http://bind_address:port/metrics in a daemon thread; returns the bound port (0: free)."""
    server, _thread = start_http_server(port, bind_address, registry=registry)
    return int(server.server_port)
