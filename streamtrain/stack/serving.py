"""The model out of `streamtrain up`: the run's model versions, its final model, and `--serve`.

Every run's trainers publish model versions to `<out>/versions` (`versions.dir`); when the run ends, its final
version is copied to `<out>/model`, which `streamtrain.load_model` loads. With `--serve`, `serve` answers the
requests a load generator (`streamtrain request`) sends, and the report gets the serving figures: freshness
(median and p99 over every trained sample, `streamtrain.versions.freshness`, and apart for the samples produced
at line rate and those produced while their device had a backlog), requests answered, versions published,
served and rejected. A new run in the same `--out` says what it replaces of an earlier run's.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from streamtrain.config import StreamtrainConfig
from streamtrain.kafka import read_to_end
from streamtrain.objectives import BUILTIN
from streamtrain.report.schema import ModelOutFigures
from streamtrain.runtime.commands import module_command
from streamtrain.versions import ModelSpec, VersionError, read_version, version_dirs
from streamtrain.versions.freshness import BacklogAt, measure_freshness
from streamtrain.wire import ModelVersion, Prediction, WireError, decode

from .services import ServiceSpec

__all__ = ["BACKLOG_SECONDS", "LOAD_SNIPPET", "backlog_from_series", "forget_versions", "headline_figures",
           "keep_final_model", "model_out_figures", "request_spec", "serve_spec"]

logger = logging.getLogger(__name__)

#: How to load the run's model, printed at the end of a run (`{model}` is the directory).
LOAD_SNIPPET = "import streamtrain; model = streamtrain.load_model('{model}'); model.predict(arrays)"


def serve_spec(port: int, common: dict[str, object], global_args: Sequence[str]) -> ServiceSpec:
    """`streamtrain serve`, metrics on `port`."""
    argv = module_command("streamtrain.serve", "serve", "--port", str(port), global_args=global_args, sets=common)
    return ServiceSpec("serve", "serve", argv, (port,))


def request_spec(rate: float, common: dict[str, object], global_args: Sequence[str]) -> ServiceSpec:
    """`streamtrain request` at `rate` per second: the held-out set (or the synthetic task) as requests."""
    argv = module_command("streamtrain.serve", "request", "--rate", str(rate), global_args=global_args, sets=common)
    return ServiceSpec("requests", "requests", argv, ())


def forget_versions(versions: Path, say: Callable[[str], None]) -> None:
    """Clear an earlier run's versions from `versions` (its final model stays in `<out>/model`), saying so."""
    found = version_dirs(versions)
    if found:
        say(f"removing {len(found)} model version(s) of the previous run in {versions} (versions "
            f"{found[0][0]}..{found[-1][0]}; its final model, if it ended, is in {versions.parent / 'model'})")
    shutil.rmtree(versions, ignore_errors=True)


def keep_final_model(versions: Path, model: Path, say: Callable[[str], None]) -> Path | None:
    """Copy the run's newest version to `model` (replacing an earlier run's, said with what it was).

    Returns:
        `model`, or None when the run published no readable version.
    """
    found = version_dirs(versions)
    if not found:
        say(f"no model version was published in {versions}: no model kept")
        return None
    number, source = found[-1]
    try:
        spec, _ = read_version(source)
    except VersionError as exc:
        say(f"the run's final version cannot be read ({exc}): no model kept")
        return None
    if model.exists():
        say(f"replacing the model of an earlier run in {model} ({_describe(model)})")
        staging = model.with_name(f".{model.name}.new")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(source, staging)
        shutil.rmtree(model)
        staging.rename(model)
    else:
        shutil.copytree(source, model)
    say(f"model: version {number} (step {spec.step}{headline_figures(spec)}) kept in {model}; load it with\n  "
        + LOAD_SNIPPET.format(model=model))
    return model


def headline_figures(spec: ModelSpec) -> str:
    """", held-out rmse 2.31, test-then-train rmse 2.6": the version's figures of its objective's headline metric
    (accuracy, rmse, f1_mean, mae; loss for an objective of your own), those it has."""
    builtin = BUILTIN.get(spec.objective)
    metric = builtin.headline if builtin is not None else "loss"
    shown = [f"{label} {metric} {spec.metrics[key]:.4g}"
             for label, key in (("held-out", f"heldout_{metric}"), ("test-then-train", f"prequential_{metric}"))
             if key in spec.metrics]
    metrics = spec.metrics  # the head `seqflat` or `mlp` chose (`streamtrain.models.choosing`), and on what
    for model, what in (("seqflat", "whole-series "), ("mlp", "")):
        if f"{model}_holdout_scored" not in metrics:
            continue
        chosen_on = f"chosen on {metrics[f'{model}_holdout_scored']:.0f} held-out scores"
        if metrics.get(f"{model}_ridge"):
            shown.append(f"{what}ridge line (penalty {metrics.get(f'{model}_ridge_penalty', 0):g} by GCV, fitted on "
                         f"{metrics.get(f'{model}_ridge_fitted', 0):.0f} samples), {chosen_on}")
        elif model == "seqflat":
            alone = "" if metrics.get("seqflat_with_seq", 1.0) else " alone"
            shown.append(f"whole-series MLP{alone} at dropout {metrics.get('seqflat_dropout', 0.5):g}, {chosen_on}")
        else:
            shown.append(f"MLP over a ridge line, {chosen_on}")
    return "".join(f", {s}" for s in shown)


