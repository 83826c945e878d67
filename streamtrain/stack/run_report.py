"""The end of a run: read it back from Kafka, assemble `report.json` (a `StackReport`), draw the plots.

Everything the report says about records and steps comes from the broker (`streamtrain.report.ledger`,
`streamtrain.report.figures`,
`streamtrain.report.run_balance`); the run's settings and how it ended come from the stack itself (`RunSettings`), and
the
coordinator's own figures (plan latency) from its last status page.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from streamtrain.config import StreamtrainConfig
from streamtrain.report.figures import build_report, build_series, write_json
from streamtrain.report.ledger import ReadInterrupted, RunRecords, collect_records, tally_devices
from streamtrain.report.objective import (
    heldout_metric_figures,
    objective_figures,
    objective_for_report,
    prequential_series,
)
from streamtrain.report.plots import plot_series
from streamtrain.report.run_balance import balance_figures, heldout_figures
from streamtrain.report.schema import RunSettings, StackReport, StreamSetting
from streamtrain.stack.bridging import bridge_figures
from streamtrain.stack.options import StackOptions
from streamtrain.stack.replay import held_out_chance

__all__ = ["ReadBack", "assemble_report", "nothing_trained", "read_back", "run_settings", "write_plots"]

logger = logging.getLogger(__name__)

#: A setting a dead letter's detail may name (the trainers' details name the one that refused the sample).
_SETTING = re.compile(r"\b(?:trainer|coordinator|bridge)\.[a-z_]+")

#: Details that point at a setting without naming it, and the setting (with what it must match).
_IMPLIED = (("is not (size, ", "trainer.num_features (every sample's features per frame: its shape's 2nd axis)"),)


@dataclass(frozen=True)
class ReadBack:
    """What reading a run back gave: the records, the report and the series its plots draw, or why there are none."""

    records: RunRecords | None = None
    report: StackReport | None = None
    series: dict[str, Any] = field(default_factory=dict)
    failure: str | None = None


def run_settings(cfg: StreamtrainConfig, opts: StackOptions, status: Mapping[str, Any], **how: Any) -> RunSettings:
    """The report's settings: the policy the coordinator said it ran (else the one asked for), the streams, and
    `how` the run went (`stopped_by`, `drained`, `started_at`, `prometheus_url`, `failures`, ...)."""
    coord = cfg.coordinator
    return RunSettings(
        policy=status.get("policy") or opts.policy or coord.policy,
        truncation=status.get("truncation") or opts.truncation or coord.truncation,
        plan_ahead=status.get("plan_ahead", coord.plan_ahead),
        job=cfg.job, topic_prefix=cfg.kafka.topic_prefix, bootstrap_servers=cfg.kafka.bootstrap_servers,
        backlog_per_device=opts.backlog or None,
        plan_latency_ms_median=status.get("plan_latency_ms_median"),
        plan_latency_step_fraction_median=status.get("plan_latency_step_fraction_median"),
        streams=[StreamSetting(device=s.device_id, rate=s.rate, size_mean=s.size_mean, size_dif=s.size_dif)
                 for _, s in opts.produced],
        external_devices=list(opts.external),
        num_classes=cfg.trainer.num_classes,
        dataset_samples=opts.replay_samples or None,
        **how,
    )


def assemble_report(cfg: StreamtrainConfig, run: RunRecords, settings: RunSettings,
                    series: Mapping[str, Any]) -> StackReport:
    """`report.json` from the run's records, its settings and its series (`build_series`)."""
    figures = build_report(run, tally_devices(cfg, run))
    held = heldout_figures(run.evaluations, int(series.get("t0_ms", 0)))
    chance = held_out_chance(cfg) if run.evaluations and cfg.trainer.objective == "classification" else None
    learned = objective_figures(run.feedback, run.evaluations, run.devices, objective_for_report(cfg.trainer),
                                cfg.trainer.prequential_window)
    return StackReport.model_validate({**dict(settings), **dict(figures), **dict(balance_figures(run, series)),
                                       **dict(held), "heldout_chance": chance, "objective": learned})


