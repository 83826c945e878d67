"""Prometheus metrics of one trainer rank, declared once (labels `device`, `job`; one endpoint per rank)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from prometheus_client import CollectorRegistry

from streamtrain.metrics import MetricSet
from streamtrain.objectives import Objective, SumWindow
from streamtrain.wire import StepFeedback

__all__ = ["BUSY_SMOOTHING", "ObjectiveMetrics", "TrainerMetrics"]

logger = logging.getLogger(__name__)

#: Weight of the newest step in the smoothed busy ratio (about the last ten steps count).
BUSY_SMOOTHING = 0.1


class TrainerMetrics:
    """One rank's metrics on its own registry, with its single label set bound up front.

    Args:
        registry: Where to register (tests pass a fresh `CollectorRegistry()`).
        device_id: Value of the `device` label.
        job: Value of the `job` label.
    """

    def __init__(self, registry: CollectorRegistry, device_id: str, job: str) -> None:
        self.registry = registry
        labels = {"device": device_id, "job": job}
        metrics = MetricSet(registry, "trainer", list(labels))
        gauge, counter = metrics.gauge, metrics.counter

        self.batch_samples = gauge("batch_samples", "Samples this rank trained in the last step.").labels(**labels)
        self.batch_size = gauge("batch_total_size", "Total size of the samples trained in the last step.").labels(
            **labels)
        self.compute = gauge("compute_seconds", "Compute time of the last step, less exposed communication.").labels(
            **labels)
        self.step = gauge("step_seconds", "Collate-to-optimizer time of the last step.").labels(**labels)
        self.plan_wait = gauge("plan_wait_seconds", "Time the last step waited for its plan (plans made one step "
                               "ahead are there already; a late one falls back after "
                               "trainer.plan_wait_seconds).").labels(**labels)
        self.data_wait = gauge("data_wait_seconds", "Time the last step waited for its plan's samples once the "
                               "plan was there.").labels(**labels)
        self.hold = gauge("hold_seconds", "Time the last step's report was held so the next plan batches what "
                          "arrives meanwhile (line rate; trainer.hold_max_seconds).").labels(**labels)
        self.comm = gauge("comm_seconds", "Communication time the last step's backward waited for.").labels(**labels)
        self.buffer_depth = gauge("buffer_depth_samples", "Samples buffered and not yet trained.").labels(**labels)
        self.buffer_bytes = gauge("buffer_bytes", "Record bytes buffered.").labels(**labels)
        self.loss = gauge("loss", "Mean loss of the last step with samples.").labels(**labels)
        self.samples_per_second = gauge("samples_per_second", "Samples trained per second of the last step, "
                                        "waiting and holding included.").labels(**labels)
        self.global_step = gauge("completed_steps", "Steps completed.").labels(**labels)
        self.committed_offset = gauge("committed_offset", "Last offset committed for the device topic.").labels(
            **labels)
        self.memory = gauge("memory_bytes", "Peak memory of the last step (on the CPU, of the last ten).").labels(
            **labels)
        self.samples = counter("samples", "Samples trained.").labels(**labels)
        self.dead_lettered = counter("dead_lettered_records", "Records sent to the dead-letter topic.").labels(**labels)
        self.truncated = counter("truncated_samples", "Samples dropped by truncation.").labels(**labels)
        self.steps_skipped = counter("skipped_steps", "Steps skipped on every rank because a loss or the aggregated "
                                     "gradient was not finite (samples dead-lettered as non-finite-loss).").labels(
            **labels)
        self.plans_late = counter("plans_late", "Steps run on a local plan because the Assignment was late.").labels(
            **labels)
        self.compressed_steps = counter("compressed_steps", "Steps whose every gradient bucket went Top-k.").labels(
            **labels)
        self._plans_rejected = MetricSet(registry, "trainer", [*labels, "reason"]).counter(
            "plans_rejected", "Plans this rank did not obey (a local plan ran instead), by reason.")
        self._labels = labels
        self._rejected_seen: dict[str, int] = {}
        self.busy = gauge("busy_ratio", "Share of the step period this rank computed (compute over compute, waits, "
                          "communication and hold), smoothed over about ten steps; 1 - busy is its headroom.").labels(
            **labels)
        self.heldout_accuracy = gauge("heldout_accuracy_ratio", "Accuracy of the shared model on the held-out set at "
                                      "the last evaluation (the same on every rank).").labels(**labels)
        self.heldout_loss = gauge("heldout_loss", "Mean cross-entropy on the held-out set at the last evaluation."
                                  ).labels(**labels)
        self.heldout_seconds = gauge("heldout_seconds", "Wall time the last held-out evaluation took from training."
                                     ).labels(**labels)
        self.heldout_step = gauge("heldout_step", "Steps trained before the last held-out evaluation.").labels(**labels)
        self.heldout_evaluations = counter("heldout_evaluations", "Held-out evaluations run.").labels(**labels)
        # Model versions (trainer.publish): written by rank 0, every rank counts the ones its group published.
        self.versions_published = counter("model_versions", "Model versions the group wrote and announced.").labels(
            **labels)
        self.versions_failed = counter("model_version_failures", "Model versions that could not be written (the "
                                       "samples they trained go into the next one).").labels(**labels)
        self.version_seconds = gauge("model_version_seconds", "Time the last model version took from training: "
                                     "gathering its lineage, writing its files, announcing it.").labels(**labels)
        self.version_number = gauge("model_version", "Number of the last model version published.").labels(**labels)
        self._busy: float | None = None

    def record_step(self, feedback: StepFeedback, *, late: bool, compressed: bool, dead_lettered: int) -> None:
        """Update every metric from one step's feedback and counters."""
        self.batch_samples.set(feedback.samples)
        self.batch_size.set(feedback.total_size)
        self.compute.set(feedback.compute_seconds)
        self.step.set(feedback.step_seconds)
        self.plan_wait.set(feedback.plan_wait_seconds)
        self.data_wait.set(feedback.data_wait_seconds)
        self.comm.set(feedback.comm_seconds)
        self.buffer_depth.set(feedback.buffer_depth)
        self.memory.set(feedback.memory_bytes)
        self.global_step.set(feedback.step + 1)
        if feedback.loss is not None:
            self.loss.set(feedback.loss)
        self.hold.set(feedback.hold_seconds)
        wall = feedback.step_seconds + feedback.wait_seconds + feedback.hold_seconds
        self.samples_per_second.set(feedback.samples / wall if wall > 0 else 0.0)
        if wall > 0:
            busy = min(1.0, feedback.compute_seconds / wall)
            self._busy = busy if self._busy is None else self._busy + BUSY_SMOOTHING * (busy - self._busy)
            self.busy.set(self._busy)
        self.samples.inc(feedback.samples)
        self.truncated.inc(feedback.dropped)
        if dead_lettered:
            self.dead_lettered.inc(dead_lettered)
        if late:
            self.plans_late.inc()
        if compressed:
            self.compressed_steps.inc()

    def count_rejected(self, rejected: Mapping[str, int]) -> None:
        """Bring the rejected-plans counter up to `rejected` (running totals by reason)."""
        for reason, total in rejected.items():
            new = total - self._rejected_seen.get(reason, 0)
            if new > 0:
                self._plans_rejected.labels(**self._labels, reason=reason).inc(new)
                self._rejected_seen[reason] = total

    def record_heldout(self, step: int, accuracy: float | None, loss: float, seconds: float) -> None:
        """Update the held-out metrics from one evaluation (after `step` steps); accuracy is classification's."""
        if accuracy is not None:
            self.heldout_accuracy.set(accuracy)
        self.heldout_loss.set(loss)
        self.heldout_seconds.set(seconds)
        self.heldout_step.set(step)
        self.heldout_evaluations.inc()


