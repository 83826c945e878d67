"""Per-device performance models: compute seconds `T = a·size + b` for a batch of total `size`.

The online fit (CHRONICA's runtime prophet, LBB's online linear model) is a recency-weighted,
Huber-robust least-squares fit over a window of feedback, run for many devices at once on
(devices x window) arrays so the simulator can model thousands of devices. Until a device has
`min_observations` records its warm-start model is only rescaled to what it reported. When the
newest `change_points` records all miss the model by more than `change_threshold` in the same
direction the device has changed (a slow-down, a co-located job), not produced outliers: older
records are dropped and the model rescaled at once, so balance returns within a few steps.

The optional profiling fit (LBB Alg. 1) is a cubic in batch size with a size limit from the
largest batch that fitted in memory.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from streamtrain.config import CoordinatorConfig

__all__ = [
    "ModelBank",
    "PerfModel",
    "PerfTracker",
    "ProfileFit",
    "fit_linear_robust",
    "fit_profile",
    "size_limit_from_memory",
]

logger = logging.getLogger(__name__)

# Ridge strength pulling the slope towards the prior when a window's sizes barely vary (ett-stream
# keeps a device's batch size nearly constant, so the slope is otherwise ill-determined).
_RIDGE = 1e-3


@dataclass(frozen=True)
class PerfModel:
    """Compute seconds `a·size + b` for a batch of total size `size` on one device.

    Attributes:
        a: seconds per unit of sample size.
        b: fixed seconds per step (launch overhead, optimizer step).
        n_obs: feedback records behind the fit.
        fitted: True once fitted on feedback, False while warm-start (possibly rescaled).
        rel_error: smoothed relative prediction error |predicted - actual| / actual, None before any.
        largest: the largest batch total size among the observations behind the fit (None: none).
    """

    a: float
    b: float
    n_obs: int = 0
    fitted: bool = False
    rel_error: float | None = None
    largest: float | None = None

    @classmethod
    def warm(cls, config: CoordinatorConfig) -> PerfModel:
        return cls(a=config.warm_start_a, b=config.warm_start_b)

    def predict(self, total_size: Any) -> Any:
        """Predicted compute seconds for batches of these total sizes (scalar or array)."""
        return self.a * total_size + self.b

    def capacity(self, seconds: float) -> float:
        """Largest total size this device trains within `seconds` (0 when b alone exceeds it)."""
        if self.a <= 0:
            return float("inf")
        return max(0.0, (seconds - self.b) / self.a)


def fit_linear_robust(
    x: np.ndarray,
    y: np.ndarray,
    w: np.ndarray,
    prior_a: np.ndarray,
    huber_delta: float = 1.345,
    iterations: int = 10,
    start: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Fit `y = a·x + b` per row by weighted, Huber-reweighted least squares.

    Args:
        x: (D, W) batch total sizes.
        y: (D, W) compute seconds.
        w: (D, W) non-negative weights (0 for missing records).
        prior_a: (D,) slope the fit leans towards when a row's sizes hardly vary.
        huber_delta: residuals beyond this many robust standard deviations are down-weighted.
        iterations: reweighting rounds.
        start: (a, b) to weigh the first round's residuals against (the last fit), so a new outlier
            is down-weighted from the start; None starts from plain weighted least squares.

    Returns:
        (a, b), each (D,), with a >= 0 and b >= 0.
    """
    valid = w > 0
    weights = w.astype(np.float64)
    a = np.asarray(prior_a, dtype=np.float64).copy()
    b = np.zeros_like(a)
    if start is not None:
        weights = _huber_weights(x, y, w, valid, start[0], start[1], huber_delta)
    for it in range(iterations):
        if it == iterations - 1:
            # Last round trimmed: gross outliers (beyond 3 robust sd) get no say at all, removing
            # the bounded but non-zero pull Huber weights leave them.
            weights = np.where(weights >= w * huber_delta / 3.0, w, 0.0)
        sw = np.maximum(weights.sum(axis=1), 1e-300)
        mx = (weights * x).sum(axis=1) / sw
        my = (weights * y).sum(axis=1) / sw
        dx = x - mx[:, None]
        sxx = (weights * dx * dx).sum(axis=1)
        sxy = (weights * dx * (y - my[:, None])).sum(axis=1)
        lam = _RIDGE * sw * mx * mx + 1e-300
        a = (sxy + lam * prior_a) / (sxx + lam)
        b = my - a * mx
        # A negative intercept: the least-squares fit with b >= 0 lies on b = 0 (a line through the origin),
        # not at the unconstrained slope with b cut to 0 (which over-predicts every batch near the mean).
        # A slope <= 0 is noise (a larger batch never trains faster) and would mean unlimited capacity to a
        # planner: the time is put on size instead, through the origin, whose slope is > 0 when any y is.
        origin = (b < 0) | (a <= 0)
        if origin.any():
            a0 = ((weights * x * y).sum(axis=1) + lam * prior_a) / ((weights * x * x).sum(axis=1) + lam)
            a = np.where(origin, a0, a)
            b = np.where(origin, 0.0, b)
        a = np.maximum(a, 0.0)
        b = np.maximum(b, 0.0)
        if it < iterations - 1:
            weights = _huber_weights(x, y, w, valid, a, b, huber_delta)
    return a, b


