"""Every metric the services export follows Prometheus naming; MetricSet refuses the reserved suffixes."""

from __future__ import annotations

import re

import pytest
from metric_families import service_metric_families
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from streamtrain.metrics import RESERVED_SUFFIXES, MetricSet

#: Units a duration, a size in memory or a rate may not be given in (base units: seconds, bytes).
NOT_BASE_UNITS = re.compile(r"_(ms|milliseconds|microseconds|minutes|hours|kb|mb|gb|kib|mib|gib|percent)(_|$)")


FAMILIES = service_metric_families()


@pytest.mark.parametrize(("service", "family"), FAMILIES, ids=[f.name for _, f in FAMILIES])
def test_names_are_namespaced_in_base_units_with_total_only_on_counters(service: str, family: Metric) -> None:
    assert re.fullmatch(rf"streamtrain_{service}_[a-z][a-z0-9_]*[a-z0-9]", family.name), family.name
    assert not NOT_BASE_UNITS.search(family.name), family.name
    sample_names = {s.name for s in family.samples}
    if family.type == "counter":  # (a labelled counter has no sample until its first child)
        assert sample_names <= {f"{family.name}_total", f"{family.name}_created"}, sample_names
    else:
        assert not family.name.endswith(RESERVED_SUFFIXES), family.name
    if "seconds" in family.name:
        assert family.name.endswith(("_seconds", "_per_second", "_seconds_per_size")), family.name


def test_every_family_has_help_text() -> None:
    assert all(family.documentation.strip() for _, family in FAMILIES)


@pytest.mark.parametrize("name", ["batch_size_total", "x_count", "y_sum", "z_bucket"])
def test_metric_set_refuses_a_name_prometheus_would_misread(name: str) -> None:
    metrics = MetricSet(CollectorRegistry(), "trainer")
    with pytest.raises(ValueError, match="reserves"):
        metrics.gauge(name, "doc")
    with pytest.raises(ValueError, match="reserves"):
        metrics.counter(name, "doc")