def _describe(model: Path) -> str:
    try:
        spec, _ = read_version(model)
    except VersionError as exc:
        return f"unreadable: {exc}"
    return f"job {spec.job}, version {spec.version}, step {spec.step}, written {spec.created_at}"


def _records(cfg: StreamtrainConfig, topic: str, kind: type[Any], timeout: float) -> list[Any]:
    out = []
    for msg in read_to_end(cfg.kafka, [topic], timeout):
        try:
            out.append(decode(msg.value(), msg.headers(), kind))
        except WireError as exc:
            logger.warning("%s@%s is not a %s: %s", topic, msg.offset(), kind.SCHEMA, exc)
    return out


#: A device has a backlog while more than this many seconds of its stream (at its median production rate) wait
#: untrained: at the demo's line rates a device's lag stays within about one second of its stream, in its burst
#: it reaches a hundred.
BACKLOG_SECONDS = 2.0


def backlog_from_series(series: Mapping[str, Any]) -> BacklogAt:
    """Whether a device had a backlog when it produced a sample, from the run's series (`series.json`): its lag at
    its first step after the sample was produced, against `BACKLOG_SECONDS` of its stream."""
    t0 = int(series.get("t0_ms", 0))
    rates = series.get("rates", {}).get("devices", {})
    states: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for device, points in series.get("devices", {}).items():
        produced = [r for r in rates.get(device, {}).get("produced_per_s", []) if r > 0]
        if not points.get("t") or not produced:
            continue
        limit = max(1.0, float(np.median(produced)) * BACKLOG_SECONDS)
        states[device] = (np.asarray(points["t"], dtype=np.float64) * 1000.0 + t0,
                          np.asarray(points["lag"], dtype=np.float64) > limit)

    def had_backlog(device: str, produced_at_ms: int) -> bool:
        state = states.get(device)
        if state is None:
            return False
        times, over = state
        return bool(over[min(int(np.searchsorted(times, produced_at_ms)), len(over) - 1)])

    return had_backlog


def model_out_figures(cfg: StreamtrainConfig, model: Path, serving: bool, timeout: float = 60.0,
                      series: Mapping[str, Any] | None = None) -> ModelOutFigures:
    """The report's model-out section, read back from Kafka: the versions, and with `serving` freshness and
    what serve answered; with the run's `series`, freshness split into samples produced at line rate and during a
    backlog (`backlog_from_series`).

    Raises:
        KafkaException, TimeoutError: the topics cannot be read back.
    """
    versions: list[ModelVersion] = [v for v in _records(cfg, cfg.kafka.topics.models, ModelVersion, timeout)
                                    if v.job == cfg.job]
    figures = ModelOutFigures(model_dir=str(model) if model.is_dir() else None,
                              versions_published=len({v.version for v in versions}))
    if not serving:
        return figures
    answers: list[Prediction] = _records(cfg, cfg.kafka.topics.predictions, Prediction, timeout)
    first: dict[int, int] = {}
    for answer in answers:
        if answer.error is None:
            first[answer.version] = min(first.get(answer.version, answer.answered_at), answer.answered_at)
    latencies = [(a.answered_at - a.request_produced_at) / 1000.0 for a in answers
                 if a.request_produced_at is not None and a.error is None]
    fresh = measure_freshness(versions, first, backlog_from_series(series) if series else None)
    split: dict[str, float | int | None] = {}
    for name, part in (("line_rate", fresh.line_rate), ("backlog", fresh.backlog)):
        if part is not None:
            split |= {f"freshness_{name}_samples": part[0], f"freshness_{name}_seconds_median": part[1],
                      f"freshness_{name}_seconds_p99": part[2]}
    return figures.model_copy(update={
        "versions_served": fresh.versions_served,
        "requests_answered": len({(a.request_partition, a.request_offset) for a in answers}),
        "requests_errors": sum(1 for a in answers if a.error is not None),
        "request_latency_seconds_median": float(np.median(latencies)) if latencies else None,
        "freshness_samples": fresh.samples, "freshness_seconds_median": fresh.median_seconds,
        "freshness_seconds_p99": fresh.p99_seconds, "freshness_published_seconds_median":
            fresh.published_median_seconds, "freshness_unserved_samples": fresh.unserved, **split})
