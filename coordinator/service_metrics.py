"""Prometheus metrics of the coordinator service, declared once (labels: `job`, and `device` per device).

Each `Coordinator` gets its own registry, so tests can run several in one process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["CoordinatorMetrics"]

_NS = "streamtrain_coordinator"
_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


class CoordinatorMetrics:
    """The coordinator's metrics on one registry.

    Args:
        registry: where to register (each service instance passes a fresh `CollectorRegistry()`).
        job: the value of every metric's `job` label.
    """

    def __init__(self, registry: CollectorRegistry, job: str) -> None:
        self.registry = registry
        self.job = job

        def fleet_gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"{_NS}_{name}", doc, ["job"], registry=registry)

        def device_gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"{_NS}_{name}", doc, ["job", "device"], registry=registry)

        def device_counter(name: str, doc: str) -> Counter:
            return Counter(f"{_NS}_{name}", doc, ["job", "device"], registry=registry)

        self.plan_latency = Histogram(f"{_NS}_plan_latency_seconds",
                                      "From the step being due to its plan handed to the producer.", ["job"],
                                      buckets=_LATENCY_BUCKETS, registry=registry)
        self.plans = Counter(f"{_NS}_plans_published", "Plans published on the assignments topic.", ["job"],
                             registry=registry)
        self.plans_partial = Counter(f"{_NS}_plans_partial",
                                     "Plans published after the bounded wait without every device's feedback.",
                                     ["job"], registry=registry)
        self.dead_lettered = Counter(f"{_NS}_dead_lettered", "Feedback records sent to the dead-letter topic.",
                                     ["job", "reason"], registry=registry)
        self.straggler_effect = fleet_gauge("straggler_effect",
                                            "SE = (max T - min T) / mean T of the last step's compute seconds.")
        self.batch_dif = fleet_gauge("batch_dif", "Std of the per-device batch sizes (samples) in the last plan.")
        self.global_batch = fleet_gauge("global_batch_samples", "Samples over all devices in the last plan.")
        self.lr_scale = fleet_gauge("lr_scale", "Learning-rate scale of the last plan.")
        self.step_target = fleet_gauge("step_time_target_seconds", "Step-time target of the last plan.")
        self.next_step = fleet_gauge("next_plan_step", "The step the next plan is for.")
        self.predicted = device_gauge("predicted_compute_seconds", "Predicted compute seconds of the device's batch.")
        self.actual = device_gauge("actual_compute_seconds", "Compute seconds the device reported for its last step.")
        self.pred_error = device_gauge("prediction_error_ratio",
                                       "Smoothed |predicted - actual| / actual of the device's model.")
        self.model_a = device_gauge("model_seconds_per_size", "Model slope a (seconds per unit of sample size).")
        self.model_b = device_gauge("model_fixed_seconds", "Model intercept b (fixed seconds per step).")
        self.batch = device_gauge("batch_samples", "Samples planned for the device in the last plan.")
        self.batch_size = device_gauge("batch_size_total", "Total size planned for the device in the last plan.")
        self.lag = device_gauge("lag_records", "High watermark minus the trainers' committed offset.")
        self.lag_seconds = device_gauge("lag_seconds", "Age of the device's oldest pending sample.")
        self.rate = device_gauge("arrival_rate_samples_per_second", "Records/s arriving on the device topic (EWMA).")
        self.pending = device_gauge("pending_samples", "Samples in the device's pending index.")
        self.truncated = device_counter("truncated_samples", "Pending samples plans truncated.")
        self.deleted = device_counter("deleted_records", "Records removed on the broker by DeleteRecords.")
        self.feedback = device_counter("feedback_records", "Feedback records applied.")

    def add_device(self, device: str) -> None:
        """Create the device's children up front, so every series exists from the start."""
        for metric in (self.predicted, self.actual, self.pred_error, self.model_a, self.model_b, self.batch,
                       self.batch_size, self.lag, self.lag_seconds, self.rate, self.pending, self.truncated,
                       self.deleted, self.feedback):
            metric.labels(job=self.job, device=device)
