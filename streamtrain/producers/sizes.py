"""Sample-size models: fixed, normal with a given mean and DIF, lognormal, or replayed sizes.

Sizes are integers >= `min_size`. A normal with a large DIF relative to its mean would put mass
below the floor; clipping it there would bias both the mean and the DIF, so the normal model is a
truncated normal whose underlying parameters are solved to give exactly the requested mean and DIF.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from streamtrain.config.producer import SizeConfig

__all__ = ["SizeSampler", "TruncatedNormal", "make_size_sampler", "solve_truncated_normal"]

#: Draws `n` sizes (int64) with the given generator.
SizeSampler = Callable[[np.random.Generator, int], np.ndarray]

# Rounding a continuous draw to an integer adds the variance of a uniform on a unit interval.
_ROUNDING_VAR = 1.0 / 12.0
# Rejection sampling below this acceptance rate would be slow; such a DIF is reported as unreachable.
_MAX_ALPHA = 2.5


def _phi(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _sf(x: float) -> float:
    return 0.5 * math.erfc(x / math.sqrt(2.0))


def _moments_ratio(alpha: float) -> tuple[float, float]:
    """For a standard normal truncated below at alpha: (mean - alpha, std)."""
    lam = _phi(alpha) / _sf(alpha)
    var = 1.0 + alpha * lam - lam * lam
    return lam - alpha, math.sqrt(max(var, 1e-300))


@dataclass(frozen=True)
class TruncatedNormal:
    """A normal N(mu, sigma) truncated below at `low`."""

    mu: float
    sigma: float
    low: float

    @property
    def acceptance(self) -> float:
        """Probability that an untruncated draw lands above `low`."""
        return _sf((self.low - self.mu) / self.sigma)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` float draws (rejection sampling, vectorised)."""
        out = np.empty(0)
        while len(out) < n:
            want = int((n - len(out)) / self.acceptance * 1.2) + 16
            draw = rng.normal(self.mu, self.sigma, size=want)
            out = np.concatenate([out, draw[draw >= self.low]])
        return out[:n]


def solve_truncated_normal(mean: float, std: float, low: float) -> TruncatedNormal:
    """The normal which, truncated below at `low`, has exactly `mean` and `std`.

    Raises:
        ValueError: when no such normal exists with a usable acceptance rate: a normal truncated at
            `low` has std < mean - low; near that limit almost every draw would be rejected.
    """
    if mean <= low:
        raise ValueError(f"mean {mean} must be above the floor {low}")
    target = (mean - low) / std  # (mean - low) / std for the standardised truncated normal
    lo, hi = -40.0, _MAX_ALPHA
    r_lo, _ = _ratio(lo)
    r_hi, _ = _ratio(hi)
    if target < r_hi:
        limit = (mean - low) / r_hi
        raise ValueError(
            f"dif {std:g} is out of reach of a normal with mean {mean:g} that never goes below "
            f"{low + 0.5:g} (at most about {limit:.3g}); use kind 'lognormal', which reaches any dif"
        )
    if target >= r_lo:
        return TruncatedNormal(mu=mean, sigma=std, low=low)  # truncation is negligible
    for _ in range(200):  # the ratio falls monotonically in alpha: bisect
        mid = 0.5 * (lo + hi)
        if _ratio(mid)[0] > target:
            lo = mid
        else:
            hi = mid
    alpha = 0.5 * (lo + hi)
    _mean_off, std_unit = _moments_ratio(alpha)
    sigma = std / std_unit
    return TruncatedNormal(mu=low - alpha * sigma, sigma=sigma, low=low)


def _ratio(alpha: float) -> tuple[float, float]:
    mean_off, std_unit = _moments_ratio(alpha)
    return mean_off / std_unit, std_unit


def _round_half_up(x: np.ndarray) -> np.ndarray:
    return np.floor(x + 0.5).astype(np.int64)


def make_size_sampler(cfg: SizeConfig, replay_sizes: np.ndarray | None = None) -> SizeSampler:
    """A function drawing sizes as `cfg` describes.

    Args:
        cfg: the size settings.
        replay_sizes: for kind "replay", the sizes to draw from (see `streamtrain.datasets.load_sizes`).

    Raises:
        ValueError: when the parameters cannot be met (naming the setting).
    """
    lo, hi = cfg.min_size, cfg.max_size
    if cfg.kind == "fixed":
        value = min(max(round(cfg.mean), lo), hi)
        return lambda _rng, n: np.full(n, value, dtype=np.int64)
    if cfg.kind == "replay":
        if replay_sizes is None or len(replay_sizes) == 0:
            raise ValueError("size.path holds no sizes to replay")
        pool = np.clip(np.asarray(replay_sizes, dtype=np.int64), lo, hi)
        return lambda rng, n: pool[rng.integers(0, len(pool), size=n)]
    if cfg.dif == 0:
        value = round(cfg.mean)
        return lambda _rng, n: np.full(n, value, dtype=np.int64)
    # Continuous draws are rounded half up, so the floor of the continuous law is min_size - 0.5.
    low = lo - 0.5
    std = math.sqrt(max(cfg.dif**2 - _ROUNDING_VAR, 1e-12))
    if cfg.kind == "normal":
        try:
            law = solve_truncated_normal(cfg.mean, std, low)
        except ValueError as exc:
            raise ValueError(f"size.dif: {exc}") from None
        return lambda rng, n: np.minimum(_round_half_up(law.sample(rng, n)), hi)
    # Shifted lognormal: low + LN(m, s) with E = mean - low and Std = dif.
    shift_mean = cfg.mean - low
    s2 = math.log1p((std / shift_mean) ** 2)
    m = math.log(shift_mean) - s2 / 2.0
    s = math.sqrt(s2)
    return lambda rng, n: np.clip(_round_half_up(low + rng.lognormal(m, s, size=n)), lo, hi)
