"""Write the provisioned Grafana dashboards (deploy/grafana/dashboards/*.json) with Grafana's own SDK.

    .venv/bin/python -m streamtrain.dashboards.build      # rewrites deploy/grafana/dashboards/*.json

The dashboards are built with `grafana-foundation-sdk`, the typed builders Grafana generates from its own
schemas, pinned in pyproject.toml to the Grafana release docker-compose.yml runs (the SDK is pre-1.0: its
builders change between releases, and a dashboard built for one Grafana version is what that version
expects). Every panel queries the provisioned Prometheus datasource (uid `streamtrain-prometheus`) with
plain PromQL over the metrics the services export (`streamtrain_<service>_<name>_<unit>`). The only
Grafana variable is `$device`, always used as `device=~"$device"`, so substituting `.*` gives an
expression Prometheus evaluates as is. Rate windows are fixed ([1m], [5m]) for the same reason.

The balance dashboard opens with what holds at any load (each device keeping up, its headroom, its lag)
and shows the straggler effect only over steps where every device had work waiting, as `up`'s report
does: the PromQL of both is shared with the report's rules (`streamtrain.dashboards.queries`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders.common import StackingConfig, VizLegendOptions, VizTooltipOptions
from grafana_foundation_sdk.builders.dashboard import Dashboard, DashboardLink, QueryVariable
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    LegendDisplayMode,
    LegendPlacement,
    SortOrder,
    StackingMode,
    TooltipDisplayMode,
)
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DashboardLinkType,
    DataSourceRef,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

from streamtrain.dashboards.queries import keeping_up_query, waiting_straggler_effect_query
from streamtrain.report.run_balance import KEEPS_UP_FRACTION

DATASOURCE_UID = "streamtrain-prometheus"
DEVICE = 'device=~"$device"'
OUT = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboards"
#: The series the `$device` variable lists its values from (every device has a producer stream).
DEVICE_VALUES = "label_values(streamtrain_producer_target_rate_samples_per_second, device)"
PANEL_HEIGHT = 8


@dataclass(frozen=True)
class Query:
    """One PromQL target of a panel and the legend of its series."""

    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    """A time-series panel: what it shows (title, description), its queries, unit and width (of 24 columns)."""

    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    width: int = 12
    stacked: bool = False
    """Series stacked and filled, so the top line is their sum (the parts of one whole)."""


def q(expr: str, legend: str = "{{device}}") -> Query:
    return Query(expr, legend)


BALANCE = (
    # First what holds at any load: whether each device keeps up with its stream, its headroom, its lag.
    Panel("Keeping up per device (1 = yes)", "1 while a device keeps up with its stream: its lag grows by at "
          f"most {KEEPS_UP_FRACTION:.0%} of its arrival rate over the last minute (a trend, not a burst), or less "
          "than a second of "
          "arrivals is waiting; 0 while its backlog climbs. The same rule as `streamtrain up`'s report.",
          (q(keeping_up_query(DEVICE)),), width=8),
    Panel("Headroom per device", "Share of the step period each rank did not spend computing (1 - busy ratio, "
          "smoothed over ~10 steps): the room a device has for more stream. The device nearest 0 is the one "
          "that falls behind first when its stream grows.",
          (q(f"1 - streamtrain_trainer_busy_ratio{{{DEVICE}}}"),), unit="percentunit", width=8),
    Panel("Lag per device (seconds)", "Age of each device's oldest pending sample: level while it keeps up, "
          "growing while it falls behind (the lag dashboard has records, trend and truncation).",
          (q(f"streamtrain_coordinator_lag_seconds{{{DEVICE}}}"),), unit="s", width=8),
    Panel("Straggler effect where every device had work waiting", "SE = (max T - min T) / mean T of the "
          "devices' compute seconds, over the steps whose plan left work waiting on every device: only there "
          "can a plan fill every device's step, so only there is SE a measure of balance (0 is a perfectly "
          "balanced step). A gap while no such step happens: every stream is being kept up with, and a "
          "device with a light stream finishes early by design.",
          (q(waiting_straggler_effect_query(), "SE, work waiting everywhere"),), unit="percentunit"),
    Panel("Steps with work waiting on every device", "Steps per minute whose plan left work waiting on every "
          "device: the steps the straggler effect beside this panel is measured over.",
          (q("increase(streamtrain_coordinator_waiting_steps_total[1m])", "steps per minute"),)),
    Panel("Step time per device", "Collate-to-optimizer seconds of each rank's last step (trainer).",
          (q(f"streamtrain_trainer_step_seconds{{{DEVICE}}}"),), unit="s"),
    Panel("Batch per device (samples)", "Samples each rank trained in its last step, and what the "
          "coordinator's last plan gave it.",
          (q(f"streamtrain_trainer_batch_samples{{{DEVICE}}}", "trained {{device}}"),
           q(f"streamtrain_coordinator_batch_samples{{{DEVICE}}}", "planned {{device}}"))),
    Panel("Batch per device (total size)", "Total size (frames, tokens) of each rank's last batch.",
          (q(f"streamtrain_trainer_batch_total_size{{{DEVICE}}}"),)),
    Panel("Predicted vs actual compute", "The coordinator's predicted compute seconds of each device's "
          "batch against the compute seconds the device reported.",
          (q(f"streamtrain_coordinator_predicted_compute_seconds{{{DEVICE}}}", "predicted {{device}}"),
           q(f"streamtrain_coordinator_actual_compute_seconds{{{DEVICE}}}", "actual {{device}}")), unit="s"),
    Panel("Prediction error", "Smoothed |predicted - actual| / actual of each device's time model.",
          (q(f"streamtrain_coordinator_prediction_error_ratio{{{DEVICE}}}"),), unit="percentunit"),
    Panel("Step wall period split", "Where the last reported step's wall period went, along its critical "
          "path (the slowest rank): compute, exposed communication, waiting for the plan (about 0 when plans "
          "are made a step ahead), waiting for the plan's samples, the report hold (line rate), and the rest "
          "(commits, checkpoints, sending the feedback). Stacked: the top is the period (coordinator).",
          (q("streamtrain_coordinator_step_wall_seconds", "{{part}}"),), unit="s", stacked=True),
    Panel("Compute, plan and data wait, communication and hold", "Per rank: compute, waiting for the plan, "
          "waiting for its samples, and exposed gradient communication of the last step, and how long its report "
          "was held for the plan's target because the group had drained its buffers (line rate; "
          "trainer.hold_max_seconds).",
          (q(f"streamtrain_trainer_compute_seconds{{{DEVICE}}}", "compute {{device}}"),
           q(f"streamtrain_trainer_plan_wait_seconds{{{DEVICE}}}", "plan wait {{device}}"),
           q(f"streamtrain_trainer_data_wait_seconds{{{DEVICE}}}", "data wait {{device}}"),
           q(f"streamtrain_trainer_comm_seconds{{{DEVICE}}}", "comm {{device}}"),
           q(f"streamtrain_trainer_hold_seconds{{{DEVICE}}}", "hold {{device}}")), unit="s"),
    Panel("Plan: step-time target, global batch, DIF, LR scale", "The last plan's step-time target, "
          "global batch (samples), std of the per-device batches, and learning-rate scale.",
          (q("streamtrain_coordinator_step_time_target_seconds", "step target (s)"),
           q("streamtrain_coordinator_global_batch_samples", "global batch"),
           q("streamtrain_coordinator_batch_dif_samples", "batch DIF"),
           q("streamtrain_coordinator_lr_scale_ratio", "LR scale"))),
)

THROUGHPUT = (
    Panel("Produced vs trained samples/s per device", "Samples acknowledged by Kafka (producers) and "
          "samples trained (trainers) per second, per device.",
          (q(f"sum by (device) (rate(streamtrain_producer_samples_sent_total{{{DEVICE}}}[1m]))", "produced {{device}}"),
           q(f"sum by (device) (rate(streamtrain_trainer_samples_total{{{DEVICE}}}[1m]))", "trained {{device}}")),
          unit="ops", width=24),
    Panel("Produced vs trained samples/s, all devices", "Fleet totals; trained below produced means backlog "
          "grows (or is truncated).",
          (q(f"sum(rate(streamtrain_producer_samples_sent_total{{{DEVICE}}}[1m]))", "produced"),
           q(f"sum(rate(streamtrain_trainer_samples_total{{{DEVICE}}}[1m]))", "trained"),
           q(f"sum(rate(streamtrain_coordinator_truncated_samples_total{{{DEVICE}}}[1m]))", "truncated")),
          unit="ops"),
    Panel("Stream rates: target, achieved, arrival", "Rate each producer is paced at, what it achieved "
          "over 5 s, and the arrival rate the coordinator measures on the topic.",
          (q(f"streamtrain_producer_target_rate_samples_per_second{{{DEVICE}}}", "target {{device}}"),
           q(f"streamtrain_producer_achieved_rate_samples_per_second{{{DEVICE}}}", "achieved {{device}}"),
           q(f"streamtrain_coordinator_arrival_rate_samples_per_second{{{DEVICE}}}", "arrival {{device}}")),
          unit="ops"),
    Panel("Trainer samples/s of the last step", "Samples per second of each rank's last step, waiting "
          "included.", (q(f"streamtrain_trainer_samples_per_second{{{DEVICE}}}"),), unit="ops"),
    Panel("Producer queue and back-pressure", "Records waiting in the producers' local queue, and "
          "back-pressure waits per second.",
          (q("streamtrain_producer_queued_records", "queued {{instance}}"),
           q("rate(streamtrain_producer_backpressure_waits_total[1m])", "back-pressure waits/s {{instance}}"))),
)

LAG = (
    Panel("Lag (records)", "High watermark minus the trainers' committed offset, per device topic.",
          (q(f"streamtrain_coordinator_lag_records{{{DEVICE}}}"),)),
    Panel("Keeping up: lag trend (records/s)", "How fast each device's lag grows over the last minute: about 0 "
          "while a device keeps up with its stream (bursts come and go), a steady climb when it cannot.",
          (q(f"deriv(streamtrain_coordinator_lag_records{{{DEVICE}}}[1m])"),), unit="ops"),
    Panel("Lag (seconds)", "Age of each device's oldest pending sample.",
          (q(f"streamtrain_coordinator_lag_seconds{{{DEVICE}}}"),), unit="s"),
    Panel("Buffer depth", "Samples each rank has buffered and not yet trained.",
          (q(f"streamtrain_trainer_buffer_depth_samples{{{DEVICE}}}"),)),
    Panel("Buffer bytes", "Record bytes each rank has buffered.",
          (q(f"streamtrain_trainer_buffer_bytes{{{DEVICE}}}"),), unit="bytes"),
    Panel("Truncation (samples/s)", "Pending samples the plans truncated (coordinator) and the samples "
          "trainers dropped because of it.",
          (q(f"sum by (device) (rate(streamtrain_coordinator_truncated_samples_total{{{DEVICE}}}[1m]))",
             "planned {{device}}"),
           q(f"sum by (device) (rate(streamtrain_trainer_truncated_samples_total{{{DEVICE}}}[1m]))",
             "dropped {{device}}")),
          unit="ops"),
    Panel("Pending samples and deleted records", "The coordinator's pending index per device, and records "
          "removed on the broker by DeleteRecords per second.",
          (q(f"streamtrain_coordinator_pending_samples{{{DEVICE}}}", "pending {{device}}"),
           q(f"sum by (device) (rate(streamtrain_coordinator_deleted_records_total{{{DEVICE}}}[1m]))",
             "deleted/s {{device}}"))),
    Panel("Dead letters", "Records sent to the dead-letter topic over 5 minutes: samples (trainers, per "
          "device) and feedback (coordinator, per reason; 0 until the first one).",
          (q(f"sum by (device) (increase(streamtrain_trainer_dead_lettered_records_total{{{DEVICE}}}[5m]))",
             "samples {{device}}"),
           q("sum by (reason) (increase(streamtrain_coordinator_dead_lettered_records_total[5m])) or on() vector(0)",
             "feedback {{reason}}")), width=12),
    Panel("Producer delivery failures", "Samples whose delivery failed for good, over 5 minutes, per device.",
          (q(f"sum by (device) (increase(streamtrain_producer_samples_failed_total{{{DEVICE}}}[5m]))"),)),
)

#: The headline metric of each built-in objective (`streamtrain.objectives`), as a label matcher.
HEADLINES = "accuracy|rmse|mae|f1_mean"
PREQUENTIAL_SUMS = "streamtrain_trainer_prequential_sums_total"

TRAINING = (
    Panel("Test-then-train loss (fleet)", "Every sample scored by the model before the step that trains it "
          "(prequential): the fleet's mean loss over the last minute, from the summed sums of every rank, and the "
          "same for its headline error or accuracy (accuracy for classification; MAE for regression and forecasts; "
          "0 without samples).",
          (q(f'sum(increase({PREQUENTIAL_SUMS}{{key="loss_sum", {DEVICE}}}[1m])) / '
             f'sum(increase({PREQUENTIAL_SUMS}{{key="count", {DEVICE}}}[1m]))', "loss"),
           q(f'sum(increase({PREQUENTIAL_SUMS}{{key="correct", {DEVICE}}}[1m])) / '
             f'sum(increase({PREQUENTIAL_SUMS}{{key="count", {DEVICE}}}[1m]))', "accuracy"),
           q(f'sum(increase({PREQUENTIAL_SUMS}{{key="abs_error_sum", {DEVICE}}}[1m])) / '
             f'sum(increase({PREQUENTIAL_SUMS}{{key="values", {DEVICE}}}[1m]))', "MAE"),
           q(f'sum(increase({PREQUENTIAL_SUMS}{{key="baseline_abs_error_sum", {DEVICE}}}[1m])) / '
             f'sum(increase({PREQUENTIAL_SUMS}{{key="values", {DEVICE}}}[1m]))', "MAE of the baseline"))),
    Panel("Test-then-train per device vs baseline", "Each device's samples scored before they were trained, over "
          "the last trainer.prequential_window steps: the objective's headline metric (accuracy, RMSE, MAE or mean "
          "F1) beside that of its model-free baseline (the most common class, the training mean, the last value).",
          (q(f'streamtrain_trainer_prequential{{window="recent", metric=~"{HEADLINES}", {DEVICE}}}',
             "{{device}} {{metric}}"),
           q(f'streamtrain_trainer_prequential{{window="recent", metric=~"baseline_({HEADLINES})", {DEVICE}}}',
             "{{device}} {{metric}}"))),
    Panel("Held-out metrics", "The objective's metrics on the held-out set at the last evaluation and its "
          "baseline's (the same on every rank).",
          (q(f'max by (metric) (streamtrain_trainer_heldout{{metric=~"({HEADLINES})|baseline_({HEADLINES})"}})',
             "{{metric}}"),)),
    Panel("Held-out accuracy and loss", "The shared model on the held-out set (trainer.eval_path or "
          "trainer.eval_packaged), every trainer.eval_every steps; every rank exports the same value. 0 until the "
          "first evaluation, and without a held-out set.",
          (q("max(streamtrain_trainer_heldout_accuracy_ratio)", "held-out accuracy"),
           q("max(streamtrain_trainer_heldout_loss)", "held-out loss"))),
    Panel("Loss per device", "Mean loss of each rank's last step with samples.",
          (q(f"streamtrain_trainer_loss{{{DEVICE}}}"),)),
    Panel("Mean loss", "Mean over ranks of the last step's loss.",
          (q(f"avg(streamtrain_trainer_loss{{{DEVICE}}})", "mean loss"),)),
    Panel("Plan latency", "From a step being due to its plan handed to the producer: median and 99th "
          "percentile over 1 minute.",
          (q("histogram_quantile(0.5, sum by (le) (rate(streamtrain_coordinator_plan_latency_seconds_bucket[1m])))",
             "p50"),
           q("histogram_quantile(0.99, sum by (le) (rate(streamtrain_coordinator_plan_latency_seconds_bucket[1m])))",
             "p99")), unit="s"),
    Panel("Plans per second", "Plans published; plans published after the bounded wait without every "
          "device's feedback (0 until the first partial plan); plans ahead left unmade because they would train "
          "nothing (line rate: the step is planned from the next feedback).",
          (q("rate(streamtrain_coordinator_plans_published_total[1m])", "published"),
           q("sum(rate(streamtrain_coordinator_plans_partial_total[1m])) or on() vector(0)", "partial"),
           q("sum(rate(streamtrain_coordinator_plans_ahead_deferred_total[1m])) or on() vector(0)", "deferred")),
          unit="ops"),
    Panel("Late plans", "Steps run on a local plan because the coordinator's Assignment arrived late, over "
          "5 minutes, per device.",
          (q(f"sum by (device) (increase(streamtrain_trainer_plans_late_total{{{DEVICE}}}[5m]))"),)),
    Panel("Steps", "Steps completed by each rank.",
          (q(f"streamtrain_trainer_completed_steps{{{DEVICE}}}"),)),
    Panel("Peak memory per step", "Peak memory of each rank's last step (CUDA allocated), or on the CPU its peak "
          "RSS over the last ten steps.", (q(f"streamtrain_trainer_memory_bytes{{{DEVICE}}}"),), unit="bytes"),
    Panel("Feedback records/s", "Feedback records the coordinator applied, per device.",
          (q(f"sum by (device) (rate(streamtrain_coordinator_feedback_records_total{{{DEVICE}}}[1m]))"),),
          unit="ops"),
)

SERVING = (
    Panel("Freshness", "Per trained sample: from its produced_at to serve's first answer by a model version that "
          "trained it (median and 99th percentile over 5 minutes). What dominates it: the time a sample waits to be "
          "trained, versions.publish_every_seconds, and the gap to the next request.",
          (q("histogram_quantile(0.5, sum by (le) (rate(streamtrain_serve_freshness_seconds_bucket[5m])))", "p50"),
           q("histogram_quantile(0.99, sum by (le) (rate(streamtrain_serve_freshness_seconds_bucket[5m])))",
             "p99")), unit="s"),
    Panel("Model version in use and its age", "The version serve answers with, and seconds since it was written.",
          (q("max(streamtrain_serve_model_version)", "version"),
           q("max(streamtrain_serve_model_age_seconds)", "age (s)"))),
    Panel("Requests per second", "Requests answered (a prediction delivered), and those answered with an error "
          "reason by reason (0 until the first).",
          (q("sum(rate(streamtrain_serve_requests_total[1m]))", "answered"),
           q("sum by (reason) (rate(streamtrain_serve_request_errors_total[1m])) or on() vector(0)",
             "error {{reason}}")), unit="reqps"),
    Panel("Request latency", "From a request's produced_at to its prediction: median and 99th percentile over "
          "1 minute.",
          (q("histogram_quantile(0.5, sum by (le) (rate(streamtrain_serve_latency_seconds_bucket[1m])))", "p50"),
           q("histogram_quantile(0.99, sum by (le) (rate(streamtrain_serve_latency_seconds_bucket[1m])))", "p99")),
          unit="s"),
    Panel("Versions published, switched to and rejected", "Over 5 minutes: versions the trainers published, "
          "versions serve switched to, and versions it rejected by reason (gate, misfit, unreadable; 0 until the "
          "first).",
          (q("max(increase(streamtrain_trainer_model_versions_total[5m]))", "published"),
           q("sum(increase(streamtrain_serve_version_switches_total[5m]))", "switched to"),
           q("sum by (reason) (increase(streamtrain_serve_rejected_versions_total[5m])) or on() vector(0)",
             "rejected {{reason}}")), width=24),
)

DASHBOARDS = {
    "streamtrain-balance": ("streamtrain — balance", "Each device keeping up, its headroom and lag; the "
                            "straggler effect where every device had work waiting; per-device step time and batch, "
                            "predicted vs actual compute.", BALANCE),
    "streamtrain-throughput": ("streamtrain — throughput", "Produced vs trained samples/s per device.",
                               THROUGHPUT),
    "streamtrain-lag": ("streamtrain — lag, buffer, truncation, dead letters", "Backlog per device and what "
                        "happens to it.", LAG),
    "streamtrain-training": ("streamtrain — loss and planning", "Loss, plan latency, late plans.", TRAINING),
    "streamtrain-serving": ("streamtrain — model out and serving", "Freshness, the version serve answers with, "
                            "requests, latency, versions rejected.", SERVING),
}


def _datasource() -> DataSourceRef:
    return DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)


def _timeseries(panel: Panel) -> Timeseries:
    """`panel` as a Grafana time-series panel: thin lines, legend below, a shared tooltip sorted by value."""
    built = (Timeseries().title(panel.title).description(panel.description).datasource(_datasource())
             .height(PANEL_HEIGHT).span(panel.width).unit(panel.unit).line_width(1)
             .fill_opacity(60 if panel.stacked else 0)
             .legend(VizLegendOptions().display_mode(LegendDisplayMode.LIST).placement(LegendPlacement.BOTTOM)
                     .show_legend(True))
             .tooltip(VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING)))
    if panel.stacked:
        built.stacking(StackingConfig().mode(StackingMode.NORMAL).group("A"))
    for ref, query in zip("ABCDEFGH", panel.queries, strict=False):
        built.with_target(Dataquery().ref_id(ref).datasource(_datasource()).expr(query.expr)
                          .legend_format(query.legend).range())
    return built


def _device_variable() -> QueryVariable:
    """`$device`: every device with a producer stream, several at once, "All" as the regex `.*`."""
    return (QueryVariable("device").label("device").datasource(_datasource()).query(DEVICE_VALUES)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.NUMERICAL_ASC)
            .multi(True).include_all(True).all_value(".*")
            .current(VariableOption(selected=True, text=["All"], value=["$__all"])))


def dashboard(uid: str) -> Dashboard:
    """The builder of one dashboard: its panels two per row (or full width), links to the others, `$device`."""
    title, description, panels = DASHBOARDS[uid]
    built = (Dashboard(title).uid(uid).description(description).tags(["streamtrain"]).timezone("browser")
             .editable().tooltip(DashboardCursorSync.CROSSHAIR).refresh("10s").time("now-30m", "now")
             .with_variable(_device_variable()))
    for other_uid, (other_title, _, _) in DASHBOARDS.items():
        if other_uid != uid:
            built.link(DashboardLink(other_title).type(DashboardLinkType.LINK).url(f"/d/{other_uid}")
                       .keep_time(True).include_vars(True))
    for panel in panels:
        built.with_panel(_timeseries(panel))
    return built


def dashboard_json(uid: str) -> dict[str, Any]:
    """One dashboard's JSON model, as the file holds it."""
    model: dict[str, Any] = json.loads(json.dumps(dashboard(uid).build(), cls=JSONEncoder))
    return model


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for uid in DASHBOARDS:
        path = OUT / f"{uid}.json"
        path.write_text(json.dumps(dashboard_json(uid), indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