class ObjectiveMetrics:
    """One rank's figures in the terms of its objective: test-then-train (each sample scored by the model before
    the step that trains it) and held-out.

    `streamtrain_trainer_prequential_sums_total{key}` counts the metric sums themselves (count, loss_sum,
    squared_error_sum, ...), so a dashboard gets any window and the fleet exactly as ratios of sums:
    `sum(increase(...{key="correct"}[1m])) / sum(increase(...{key="count"}[1m]))`. The gauges hold this rank's
    metrics, running (the whole run) and recent (the last `trainer.prequential_window` steps that trained).

    Args:
        registry: Where to register (the rank's registry).
        device_id: Value of the `device` label.
        job: Value of the `job` label.
        objective: Turns sums into metrics.
        window: Steps of the recent window.
    """

    def __init__(self, registry: CollectorRegistry, device_id: str, job: str, objective: Objective,
                 window: int) -> None:
        self.objective = objective
        self.window = SumWindow(window)
        self._labels = {"device": device_id, "job": job}
        self._sums = MetricSet(registry, "trainer", [*self._labels, "key"]).counter(
            "prequential_sums", "Test-then-train metric sums (label key: count, loss_sum, correct, abs_error_sum, "
            "...) of the samples trained, each scored by the model before the step that trained it; metrics are "
            "ratios of these sums over any window and any set of devices.")
        self._metric = MetricSet(registry, "trainer", [*self._labels, "metric", "window"]).gauge(
            "prequential", "Test-then-train metric of this device's samples (label metric: accuracy, rmse, mae, "
            "f1_mean, loss, and their baseline_*), over the whole run (window=running) or the last "
            "trainer.prequential_window steps that trained (window=recent).")
        self._heldout = MetricSet(registry, "trainer", [*self._labels, "metric"]).gauge(
            "heldout", "The objective's metrics on the held-out set at the last evaluation (label metric: accuracy, "
            "rmse, mae, f1_mean, loss, and their baseline_*; the same on every rank).")

    def record_step(self, sums: Mapping[str, float]) -> None:
        """Fold one step's test-then-train sums in (a step that trained nothing has none)."""
        if not sums:
            return
        self.window.add(sums)
        for key, value in sums.items():
            if value > 0:  # a counter only grows; a sum that is not positive adds nothing
                self._sums.labels(**self._labels, key=key).inc(value)
            elif value < 0:
                logger.debug("prequential sum %s = %g not counted: the counter only grows", key, value)
        for window, totals in (("running", self.window.running), ("recent", self.window.recent)):
            for metric, value in self.objective.summarise(totals).items():
                self._metric.labels(**self._labels, metric=metric, window=window).set(value)

    def record_heldout(self, metrics: Mapping[str, float]) -> None:
        """Set the held-out gauges from one evaluation's metrics."""
        for metric, value in metrics.items():
            self._heldout.labels(**self._labels, metric=metric).set(value)
