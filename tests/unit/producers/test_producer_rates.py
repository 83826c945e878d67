"""Rate models: per-device base rates, their change over time, and the pacer's accuracy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamtrain.config.producer import RATE_PRESETS, RateConfig
from streamtrain.producers.rates import Pacer, RateProfile, load_trace, sample_base_rates

N = 20_000


def rng() -> np.random.Generator:
    return np.random.default_rng(7)


def test_constant_rate_is_the_same_everywhere() -> None:
    rates = sample_base_rates(RateConfig(kind="constant", mean=250), 8, rng())
    assert rates.tolist() == [250.0] * 8


@pytest.mark.parametrize(("kind", "mean", "std"), [("uniform", 300.0, 112.0), ("normal", 256.0, 28.0)])
def test_sampled_rates_have_the_requested_mean_and_std(kind: str, mean: float, std: float) -> None:
    rates = sample_base_rates(RateConfig(kind=kind, mean=mean, std=std), N, rng())
    assert rates.mean() == pytest.approx(mean, rel=0.01)
    assert rates.std() == pytest.approx(std, rel=0.02)


def test_uniform_rates_span_the_uniform_with_that_std() -> None:
    rates = sample_base_rates(RateConfig(kind="uniform", mean=300, std=112), N, rng())
    half = np.sqrt(3) * 112
    assert rates.min() >= 300 - half and rates.max() <= 300 + half
    assert rates.min() < 300 - 0.95 * half and rates.max() > 300 + 0.95 * half


@pytest.mark.parametrize("preset", list(RATE_PRESETS))
def test_scadles_presets_set_distribution_mean_and_std(preset: str) -> None:
    kind, mean, std = RATE_PRESETS[preset]
    cfg = RateConfig(preset=preset)  # type: ignore[arg-type]
    assert cfg.resolved() == (kind, mean, std)
    rates = sample_base_rates(cfg, N, rng())
    assert rates.min() >= cfg.min_rate
    if preset != "S1":  # S1's uniform reaches below zero and is floored, which shifts its moments
        assert rates.mean() == pytest.approx(mean, rel=0.02)
        assert rates.std() == pytest.approx(std, rel=0.03)


def test_s1_is_floored_at_min_rate() -> None:
    rates = sample_base_rates(RateConfig(preset="S1", min_rate=1.0), N, rng())
    assert rates.min() == 1.0
    assert 0.02 < np.mean(rates == 1.0) < 0.08  # P(U(38 +- 41.6) < 1) is about 5%


def test_prime_aliases_are_accepted() -> None:
    assert RateConfig(preset="s2p").preset == "S2'"  # type: ignore[arg-type]


def test_explicit_rates_override_the_distribution() -> None:
    cfg = RateConfig(kind="normal", mean=10, std=3, rates=[5, 50, 500])
    assert sample_base_rates(cfg, 3, rng()).tolist() == [5.0, 50.0, 500.0]


def test_schedule_changes_the_factor_at_its_times() -> None:
    cfg = RateConfig.model_validate({"mean": 100, "schedule": [
        {"at_seconds": 0, "factor": 1}, {"at_seconds": 10, "factor": 3}, {"at_seconds": 20, "factor": 0}]})
    profile = RateProfile(cfg, np.array([100.0, 10.0]))
    assert profile.rates(5).tolist() == [100.0, 10.0]
    assert profile.rates(10).tolist() == [300.0, 30.0]
    assert profile.rates(25).tolist() == [0.0, 0.0]


def test_schedule_repeats_with_its_period() -> None:
    cfg = RateConfig.model_validate({"schedule": [{"at_seconds": 0, "factor": 1}, {"at_seconds": 5, "factor": 2}],
                                     "schedule_period_seconds": 10})
    profile = RateProfile(cfg, np.array([10.0]))
    assert [profile.rates(t)[0] for t in (1, 6, 11, 16)] == [10.0, 20.0, 10.0, 20.0]


def test_bursts_are_staggered_across_devices() -> None:
    cfg = RateConfig.model_validate({"bursts": {"every_seconds": 4, "duration_seconds": 1, "factor": 5}})
    profile = RateProfile(cfg, np.full(4, 10.0))
    # device d bursts when (t + d) mod 4 < 1: exactly one device at a time
    for t in np.arange(0.0, 8.0, 0.25):
        assert np.sum(profile.rates(float(t)) == 50.0) == 1
    expected = profile.expected_count(0, 40)
    assert expected == pytest.approx(np.full(4, 10 * 40 * (1 + 4 * 0.25)), rel=0.01)


def test_trace_is_replayed_and_looped(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("factor\n1\n2\n0.5\n")
    cfg = RateConfig(trace=trace, trace_step_seconds=2.0)
    profile = RateProfile(cfg, np.array([100.0]))
    assert [profile.rates(t)[0] for t in (0, 2.5, 5, 6.1)] == [100.0, 200.0, 50.0, 100.0]


def test_two_column_trace_with_times(tmp_path: Path) -> None:
    trace = tmp_path / "trace.txt"
    trace.write_text("# seconds, factor\n0, 1\n3, 4\n")
    times, factors = load_trace(trace, 1.0)
    assert times.tolist() == [0.0, 3.0] and factors.tolist() == [1.0, 4.0]


@pytest.mark.parametrize(("text", "fragment"), [("1\nabc\n", "line 2"), ("1\n-2\n", "line 2"), ("", "no rates"),
                                                ("0,1\n0,2\n", "strictly increase")])
def test_bad_trace_names_file_and_line(tmp_path: Path, text: str, fragment: str) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text(text)
    with pytest.raises(ValueError, match=fragment) as info:
        load_trace(trace, 1.0)
    assert str(trace) in str(info.value)


def test_pacer_keeps_the_rate_under_jittery_ticks() -> None:
    profile = RateProfile(RateConfig(), np.array([600.0, 37.5, 1.0]))
    pacer = Pacer(profile)
    jitter = np.random.default_rng(3).uniform(0.0005, 0.004, size=20_000)
    t, total = 0.0, np.zeros(3, dtype=np.int64)
    pacer.start(0.0)
    for dt in jitter:
        t += float(dt)
        total += pacer.due(t)
    # one token at the start, then exactly rate * t (up to the fraction still in the bucket)
    assert np.all(np.abs(total - (1 + np.array([600.0, 37.5, 1.0]) * t)) <= 1)


def test_pacer_gives_up_deficit_beyond_catch_up() -> None:
    pacer = Pacer(RateProfile(RateConfig(), np.array([100.0])), catch_up_seconds=0.5)
    pacer.start(0.0)
    burst = pacer.due(10.0)  # a 10 s stall
    assert burst[0] == 50
    assert pacer.given_up[0] == pytest.approx(10 * 100 + 1 - 50)


def test_pacer_skips_inactive_devices_and_feeds_unlimited_ones() -> None:
    pacer = Pacer(RateProfile(RateConfig(kind="unlimited"), np.array([np.inf, np.inf])), unlimited_batch=32)
    pacer.start(0.0)
    assert pacer.due(0.01, np.array([True, False])).tolist() == [32, 0]


def test_constant_with_std_is_refused() -> None:
    with pytest.raises(ValueError, match="std > 0 needs kind"):
        RateConfig(kind="constant", std=5)
