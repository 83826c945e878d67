"""Stream-rate models: per-device base rates, their change over time, and the pacer that keeps to them.

A device's target rate at time t is `base_i * factor_i(t)`: the base rate is drawn once per device
(constant, uniform, normal, a ScaDLES preset, or given explicitly) and the factor comes from a
schedule, periodic bursts and a replayed trace, multiplied together. All devices are paced by one
token bucket (`Pacer`) advanced from a single loop: no thread per device.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from streamtrain.config.producer import RateConfig

__all__ = ["Pacer", "RateProfile", "load_trace", "sample_base_rates"]

logger = logging.getLogger(__name__)

_SQRT3 = math.sqrt(3.0)


def sample_base_rates(cfg: RateConfig, devices: int, rng: np.random.Generator) -> np.ndarray:
    """Each device's base rate in samples/s.

    Uniform draws come from `[mean - sqrt(3) std, mean + sqrt(3) std]` (the uniform with that mean
    and std); normal draws from N(mean, std). Both are floored at `cfg.min_rate`, since a stream
    cannot run at a rate <= 0 (ScaDLES' S1 reaches below zero otherwise).

    Args:
        cfg: the rate settings.
        devices: number of devices.
        rng: source of randomness (seeded by the caller for reproducible runs).

    Returns:
        float64 array of shape (devices,); `inf` for kind "unlimited".
    """
    if cfg.rates is not None:
        if len(cfg.rates) != devices:
            raise ValueError(f"rate.rates has {len(cfg.rates)} rates for {devices} devices")
        return np.asarray(cfg.rates, dtype=np.float64)
    kind, mean, std = cfg.resolved()
    if kind == "unlimited":
        return np.full(devices, np.inf)
    if kind == "constant":
        rates = np.full(devices, mean, dtype=np.float64)
    elif kind == "uniform":
        half = _SQRT3 * std
        rates = rng.uniform(mean - half, mean + half, size=devices)
    else:
        rates = rng.normal(mean, std, size=devices)
    floored = rates < cfg.min_rate
    if floored.any():
        logger.info("%d of %d sampled base rates were below min_rate and run at %.3g samples/s",
                    int(floored.sum()), devices, cfg.min_rate)
    return np.maximum(rates, cfg.min_rate)


def load_trace(path: Path, step_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Read a rate trace: one factor per line (each lasting `step_s`), or `seconds,factor` lines.

    Blank lines and lines starting with '#' are ignored; a first line that is not numeric is taken as
    a header.

    Returns:
        (start times in seconds, factors), both float64, times strictly increasing from 0.

    Raises:
        ValueError: naming the file and line when the trace cannot be used.
    """
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"rate trace {path}: cannot read it ({exc})") from None
    times: list[float] = []
    factors: list[float] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        cells = [c.strip() for c in line.replace(";", ",").split(",")]
        try:
            values = [float(c) for c in cells]
        except ValueError:
            if not times:
                continue  # a header line
            raise ValueError(f"rate trace {path} line {number}: {line!r} is not numeric") from None
        if len(values) == 1:
            times.append(len(times) * step_s)
            factors.append(values[0])
        elif len(values) == 2:
            times.append(values[0])
            factors.append(values[1])
        else:
            raise ValueError(f"rate trace {path} line {number}: expected 'factor' or 'seconds,factor'")
        if factors[-1] < 0 or not math.isfinite(factors[-1]):
            raise ValueError(f"rate trace {path} line {number}: factor {factors[-1]} must be finite and >= 0")
    if not factors:
        raise ValueError(f"rate trace {path}: no rates in it")
    t = np.asarray(times)
    if t[0] != 0 or np.any(np.diff(t) <= 0):
        raise ValueError(f"rate trace {path}: times must start at 0 and strictly increase")
    return t, np.asarray(factors)


def _step_lookup(t: float, times: np.ndarray, values: np.ndarray, default: float) -> float:
    idx = int(np.searchsorted(times, t, side="right")) - 1
    return default if idx < 0 else float(values[idx])


