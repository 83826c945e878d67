"""Prometheus metrics of the coordinator service, declared once (labels: `job`, and `device` per device).

Each `Coordinator` gets its own registry, so tests can run several in one process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from streamtrain.metrics import MetricSet
from streamtrain.periods import WALL_PARTS

__all__ = ["CoordinatorMetrics"]

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
        fleet = MetricSet(registry, "coordinator", ("job",))
        device = MetricSet(registry, "coordinator", ("job", "device"))
        reasons = MetricSet(registry, "coordinator", ("job", "reason"))
        parts = MetricSet(registry, "coordinator", ("job", "part"))

        self.plan_latency = fleet.histogram("plan_latency_seconds",
                                            "From the step being due to its plan handed to the producer.",
                                            _LATENCY_BUCKETS)
        self.plans = fleet.counter("plans_published", "Plans published on the assignments topic.")
        self.plans_warm = fleet.counter("plans_warm_start",
                                        "Plans published from warm-start models and lag before any feedback (step 0, "
                                        "and step 1 when plans are made one step ahead).")
        self.plan_latency_fraction = fleet.gauge("plan_latency_step_ratio",
                                                 "Last plan's latency over the wall time of the step it followed "
                                                 "(target < 0.01).")
        self.plans_deferred = fleet.counter("plans_ahead_deferred",
                                            "Plans ahead not published because they would train nothing (the group "
                                            "drained what it could see, as at line rate): made from the next "
                                            "feedback instead.")
        self.plans_partial = fleet.counter("plans_partial",
                                           "Plans published after the bounded wait without every device's feedback.")
        self.dead_lettered = reasons.counter("dead_lettered_records", "Feedback records sent to the dead-letter topic "
                                             "(undecodable or rejected), by reason.")
        self.straggler_effect = fleet.gauge("straggler_effect_ratio",
                                            "SE = (max T - min T) / mean T of the last step's compute seconds.")
        self.straggler_effect_waiting = fleet.gauge(
            "straggler_effect_waiting_ratio", "SE of the last step whose plan left work waiting on every device: only "
            "there can a plan fill every device's step, so only there is SE a measure of balance (at line rate a "
            "light stream finishes early by design).")
        self.steps_waiting = fleet.counter("waiting_steps", "Steps whose plan left work waiting on every device.")
        # No step has qualified yet: NaN (a gap), not a perfect 0.
        self.straggler_effect_waiting.labels(job).set(float("nan"))
        self.steps_waiting.labels(job)
        self.batch_dif = fleet.gauge("batch_dif_samples",
                                     "Std of the per-device batch sizes (samples) in the last plan.")
        self.global_batch = fleet.gauge("global_batch_samples", "Samples over all devices in the last plan.")
        self.lr_scale = fleet.gauge("lr_scale_ratio", "Learning-rate scale of the last plan.")
        self.step_target = fleet.gauge("step_time_target_seconds", "Step-time target of the last plan.")
        self.next_step = fleet.gauge("next_plan_step", "The step the next plan is for.")
        self.step_wall = parts.gauge("step_wall_seconds",
                                     "Split of the last reported step's wall period along its critical path (the "
                                     "slowest rank): part = compute, communication (exposed), plan_wait, "
                                     "data_wait, hold, other.")
        for part in WALL_PARTS:
            self.step_wall.labels(job=job, part=part)
        self.predicted = device.gauge("predicted_compute_seconds", "Predicted compute seconds of the device's batch.")
        self.actual = device.gauge("actual_compute_seconds", "Compute seconds the device reported for its last step.")
        self.pred_error = device.gauge("prediction_error_ratio",
                                       "Smoothed |predicted - actual| / actual of the device's model.")
        self.model_a = device.gauge("model_seconds_per_size", "Model slope a (seconds per unit of sample size).")
        self.model_b = device.gauge("model_fixed_seconds", "Model intercept b (fixed seconds per step).")
        self.batch = device.gauge("batch_samples", "Samples planned for the device in the last plan.")
        self.batch_size = device.gauge("batch_total_size", "Total size planned for the device in the last plan.")
        self.lag = device.gauge("lag_records", "High watermark minus the trainers' committed offset.")
        self.lag_seconds = device.gauge("lag_seconds", "Age of the device's oldest pending sample.")
        self.rate = device.gauge("arrival_rate_samples_per_second", "Records/s arriving on the device topic (EWMA).")
        self.pending = device.gauge("pending_samples", "Samples in the device's pending index.")
        self.truncated = device.counter("truncated_samples", "Pending samples plans truncated.")
        self.deleted = device.counter("deleted_records", "Records removed on the broker by DeleteRecords.")
        self.feedback = device.counter("feedback_records", "Feedback records applied.")
        self.present = device.gauge("device_present",
                                    "1 while plans include the device, 0 while it is absent (its trainer left; "
                                    "its stream waits in Kafka).")

    def add_device(self, device: str) -> None:
        """Create the device's children up front, so every series exists from the start."""
        for metric in (self.predicted, self.actual, self.pred_error, self.model_a, self.model_b, self.batch,
                       self.batch_size, self.lag, self.lag_seconds, self.rate, self.pending, self.truncated,
                       self.deleted, self.feedback):
            metric.labels(job=self.job, device=device)
        self.present.labels(job=self.job, device=device).set(1)
