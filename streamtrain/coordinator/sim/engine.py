"""Step-synchronous simulation of a fleet running any policy through the service's own functions.

Each step: build a `PlanningState` from the simulated buffers and the fitted models, call
`plan_step` (truncation + policy), train what the plan says (compute time from the scenario's true
speeds, noise and disturbances), advance the clock by the slowest device plus the all-reduce, feed
the compute times back into the `ModelBank`, and let the streams deliver what arrived meanwhile.
A device with too little data trains what it has (no one waits for data before a step); when a plan
took every pending sample it saw, the ranks hold their reports until the plan's target as the live
trainers do (`streamtrain.pacing`, `Scenario.hold_max_seconds`), so the step's period is the target
and the next plan gets what arrived meanwhile.

With `coordinator.plan_ahead` = 1 (the live service's default) the plan for step s+1 is made as
step s begins, as the service makes it while step s runs: from the buffers less what plan s takes
and truncates (`after_plan`), the models fitted through step s-1, the last step's period and the
clock at s's start; step s's results correct the plan after it. Step 1 is planned from step 0's
results, as the live coordinator does: before any feedback there is nothing to predict from. A plan
made ahead that would train nothing (`Plan.worth_ahead`: the group drained what it could see, as at
line rate) is not used either: the step after is planned from this step's results.
The hold then counts as backlog what plan s saw and left, as a live rank does before plan s+1
reaches it (`trainer.backlog`).

Device cost model. A device's compute seconds for a batch are `(a / speed) · size + b`, times noise,
slow-downs and disturbances, where `size` is what the trainer actually computes on:

- a packing trainer (streamtrain's own; the default) computes on the samples as they are, so `size`
  is the batch's total sample size — the same linear model CHRONICA's runtime prophet fits;
- a padding trainer (`Scenario.padded`, for the policies named there) stacks the batch into one dense
  tensor, every sample zero-padded to the longest in the batch, so `size` = count x largest size.
  This is how the papers' baselines ran: CHRONICA §I notes that zero-padding samples to the longest
  makes a batch cost as if every sample were the longest, and its baselines (TensorFlow, BOA,
  EP4DDL) choose sample counts only. It is why their time per epoch grows with DIF (§III measures it
  growing linearly): the largest of k samples drifts up by about DIF x E[max of k standard normals]
  while the mean stays put, and a step then waits for the device that drew the largest sample
  (equal counts on devices of unequal speed wait for the slowest anyway).

The padded size is also what the device reports as trained, so its model is fitted on the compute it
really did. Nothing here is tuned towards a figure: the growth follows from the size distribution,
the batch size and the speeds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamtrain.config import CoordinatorConfig
from streamtrain.pacing import report_hold_seconds

from ..balance import dif, straggler_effect
from ..perfmodel import ModelBank
from ..policies import plan_step
from ..state import DeviceBatch, DeviceState, PendingIndex, Plan, PlanningState, after_plan
from .scenario import Scenario, draw_sizes

__all__ = ["SimResult", "simulate"]

logger = logging.getLogger(__name__)

SERIES = ("time", "step_seconds", "predicted_seconds", "straggler_effect", "global_batch", "batch_size_dif",
          "samples", "backlog", "lag_seconds", "truncated", "step_target", "disturbed")


@dataclass
class SimResult:
    """Per-step series (equal-length lists) and the run's summary."""

    policy: str
    series: dict[str, list[float]]
    summary: dict[str, Any]


class _Buffers:
    """Each device's pending samples: offsets, sizes, arrival times (oldest first)."""

    def __init__(self, n: int) -> None:
        self.offsets = [np.empty(0, np.int64) for _ in range(n)]
        self.sizes = [np.empty(0) for _ in range(n)]
        self.arrivals = [np.empty(0) for _ in range(n)]
        self.next_offset = np.zeros(n, dtype=np.int64)

    def add(self, i: int, sizes: np.ndarray, arrivals: np.ndarray) -> None:
        k = len(sizes)
        if k == 0:
            return
        start = self.next_offset[i]
        self.offsets[i] = np.concatenate([self.offsets[i], np.arange(start, start + k, dtype=np.int64)])
        self.sizes[i] = np.concatenate([self.sizes[i], sizes])
        self.arrivals[i] = np.concatenate([self.arrivals[i], np.sort(arrivals)])
        self.next_offset[i] += k

    def remove(self, i: int, offsets: np.ndarray | None, truncate_before: int | None) -> int:
        """Drop trained offsets and everything below truncate_before; returns the truncated count."""
        keep = np.ones(len(self.offsets[i]), dtype=bool)
        dropped = 0
        if truncate_before is not None:
            below = self.offsets[i] < truncate_before
            dropped = int(below.sum())
            keep &= ~below
        if offsets is not None and len(offsets):
            keep &= ~np.isin(self.offsets[i], offsets, assume_unique=True)
        self.offsets[i] = self.offsets[i][keep]
        self.sizes[i] = self.sizes[i][keep]
        self.arrivals[i] = self.arrivals[i][keep]
        return dropped