class RateProfile:
    """Target rate of every device as a function of time since the start of the run.

    Args:
        cfg: the rate settings.
        base: each device's base rate (see `sample_base_rates`).
    """

    def __init__(self, cfg: RateConfig, base: np.ndarray) -> None:
        self.base = np.asarray(base, dtype=np.float64)
        self._sched_t = np.asarray([c.at_seconds for c in cfg.schedule], dtype=np.float64)
        self._sched_f = np.asarray([c.factor for c in cfg.schedule], dtype=np.float64)
        self._sched_period = cfg.schedule_period_seconds
        self._bursts = cfg.bursts
        self._trace: tuple[np.ndarray, np.ndarray, float] | None = None
        if cfg.trace is not None:
            times, factors = load_trace(cfg.trace, cfg.trace_step_seconds)
            # A trace loops after its last step has lasted as long as a step (or trace_step_seconds).
            last = float(np.diff(times)[-1]) if len(times) > 1 else cfg.trace_step_seconds
            self._trace = (times, factors, float(times[-1]) + last)
        n = len(self.base)
        self._phase: np.ndarray = np.zeros(n)
        if self._bursts is not None and self._bursts.stagger:
            self._phase = np.arange(n) * (self._bursts.every_seconds / n)

    @property
    def time_varying(self) -> bool:
        """Whether any device's rate changes over time."""
        return bool(len(self._sched_t)) or self._bursts is not None or self._trace is not None

    def factors(self, t: float) -> np.ndarray:
        """The multiplier of each device's base rate at `t` seconds."""
        common = 1.0
        if len(self._sched_t):
            ts = t % self._sched_period if self._sched_period else t
            common *= _step_lookup(ts, self._sched_t, self._sched_f, 1.0)
        if self._trace is not None:
            times, values, period = self._trace
            common *= _step_lookup(t % period, times, values, 1.0)
        out = np.full(len(self.base), common)
        if self._bursts is not None:
            b = self._bursts
            in_burst = ((t + self._phase) % b.every_seconds) < b.duration_seconds
            out = np.where(in_burst, out * b.factor, out)
        return out

    def rates(self, t: float) -> np.ndarray:
        """Each device's target rate in samples/s at `t` seconds."""
        return self.base * self.factors(t) if self.time_varying else self.base

    def expected_count(self, t0: float, t1: float, step: float = 0.01) -> np.ndarray:
        """Samples each device should publish in [t0, t1) (numerical integral of its rate)."""
        if not self.time_varying:
            return self.base * (t1 - t0)
        grid = np.arange(t0, t1, step)
        total = sum((self.rates(float(t)) * min(step, t1 - t) for t in grid), start=np.zeros(len(self.base)))
        return np.asarray(total)


class Pacer:
    """One token bucket per device, all advanced together from one loop.

    Each call to `due` adds `rate * dt` tokens per device and returns the whole tokens; the caller
    publishes that many samples. A device whose tokens pile up (the caller could not keep up) keeps
    at most `catch_up_seconds` seconds of them, so after a stall it bursts briefly instead of forever.

    Args:
        profile: target rates over time.
        catch_up_seconds: most seconds of stream a device may owe.
        unlimited_batch: samples per device per call when the rate is infinite.
    """

    def __init__(self, profile: RateProfile, catch_up_seconds: float = 1.0, unlimited_batch: int = 64) -> None:
        self.profile = profile
        self.catch_up_seconds = catch_up_seconds
        self.unlimited_batch = unlimited_batch
        n = len(profile.base)
        self.tokens: np.ndarray = np.zeros(n)
        self.given_up: np.ndarray = np.zeros(n)
        self._last: float | None = None

    def start(self, t: float = 0.0) -> None:
        """Begin pacing at run time `t` (seconds); every device starts with one token, so it publishes at once."""
        self._last = t
        self.tokens[:] = np.where(np.isfinite(self.profile.base), 1.0, 0.0)

    def due(self, t: float, active: np.ndarray | None = None) -> np.ndarray:
        """Whole samples each device should publish now (int64), and take them from the buckets.

        Args:
            t: run time in seconds (monotonic, from the same clock as `start`).
            active: boolean mask of devices still running; others get 0 and accumulate nothing.
        """
        if self._last is None:
            self.start(t)
        assert self._last is not None
        dt = max(0.0, t - self._last)
        self._last = t
        rates = self.profile.rates(t)
        finite = np.isfinite(rates)
        self.tokens += np.where(finite, rates, 0.0) * dt
        cap = np.maximum(np.where(finite, rates, 0.0) * self.catch_up_seconds, 1.0)
        over = np.maximum(self.tokens - cap, 0.0)
        if over.any():
            self.given_up += over
            self.tokens -= over
        if active is not None:
            self.tokens = np.where(active, self.tokens, 0.0)
        whole = np.floor(self.tokens)
        self.tokens -= whole
        out = whole.astype(np.int64)
        out[~finite] = self.unlimited_batch
        if active is not None:
            out[~active] = 0
        return out
