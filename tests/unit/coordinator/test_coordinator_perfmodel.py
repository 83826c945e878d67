"""Performance models: robust fit, warm start, change detection, profiling and memory limits."""

from __future__ import annotations

import numpy as np
import pytest

from streamtrain.config import CoordinatorConfig
from streamtrain.coordinator.perfmodel import (
    ModelBank,
    PerfTracker,
    fit_linear_robust,
    fit_profile,
    size_limit_from_memory,
)

CFG = CoordinatorConfig()


def test_robust_fit_recovers_a_b_despite_outliers() -> None:
    rng = np.random.default_rng(1)
    x = rng.uniform(100, 2000, (3, 200))
    y = 0.002 * x + 0.1
    y *= rng.lognormal(0, 0.02, y.shape)
    outliers = rng.random(y.shape) < 0.1
    y = np.where(outliers, y * 3.0, y)
    a, b = fit_linear_robust(x, y, np.ones_like(x), prior_a=np.full(3, 1e-3))
    np.testing.assert_allclose(a, 0.002, rtol=0.03)
    np.testing.assert_allclose(b, 0.1, rtol=0.15)
    # Plain least squares is dragged far off by the same outliers: the robustness is doing work.
    a_ls = np.polyfit(x[0], y[0], 1)[0]
    assert abs(a_ls - 0.002) / 0.002 > 0.1


def test_tracker_scales_warm_start_then_fits() -> None:
    tracker = PerfTracker.create(CFG)
    assert tracker.model.a == CFG.warm_start_a and not tracker.model.fitted
    rng = np.random.default_rng(2)
    tracker = tracker.update(1000.0, 0.5 * (CFG.warm_start_a * 1000 + CFG.warm_start_b), 0, CFG)
    # One record: the warm start scaled to what the device reported, with at least warm_fixed_fraction of that
    # time fixed (one batch size cannot tell the two apart; the warm start's own split is 5% fixed here).
    seen = 0.5 * (CFG.warm_start_a * 1000 + CFG.warm_start_b)
    assert tracker.model.predict(1000.0) == pytest.approx(seen)
    assert tracker.model.b == pytest.approx(CFG.warm_fixed_fraction * seen)
    proportional = CFG.model_copy(update={"warm_fixed_fraction": 0.0})
    own = PerfTracker.create(proportional).update(1000.0, seen, 0, proportional)
    assert own.model.a == pytest.approx(0.5 * CFG.warm_start_a)  # 0: the warm start's shape, only scaled
    for step in range(1, 40):
        size = float(rng.uniform(200, 3000))
        tracker = tracker.update(size, 3e-4 * size + 0.03, step, CFG)
    assert tracker.model.a == pytest.approx(3e-4, rel=0.02)
    assert tracker.model.b == pytest.approx(0.03, rel=0.1)
    assert tracker.model.rel_error is not None and tracker.model.rel_error < 0.2


def test_level_shift_is_a_change_not_an_outlier() -> None:
    bank = ModelBank.create(2, CFG)
    rng = np.random.default_rng(3)
    for step in range(30):
        sizes = rng.uniform(800, 1200, 2)
        bank = bank.update(sizes, 4e-4 * sizes + 0.05, np.ones(2, bool), step, CFG)
    # Device 0 slows down by 40% for good; device 1 has one wild outlier.
    for step in range(30, 33):
        sizes = rng.uniform(800, 1200, 2)
        secs = 4e-4 * sizes + 0.05
        secs[0] *= 1.4
        if step == 30:
            secs[1] *= 5.0
        bank = bank.update(sizes, secs, np.ones(2, bool), step, CFG)
    pred = bank.predict(np.array([1000.0, 1000.0]))
    assert pred[0] == pytest.approx(1.4 * 0.45, rel=0.05)
    assert pred[1] == pytest.approx(0.45, rel=0.05)


def test_profile_fit_is_cubic_with_oom_limit() -> None:
    sizes = np.array([4, 8, 16, 32, 64, 128, 256], dtype=float)
    secs = 1e-7 * sizes**3 + 1e-4 * sizes**2 + 0.01 * sizes + 0.2
    fit = fit_profile(sizes, secs, oom_size=512)
    np.testing.assert_allclose(fit.coefficients, [1e-7, 1e-4, 0.01, 0.2], rtol=1e-4, atol=1e-9)
    assert fit.size_limit == 256
    assert fit.predict(100.0) == pytest.approx(1e-7 * 1e6 + 1.0 + 1.0 + 0.2)


def test_size_limit_from_memory_respects_headroom() -> None:
    sizes = np.array([100.0, 200.0, 400.0])
    mem = 1e9 + 1e6 * sizes
    limit = size_limit_from_memory(sizes, mem, capacity_bytes=2e9, headroom=0.95)
    assert limit == pytest.approx((0.95 * 2e9 - 1e9) / 1e6)


@pytest.mark.parametrize("factor", [0.0, 0.001, 20.0, 1_000.0, 1e6])
@pytest.mark.parametrize("spread", [0.02, 0.5])  # batch sizes nearly constant (ett-stream at line rate) or varied
def test_one_wild_report_moves_the_prediction_by_less_than_two_percent(factor: float, spread: float) -> None:
    """One report of a compute time `factor` x the truth (that passed the feedback checks: finite, positive,
    within a step) must not steer the model: neither when it arrives nor in the steps after it."""
    rng = np.random.default_rng(7)
    tracker = PerfTracker.create(CFG)
    step = 0
    for step in range(40):
        size = 1000.0 * (1.0 + spread * rng.uniform(-1, 1))
        tracker = tracker.update(size, (3e-4 * size + 0.03) * rng.lognormal(0, 0.03), step, CFG)
    before = tracker.model.predict(1000.0)
    tracker = tracker.update(1000.0, max((3e-4 * 1000 + 0.03) * factor, 1e-9), step + 1, CFG)
    assert abs(tracker.model.predict(1000.0) - before) / before < 0.02
    if factor >= 20:  # least squares over the same window would follow the wild point: the fit's robustness works
        keep = tracker.bank.valid[0]
        a_ls, b_ls = np.polyfit(tracker.bank.x[0][keep], tracker.bank.y[0][keep], 1)
        assert abs(a_ls * 1000.0 + b_ls - before) / before > 0.2
    for later in range(step + 2, step + 6):  # and it does not come back to steer later fits
        size = 1000.0 * (1.0 + spread * rng.uniform(-1, 1))
        tracker = tracker.update(size, (3e-4 * size + 0.03) * rng.lognormal(0, 0.03), later, CFG)
        assert abs(tracker.model.predict(1000.0) - before) / before < 0.02
