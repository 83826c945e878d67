"""Which versions `serve` may answer with: the promotion gate, and whether a version fits serve's configuration.

Both are pure functions of (the version's model.json, the live version's, the settings): the service, its
tests and a reader of the logs reach the same verdict from the same figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from streamtrain.config import StreamtrainConfig
from streamtrain.config.serve import ServeConfig
from streamtrain.versions import ModelSpec

__all__ = ["GateVerdict", "judge", "lower_is_better", "misfit"]


def lower_is_better(metric: str) -> bool:
    """Losses and errors (a regression's or a forecast's `_rmse`, `_mae`) improve downwards; accuracies, F1 (and
    anything else) upwards."""
    return metric.endswith(("_loss", "_error", "_rmse", "_mae"))


@dataclass(frozen=True)
class GateVerdict:
    """The gate's answer for one version, with the figures it was reached from."""

    passed: bool
    metric: str | None
    """The metric compared (None: none could be)."""
    candidate: float | None
    live: float | None
    reason: str
    """For a person: what was compared and how it came out."""


def judge(candidate: Mapping[str, float], live: Mapping[str, float] | None, settings: ServeConfig) -> GateVerdict:
    """Whether a version with metrics `candidate` may replace the live one (metrics `live`; None: nothing is live).

    The first of `serve.gate_metrics` both carry decides: the candidate passes unless it is worse than the live
    version by more than `serve.tolerance`. With no metric in common, `serve.unmeasured` decides.
    """
    if live is None:
        return GateVerdict(True, None, None, None, "no version is live yet")
    for metric in settings.gate_metrics:
        if metric in candidate and metric in live:
            new, old = candidate[metric], live[metric]
            worse_by = new - old if lower_is_better(metric) else old - new
            passed = worse_by <= settings.tolerance
            verdict = "within" if passed else "beyond"
            return GateVerdict(passed, metric, new, old, f"{metric} {new:.4f} vs live {old:.4f}: "
                               f"{'worse' if worse_by > 0 else 'no worse'} by {max(worse_by, 0.0):.4f}, {verdict} "
                               f"the tolerance {settings.tolerance:g} (serve.tolerance)")
    passed = settings.unmeasured == "accept"
    return GateVerdict(passed, None, None, None, f"no metric of serve.gate_metrics ({', '.join(settings.gate_metrics)})"
                       f" on both versions: {'accepted' if passed else 'rejected'} (serve.unmeasured)")


def misfit(spec: ModelSpec, config: StreamtrainConfig) -> str | None:
    """Why a version cannot answer the requests serve is configured for, naming the field (None: it fits)."""
    trainer = config.trainer
    if spec.job != config.job:
        return f"model.json job {spec.job!r} is not serve's job {config.job!r} (job)"
    if spec.num_features != trainer.num_features:
        return (f"model.json model.settings.num_features is {spec.num_features}, but serve takes requests of "
                f"(size, {trainer.num_features}) (trainer.num_features)")
    if spec.objective != trainer.objective:
        return f"model.json model.objective is {spec.objective!r}, not {trainer.objective!r} (trainer.objective)"
    if spec.objective == "classification" and spec.num_classes != trainer.num_classes:
        return (f"model.json model.settings.num_classes is {spec.num_classes}, not {trainer.num_classes} "
                "(trainer.num_classes)")
    return None