def simulate(  # noqa: C901, PLR0915  one simulated step in order (arrivals, plan, compute, feedback), as the live loop runs it
    scenario: Scenario,
    config: CoordinatorConfig,
    policy: str,
    progress: Callable[[float], None] | None = None,
) -> SimResult:
    """Run `policy` on `scenario`.

    Args:
        scenario: the fleet and workload.
        config: coordinator settings (global batch, bounds, truncation, model fitting).
        policy: policy name.
        progress: called after each step with the fraction of the run done (by steps or by duration).
    """
    rng = np.random.default_rng(scenario.seed)
    n = scenario.devices
    speed = scenario.per_device(scenario.speed)
    rate = scenario.per_device(scenario.rate)
    true_a = scenario.a / speed
    ids = [f"d{i:04d}" for i in range(n)]
    buffers = _Buffers(n)
    for i in range(n):
        buffers.add(i, draw_sizes(rng, scenario.initial, scenario.size_kind, scenario.size_mean, scenario.size_dif),
                     np.zeros(scenario.initial))
    bank = ModelBank.create(n, config)
    mean_size = np.full(n, scenario.size_mean)
    series: dict[str, list[float]] = {k: [] for k in SERIES}
    now, last_step, carry = 0.0, None, None
    last_samples = np.zeros(n, dtype=np.int64)
    last_size = np.zeros(n)
    last_seconds: list[float | None] = [None] * n
    trained_total, truncated_total, size_total = 0, 0, 0.0
    ahead: tuple[Plan, np.ndarray] | None = None  # the plan for this step, made a step ahead, and what it saw
    for step in range(scenario.steps):
        devices = tuple(
            DeviceState(
                device_id=ids[i], model=bank.model(i),
                pending=PendingIndex(buffers.offsets[i], buffers.sizes[i], buffers.arrivals[i]),
                arrival_rate=float(rate[i]), mean_size=float(mean_size[i]), lag=len(buffers.offsets[i]),
                end_offset=int(buffers.next_offset[i]), size_limit=scenario.size_limit,
                last_samples=int(last_samples[i]), last_size=float(last_size[i]), last_seconds=last_seconds[i],
            )
            for i in range(n)
        )
        state = PlanningState(step, now, devices, last_step, carry, step_overhead_seconds=scenario.comm_seconds)
        if ahead is None:  # the first step, or plans wait for the last step's results
            plan, seen = plan_step(state, config, policy), buffers.next_offset.copy()
            carry = plan.carry
        else:
            plan, seen = ahead
        ahead = None
        if config.plan_ahead and step > 0:
            # Made now, before this step's results: plan's samples taken, models through the step before. Not
            # at step 0, as the live coordinator: with no results at all, step 1 waits for step 0's.
            made = plan_step(after_plan(state, plan), config, policy)
            if made.worth_ahead:  # else this step's results plan the next, as the live coordinator does
                ahead, carry = (made, buffers.next_offset.copy()), made.carry
        counts = np.array([b.count for b in plan.devices], dtype=np.int64)
        sizes = np.array([b.total_size for b in plan.devices])
        size_total += float(sizes[counts > 0].sum())
        if policy in scenario.padded:
            sizes = _padded_sizes(buffers, plan.devices, sizes)
        truncated = sum(buffers.remove(i, b.offsets, b.truncate_before) for i, b in enumerate(plan.devices))
        disturbed = (step // scenario.disturb_period) % n if scenario.disturb_seconds > 0 else -1
        slow = np.ones(n)
        for s in scenario.slowdowns:
            if s.start <= step < s.end and 0 <= s.device < n:
                slow[s.device] *= s.factor
        noise = rng.lognormal(0.0, scenario.noise, n) if scenario.noise > 0 else np.ones(n)
        compute = (true_a * sizes + scenario.b) * slow * noise
        if disturbed >= 0:
            compute[disturbed] += scenario.disturb_seconds
        compute = np.where(counts > 0, compute, 0.0)
        step_seconds = float(compute.max()) + scenario.comm_seconds
        # What the plan saw and did not take, and what truncation dropped: the group's backlog.
        left = sum(int(np.searchsorted(o, seen[i])) for i, o in enumerate(buffers.offsets)) + truncated
        if counts.any() and not (scenario.is_epoch and left == 0):  # an epoch ends with its last sample
            step_seconds += report_hold_seconds(plan.step_time_target, step_seconds, left, scenario.hold_max_seconds)
        busy = counts > 0
        bank = bank.update(sizes, compute, busy, step, config)
        last_samples, last_size = counts, sizes
        last_seconds = [float(c) if c > 0 else None for c in compute]
        # Arrivals during the step, spread uniformly over it.
        arrivals = rng.poisson(rate * step_seconds)
        for dev in np.flatnonzero(arrivals):
            k = int(arrivals[dev])
            new_sizes = draw_sizes(rng, k, scenario.size_kind, scenario.size_mean, scenario.size_dif)
            buffers.add(int(dev), new_sizes, now + rng.uniform(0.0, step_seconds, k))
            mean_size[dev] = 0.95 * mean_size[dev] + 0.05 * float(new_sizes.mean())
        now += step_seconds
        last_step = step_seconds
        trained_total += int(counts.sum())
        truncated_total += truncated
        backlog = np.array([len(o) for o in buffers.offsets])
        oldest = [now - float(a[0]) for a in buffers.arrivals if len(a)]
        _record(series, now, step_seconds, plan.predicted_step_seconds, straggler_effect(compute[busy]),
                int(counts.sum()), dif(sizes), int(counts.sum()), int(backlog.sum()), max(oldest, default=0.0),
                truncated, plan.step_time_target, disturbed)
        if progress is not None:
            progress(max((step + 1) / scenario.steps, now / scenario.duration if scenario.duration else 0.0))
        if (scenario.is_epoch and backlog.sum() == 0) or (scenario.duration is not None and now >= scenario.duration):
            break
    summary = summarize(series, scenario, trained_total, truncated_total, bank, size_total)
    summary["samples_arrived"] = int(buffers.next_offset.sum())  # = trained + truncated + final backlog
    return SimResult(policy, series, summary)


def _padded_sizes(buffers: _Buffers, batches: tuple[DeviceBatch, ...], totals: np.ndarray) -> np.ndarray:
    """What a padding trainer computes on: each batch's count times its largest sample (before removal)."""
    out = totals.copy()
    for i, b in enumerate(batches):
        if b.offsets is not None and len(b.offsets):
            pos = np.searchsorted(buffers.offsets[i], b.offsets)
            out[i] = len(b.offsets) * float(buffers.sizes[i][pos].max())
    return out


def _record(series: dict[str, list[float]], *values: float) -> None:
    for key, value in zip(SERIES, values, strict=True):
        series[key].append(float(value))


def summarize(
    series: dict[str, list[float]], scenario: Scenario, trained: int, truncated: int, bank: ModelBank,
    size_trained: float = 0.0,
) -> dict[str, Any]:
    """Headline numbers of a run: medians, throughput, lag, truncation, disturbance recovery.

    In an epoch, `epoch_seconds_nominal` is the epoch time scaled to a dataset of the same samples at
    the scenario's mean size (`epoch_seconds · size_mean · samples / size trained`): sizes clipped at 1
    raise the mean at a large DIF (45 → ~54 at DIF 64), and this takes that extra data out of the
    comparison across DIFs.
    """
    t = np.asarray(series["step_seconds"])
    se = np.asarray(series["straggler_effect"])
    elapsed = float(series["time"][-1]) if series["time"] else 0.0
    out: dict[str, Any] = {
        "steps": len(t),
        "elapsed_seconds": elapsed,
        "median_step_seconds": float(np.median(t)) if len(t) else 0.0,
        "median_straggler_effect": float(np.median(se)) if len(se) else 0.0,
        "p90_straggler_effect": float(np.percentile(se, 90)) if len(se) else 0.0,
        "samples_per_second": trained / elapsed if elapsed > 0 else 0.0,
        "samples_trained": trained,
        "size_trained": size_trained,
        "samples_truncated": truncated,
        "final_backlog": int(series["backlog"][-1]) if series["backlog"] else 0,
        "max_lag_seconds": float(max(series["lag_seconds"], default=0.0)),
        "median_batch_size_dif": float(np.median(series["batch_size_dif"])) if len(t) else 0.0,
        "median_prediction_error": float(np.nanmedian(bank.rel_error)) if np.isfinite(bank.rel_error).any() else None,
    }
    if scenario.is_epoch:
        out["epoch_seconds"] = elapsed
        nominal = scenario.size_mean * trained / size_trained if size_trained else 1.0
        out["epoch_seconds_nominal"] = elapsed * nominal
    if scenario.disturb_seconds > 0:
        out["disturbance_recovery_steps"] = recovery_steps(se, scenario.disturb_period, threshold=0.1)
    return out


def recovery_steps(se: np.ndarray, period: int, threshold: float = 0.1) -> dict[str, float | None]:
    """Steps after each disturbance move until SE first drops under `threshold` (max and median)."""
    waits: list[int] = []
    for start in range(period, len(se), period):
        window = se[start : start + period]
        below = np.flatnonzero(window < threshold)
        waits.append(int(below[0]) if len(below) else period)
    if not waits:
        return {"max": None, "median": None, "events": 0}
    return {"max": float(max(waits)), "median": float(np.median(waits)), "events": len(waits)}