def read_back(cfg: StreamtrainConfig, devices: Sequence[str], settings: RunSettings, out: Path,
              stop: Callable[[], bool]) -> ReadBack:
    """Read the run's topics back and write `out/report.json` and `out/series.json`.

    Args:
        cfg: the run's configuration, on the Kafka it ran on.
        devices: the run's devices.
        settings: the report's settings part.
        out: the run directory.
        stop: checked while reading; true abandons the report (a Ctrl-C).
    """
    try:
        run = collect_records(cfg, devices, timeout=60.0, stop=stop)
        bridged = bridge_figures(cfg, stop) if cfg.bridge.sources else None
    except (KafkaException, TimeoutError) as exc:
        return ReadBack(failure=f"could not read the run back from Kafka: {exc}")
    except ReadInterrupted:
        return ReadBack(failure="interrupted while reading the run back from Kafka: no report written")
    series = build_series(run)
    report = assemble_report(cfg, run, settings, series).model_copy(update={"bridge": bridged})
    series["heldout"] = [p.model_dump() for p in report.heldout]
    t0_ms = int(series.get("t0_ms", 0))
    series["prequential"] = prequential_series(run.feedback, t0_ms, objective_for_report(cfg.trainer),
                                               cfg.trainer.prequential_window)
    series["heldout_metrics"] = heldout_metric_figures(run.evaluations, t0_ms).get("points", [])
    report.write(out / "report.json", indent=2)
    write_json(out / "series.json", series)
    return ReadBack(run, report, series)


def write_plots(report: StackReport, series: dict[str, Any], out: Path, failures: list[str]) -> StackReport:
    """Draw the run's plots under `out/plots` and rewrite `report.json` with them (and the failures up to now)."""
    title = f"{report.policy} · {report.devices} devices · {report.steps} steps"
    try:
        paths = plot_series(series, out / "plots", title)
    except (ValueError, RuntimeError) as exc:  # a plot must never lose the report
        logger.warning("plots failed: %s", exc)
        return report
    report = report.model_copy(update={"plots": [str(p.relative_to(out)) for p in paths], "failures": list(failures)})
    report.write(out / "report.json", indent=2)
    return report


def nothing_trained(cfg: StreamtrainConfig, report: StackReport, run: RunRecords) -> str | None:
    """Why a run that had samples to train trained none, as a failure: the top dead-letter reasons, an example
    of each, and the settings they point at. None when it trained some, or had none (nothing produced yet, or
    everything still pending: not a failure)."""
    if report.samples_trained:
        return None
    devices = {cfg.kafka.topics.device(d) for d in run.devices}
    sources = {s.topic for s in cfg.bridge.sources}
    if report.samples_dead_lettered:
        letters = [d for d in run.dead_letters if d.topic in devices]
        what = f"none of the {report.samples_produced:,} samples was trained: the trainers dead-lettered"
    elif report.bridge is not None and report.bridge.source_rejected and not report.bridge.source_bridged:
        letters = [d for d in run.dead_letters if d.topic in sources]
        what = (f"nothing to train: the bridge rejected every one of its {report.bridge.source_records:,} source "
                "records,")
    else:
        return None
    top = Counter(d.reason for d in letters).most_common(3)
    examples = {reason: next(d.detail for d in letters if d.reason == reason) for reason, _ in top}
    settings = dict.fromkeys(s for detail in examples.values() for s in _settings_in(detail))
    if not settings and sources and not report.samples_dead_lettered:
        settings["bridge.sources (the decoder's settings)"] = None
    return (f"{what} {'; '.join(f'{n:,} {reason} (e.g. {examples[reason]})' for reason, n in top)}"
            + (f" — check {', '.join(settings)}" if settings else ""))


def _settings_in(detail: str) -> list[str]:
    return [*(setting for clue, setting in _IMPLIED if clue in detail), *_SETTING.findall(detail)]
