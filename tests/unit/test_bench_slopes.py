"""The slopes the soak judges growth by: a step is not a trend, a trend is."""

from __future__ import annotations

import pytest

from streamtrain.benchmarks.common import robust_slope, slope
from streamtrain.config import BrokerConfig


def test_a_single_step_is_not_growth_but_a_steady_rise_is() -> None:
    t = [float(i) for i in range(30)]
    step = [1000.0] * 24 + [1030.0] * 6  # one larger batch's memory mapped in, then flat
    assert slope(t, step) > 0.5  # least squares reads the step as a trend
    assert robust_slope(t, step) == pytest.approx(0.0)
    leak = [1000.0 + 2.0 * x for x in t]
    leak[10] += 50.0  # an outlier does not hide it either
    assert robust_slope(t, leak) == pytest.approx(2.0)
    assert robust_slope([0.0, 1.0], [1.0, 2.0]) is None


@pytest.mark.parametrize(("heap", "mb"), [("768m", 768.0), ("2g", 2048.0), ("1048576k", 1024.0), ("1G", 1024.0)])
def test_java_heap_sizes_in_mib(heap: str, mb: float) -> None:
    assert BrokerConfig(heap=heap).heap_mb == mb
