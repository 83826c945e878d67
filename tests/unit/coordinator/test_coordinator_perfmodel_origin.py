"""The robust fit's boundary cases: a negative intercept or a slope <= 0 fall back to a line through the origin."""

from __future__ import annotations

import numpy as np

from streamtrain.config import CoordinatorConfig
from streamtrain.coordinator.perfmodel import PerfTracker, fit_linear_robust


def _fit(x: list[float], y: list[float]) -> tuple[float, float]:
    xs, ys = np.array([x]), np.array([y])
    a, b = fit_linear_robust(xs, ys, np.ones_like(xs), np.array([1e-3]), iterations=1)
    return float(a[0]), float(b[0])


def test_negative_intercept_gives_the_least_squares_line_through_the_origin() -> None:
    x, y = [100.0, 200.0, 300.0], [0.05, 0.25, 0.45]  # unconstrained: y = 0.002 x - 0.15
    a, b = _fit(x, y)
    assert b == 0.0
    expected = np.dot(x, y) / np.dot(x, x)
    assert abs(a - expected) < 1e-3 * expected  # not 0.002 with b cut to 0, which over-predicts every point
    assert abs(a * 200 - 0.25) < abs(0.002 * 200 - 0.25)


def test_negative_slope_never_means_unlimited_capacity() -> None:
    # A slow first step at a tiny batch, then a quick one at a larger batch (warm-up noise): slope < 0.
    a, b = _fit([44.0, 650.0], [0.294, 0.058])
    assert a > 0 and b == 0.0
    model = PerfTracker.create(CoordinatorConfig(min_observations=2))
    for step, (size, seconds) in enumerate([(98.0, 0.012), (44.0, 0.294), (650.0, 0.058)]):
        model = model.update(size, seconds, step, CoordinatorConfig(min_observations=2))
    capacity = model.model.capacity(0.4)
    assert np.isfinite(capacity) and capacity < 1e5