def _huber_weights(
    x: np.ndarray, y: np.ndarray, w: np.ndarray, valid: np.ndarray, a: np.ndarray, b: np.ndarray, delta: float
) -> np.ndarray:
    resid = np.where(valid, y - (a[:, None] * x + b[:, None]), np.nan)
    scale = 1.4826 * _row_nanmedian(np.abs(resid))
    # A floor keeps a perfect fit (zero residuals) from marking every later point an outlier.
    floor = 1e-3 * np.abs(np.nan_to_num(_row_nanmedian(np.where(valid, y, np.nan)))) + 1e-12
    scale = np.maximum(np.nan_to_num(scale), floor)
    absr = np.nan_to_num(np.abs(resid))
    hub = np.minimum(1.0, delta * scale[:, None] / np.maximum(absr, 1e-300))
    return np.where(valid, w * hub, 0.0)


def _row_nanmedian(values: np.ndarray) -> np.ndarray:
    """Median of each row ignoring NaN; NaN for a row with none — `np.nanmedian(values, axis=1)` exactly.

    numpy's nanmedian takes a masked-array path on small rows that costs about a millisecond a call;
    the service refits after every feedback record, so this sorts once instead (NaN sorts last).
    """
    v = np.sort(np.asarray(values, dtype=np.float64), axis=1)
    if v.shape[1] == 0:
        return np.full(v.shape[0], np.nan)
    k = (~np.isnan(v)).sum(axis=1)
    rows = np.arange(v.shape[0])
    lo = v[rows, np.maximum((k - 1) // 2, 0)]
    hi = v[rows, np.minimum(k // 2, v.shape[1] - 1)]
    with np.errstate(all="ignore"):
        mid = np.where(k % 2 == 1, lo, (lo + hi) / 2.0)
    return np.where(k > 0, mid, np.nan)


@dataclass(frozen=True, eq=False)
class ModelBank:
    """Feedback windows and fitted models for many devices at once (rows), newest record last.

    Immutable: `update` returns a new bank. The simulator keeps one for the whole fleet; the live
    service can keep one per device (`PerfTracker`) or one for a fixed fleet.
    """

    x: np.ndarray
    y: np.ndarray
    step: np.ndarray
    valid: np.ndarray
    a: np.ndarray
    b: np.ndarray
    prior_a: np.ndarray
    prior_b: np.ndarray
    rel_error: np.ndarray
    n_updates: np.ndarray

    @classmethod
    def create(cls, devices: int, config: CoordinatorConfig) -> ModelBank:
        w = config.model_window
        a0 = np.full(devices, config.warm_start_a)
        b0 = np.full(devices, config.warm_start_b)
        return cls(
            x=np.zeros((devices, w)), y=np.zeros((devices, w)), step=np.zeros((devices, w)),
            valid=np.zeros((devices, w), dtype=bool), a=a0.copy(), b=b0.copy(), prior_a=a0, prior_b=b0,
            rel_error=np.full(devices, np.nan), n_updates=np.zeros(devices, dtype=np.int64),
        )

    def model(self, row: int) -> PerfModel:
        err = float(self.rel_error[row])
        valid = self.valid[row]
        n = int(valid.sum())
        return PerfModel(float(self.a[row]), float(self.b[row]), n_obs=n, fitted=bool(self.n_updates[row] > 0)
                         and n >= 1, rel_error=None if np.isnan(err) else err,
                         largest=float(self.x[row][valid].max()) if n else None)

    def predict(self, sizes: np.ndarray) -> np.ndarray:
        return self.a * sizes + self.b

    def update(
        self, sizes: np.ndarray, seconds: np.ndarray, observed: np.ndarray, step: int, config: CoordinatorConfig
    ) -> ModelBank:
        """Add one step's feedback (rows where `observed`) and refit every row.

        Args:
            sizes: (D,) batch total sizes trained.
            seconds: (D,) compute seconds they took.
            observed: (D,) which rows reported (a device that trained nothing reports nothing).
            step: the step the feedback belongs to (ages the older records).
            config: model settings.
        """
        obs = np.asarray(observed, dtype=bool) & (np.asarray(seconds) > 0)
        sizes = np.asarray(sizes, dtype=np.float64)
        seconds = np.asarray(seconds, dtype=np.float64)
        pred = self.a * sizes + self.b
        with np.errstate(all="ignore"):
            err = np.abs(pred - seconds) / seconds
        alpha = config.error_ewma_alpha
        rel = np.where(obs, np.where(np.isnan(self.rel_error), err, (1 - alpha) * self.rel_error + alpha * err),
                       self.rel_error)

        def push(arr: np.ndarray, new: np.ndarray) -> np.ndarray:
            shifted = np.concatenate([arr[:, 1:], new[:, None]], axis=1)
            return np.where(obs[:, None], shifted, arr)

        x = push(self.x, sizes)
        y = push(self.y, seconds)
        st = push(self.step, np.full(len(obs), float(step)))
        valid = push(self.valid, np.ones(len(obs), dtype=bool))
        a, b, refit_valid, pa, pb = _refit(x, y, step - st, valid, self.prior_a, self.prior_b, config,
                                            start=(self.a, self.b))
        keep = obs
        return replace(
            self, x=x, y=y, step=st, valid=np.where(keep[:, None], refit_valid, valid), rel_error=rel,
            a=np.where(keep, a, self.a), b=np.where(keep, b, self.b),
            prior_a=np.where(keep, pa, self.prior_a), prior_b=np.where(keep, pb, self.prior_b),
            n_updates=self.n_updates + keep,
        )


def _refit(
    x: np.ndarray, y: np.ndarray, age: np.ndarray, valid: np.ndarray,
    prior_a: np.ndarray, prior_b: np.ndarray, config: CoordinatorConfig,
    start: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    n = valid.sum(axis=1)
    w = np.where(valid, 0.5 ** (age / config.recency_halflife_steps), 0.0)
    fa, fb = fit_linear_robust(x, y, w, prior_a, config.huber_delta, start=start)
    # Few records: keep the prior's shape, scale it to what was seen (LBB's rough model).
    with np.errstate(all="ignore"):
        ratio = np.where(valid, y / (prior_a[:, None] * x + prior_b[:, None]), np.nan)
    f = np.nan_to_num(_row_nanmedian(ratio), nan=1.0)
    few = n < config.min_observations
    a = np.where(few, f * prior_a, fa)
    b = np.where(few, f * prior_b, fb)
    # One batch size cannot split fixed from per-size cost: keep at least `warm_fixed_fraction` of the time at the
    # sizes seen fixed, so a smaller batch is not predicted almost proportionally cheaper.
    phi = config.warm_fixed_fraction
    if phi > 0 and (few & (n > 0)).any():
        with np.errstate(all="ignore"):
            xm = _row_nanmedian(np.where(valid, x, np.nan))
            at = a * xm + b
            lift = few & (n > 0) & (xm > 0) & (at > 0) & (b < phi * at)
        a = np.where(lift, (1.0 - phi) * at / np.where(lift, xm, 1.0), a)
        b = np.where(lift, phi * at, b)
    # The rescaled warm start becomes the prior the later fit leans towards, not the raw default.
    seen = few & (n > 0)
    prior_a = np.where(seen, a, prior_a)
    prior_b = np.where(seen, b, prior_b)
    # Change detection on rows with a real fit: the newest k records all off in one direction.
    k = config.change_points
    newest_valid = valid[:, -k:].all(axis=1)
    with np.errstate(all="ignore"):
        rel = (y[:, -k:] - (a[:, None] * x[:, -k:] + b[:, None])) / (a[:, None] * x[:, -k:] + b[:, None])
    with np.errstate(all="ignore"):
        rel_all = np.where(valid, (y - (a[:, None] * x + b[:, None])) / (a[:, None] * x + b[:, None]), np.nan)
    # A noisy device needs larger misses before they count as a change rather than noise.
    thr = np.maximum(config.change_threshold, 3.0 * 1.4826 * np.nan_to_num(_row_nanmedian(np.abs(rel_all))))
    changed = ~few & newest_valid & (np.all(rel > thr[:, None], axis=1) | np.all(rel < -thr[:, None], axis=1))
    if changed.any():
        scale = _row_nanmedian(1.0 + rel)
        a = np.where(changed, a * scale, a)
        b = np.where(changed, b * scale, b)
        valid = valid.copy()
        valid[changed, : valid.shape[1] - k] = False
        prior_a = np.where(changed, a, prior_a)
        prior_b = np.where(changed, b, prior_b)
        logger.debug("model change detected on %d device(s); older feedback dropped", int(changed.sum()))
    return a, b, valid, prior_a, prior_b


@dataclass(frozen=True, eq=False)
class PerfTracker:
    """One device's feedback window and model; `update` returns a new tracker."""

    bank: ModelBank

    @classmethod
    def create(cls, config: CoordinatorConfig) -> PerfTracker:
        return cls(ModelBank.create(1, config))

    @property
    def model(self) -> PerfModel:
        return self.bank.model(0)

    def update(self, total_size: float, compute_seconds: float, step: int, config: CoordinatorConfig) -> PerfTracker:
        """Add a step's feedback (total size trained, compute seconds) and refit."""
        trained = total_size > 0 and compute_seconds > 0
        return PerfTracker(self.bank.update(np.array([total_size], dtype=np.float64),
                                            np.array([compute_seconds], dtype=np.float64),
                                            np.array([trained]), step, config))


@dataclass(frozen=True)
class ProfileFit:
    """LBB profiling result: cubic time model in batch size, its linear summary, and a size limit."""

    coefficients: tuple[float, ...]
    linear: PerfModel
    size_limit: float | None

    def predict(self, size: Any) -> Any:
        return np.polyval(np.asarray(self.coefficients), size)


def fit_profile(sizes: np.ndarray, seconds: np.ndarray, oom_size: float | None = None) -> ProfileFit:
    """Fit LBB's profiling phase: time vs batch size as a cubic (fewer points, lower degree).

    Args:
        sizes: profiled batch sizes (LBB uses powers of two).
        seconds: their compute seconds.
        oom_size: the first size that ran out of memory, if any; the limit is the largest profiled
            size below it (LBB Alg. 1: B_lim = bs/2 on the doubling grid).
    """
    xs = np.asarray(sizes, dtype=np.float64)
    ys = np.asarray(seconds, dtype=np.float64)
    if len(xs) < 2 or len(xs) != len(ys):
        raise ValueError("profiling needs at least two (size, seconds) points of equal count")
    coeffs = np.polyfit(xs, ys, deg=min(3, len(xs) - 1))
    a, b = np.polyfit(xs, ys, deg=1)
    linear = PerfModel(a=max(float(a), 0.0), b=max(float(b), 0.0), n_obs=len(xs), fitted=True)
    limit = None
    if oom_size is not None:
        below = xs[xs < oom_size]
        limit = float(below.max()) if len(below) else None
    return ProfileFit(tuple(float(c) for c in coeffs), linear, limit)


def size_limit_from_memory(
    sizes: np.ndarray, memory_bytes: np.ndarray, capacity_bytes: float, headroom: float = 0.95
) -> float:
    """Largest batch total size whose memory, fitted linearly on observations, stays under headroom·capacity."""
    xs = np.asarray(sizes, dtype=np.float64)
    ms = np.asarray(memory_bytes, dtype=np.float64)
    if len(xs) < 2 or np.ptp(xs) == 0:
        raise ValueError("a memory fit needs observations at two or more batch sizes")
    slope, intercept = np.polyfit(xs, ms, deg=1)
    if slope <= 0:
        return float("inf")
    return max(0.0, (headroom * capacity_bytes - intercept) / slope)
