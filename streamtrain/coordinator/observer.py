"""What the coordinator tells about its plans and its devices: the Prometheus metrics and the status figures.

`Coordinator` plans and publishes; every figure it exposes is written here, from what it planned (`PlanObserver.
published`), what a device reported (`feedback`) and what Kafka says of a device topic (`offsets`). The
`/status` page reads the same object for its plan-latency medians and its last plan (`coordinator.status`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamtrain.periods import split_wall_period
from streamtrain.wire import Assignment, StepFeedback

from .balance import dif, straggler_effect
from .fleet import DeviceRecord, FleetTracker
from .metrics import CoordinatorMetrics
from .state import Plan
from .status import plan_summary

__all__ = ["PlanObserver", "Published"]


@dataclass(frozen=True)
class Published:
    """One plan as it went out: the plan, its wire form, and how it came about."""

    plan: Plan
    assignment: Assignment
    basis: int
    """The step whose feedback it was made from (-1: warm start, before any)."""
    complete: bool
    """Whether every expected device had reported `basis`."""
    warm: bool
    latency: float
    """Seconds from the step being due to the plan handed to the producer."""
    dropped: dict[str, int]
    """Samples truncation dropped, by device."""


class PlanObserver:
    """The coordinator's metrics and the plan figures of its status page.

    Args:
        metrics: the service's metrics.
        job: the value of every metric's `job` label.
    """

    def __init__(self, metrics: CoordinatorMetrics, job: str) -> None:
        self.metrics = metrics
        self.job = job
        self.last_plan: dict[str, Any] | None = None
        """The status page's summary of the last plan published (`status.plan_summary`)."""
        self._latencies: deque[float] = deque(maxlen=1000)
        self._fractions: deque[float] = deque(maxlen=1000)
        self._waiting: dict[int, bool] = {}  # step -> its plan left work waiting on every device

    # ---- plans ---------------------------------------------------------------------------------

    def deferred(self) -> None:
        """A plan ahead was not published: it would have trained nothing."""
        self.metrics.plans_deferred.labels(self.job).inc()

    def published(self, out: Published, fleet: FleetTracker) -> None:
        """Record a plan just published: its latency, the basis step's balance, and the plan's own figures."""
        m, job = self.metrics, self.job
        m.plan_latency.labels(job).observe(out.latency)
        self._latencies.append(out.latency)
        m.plans.labels(job).inc()
        step_seconds = fleet.step_seconds(out.basis)
        fraction = out.latency / step_seconds if step_seconds else None
        if fraction is not None:
            m.plan_latency_fraction.labels(job).set(fraction)
            self._fractions.append(fraction)
        if out.warm:
            m.plans_warm.labels(job).inc()
        elif not out.complete:
            m.plans_partial.labels(job).inc()
        self._basis_balance(out, fleet, step_seconds)
        self._plan_figures(out, fleet)
        self.last_plan = plan_summary(out.plan, out.assignment, out.basis, complete=out.complete, warm=out.warm,
                                      latency=out.latency, fraction=fraction)

    def _basis_balance(self, out: Published, fleet: FleetTracker, step_seconds: float | None) -> None:
        """SE and the wall-period split of the basis step; SE where it measures balance, when it does."""
        m, job, plan, basis = self.metrics, self.job, out.plan, out.basis
        last = [r.last_feedback for r in fleet.devices.values()
                if r.last_feedback is not None and r.last_feedback.step == basis]
        times = [fb.compute_seconds for fb in last]
        m.straggler_effect.labels(job).set(straggler_effect(times))
        if last and not out.warm:
            for part, seconds in split_wall_period(last, step_seconds).items():
                m.step_wall.labels(job, part).set(seconds)
        # SE where it measures balance: the basis step's plan left work waiting on every device.
        if self._waiting.pop(basis, False) and len(times) == len(plan.devices) > 1:
            m.straggler_effect_waiting.labels(job).set(straggler_effect(times))
        self._waiting = {s: w for s, w in self._waiting.items() if s > basis}
        self._waiting[plan.step] = all(len(fleet.devices[b.device_id].book) > 0 for b in plan.devices)
        if self._waiting[plan.step]:
            m.steps_waiting.labels(job).inc()

    def _plan_figures(self, out: Published, fleet: FleetTracker) -> None:
        m, job, plan = self.metrics, self.job, out.plan
        m.batch_dif.labels(job).set(dif([b.count for b in plan.devices]))
        m.global_batch.labels(job).set(plan.global_batch)
        m.lr_scale.labels(job).set(plan.lr_scale)
        m.step_target.labels(job).set(plan.step_time_target)
        m.next_step.labels(job).set(plan.step + 1)
        for b in plan.devices:
            labels = (job, b.device_id)
            m.predicted.labels(*labels).set(b.predicted_seconds)
            m.batch.labels(*labels).set(b.count)
            m.batch_size.labels(*labels).set(b.total_size)
            m.truncated.labels(*labels).inc(out.dropped.get(b.device_id, 0))
            m.pending.labels(*labels).set(len(fleet.devices[b.device_id].book))

    def latency_figures(self) -> dict[str, float | None]:
        """The status page's plan-latency medians (and the step fraction's p99) over the last 1000 plans."""
        lat, frac = self._latencies, self._fractions
        return {
            "plan_latency_ms_median": float(np.median(lat)) * 1e3 if lat else None,
            # Plan latency over the wall time of the step each plan followed: the "< 1% of a step" check.
            "plan_latency_step_fraction_median": float(np.median(frac)) if frac else None,
            "plan_latency_step_fraction_p99": float(np.percentile(frac, 99)) if frac else None,
        }

    # ---- devices -------------------------------------------------------------------------------

    def feedback(self, fb: StepFeedback, rec: DeviceRecord) -> None:
        """A device's feedback record was applied: its compute time and the model fitted from it."""
        labels = (self.job, fb.device_id)
        m = self.metrics
        m.feedback.labels(*labels).inc()
        m.actual.labels(*labels).set(fb.compute_seconds)
        model = rec.tracker.model
        m.model_a.labels(*labels).set(model.a)
        m.model_b.labels(*labels).set(model.b)
        if model.rel_error is not None:
            m.pred_error.labels(*labels).set(model.rel_error)
        m.pending.labels(*labels).set(len(rec.book))

    def offsets(self, device: str, rec: DeviceRecord, lag: int, wall: float) -> None:
        """A device topic's offsets were read: its lag in records and seconds, and its arrival rate."""
        m = self.metrics
        m.lag.labels(self.job, device).set(lag)
        m.lag_seconds.labels(self.job, device).set(rec.lag_seconds(wall))
        m.rate.labels(self.job, device).set(rec.rate.rate)

    def membership(self, devices: list[str], absent: set[str]) -> None:
        """Which devices the plans include now."""
        for device in devices:
            self.metrics.present.labels(self.job, device).set(0 if device in absent else 1)
