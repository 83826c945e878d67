"""Which versions `serve` may answer with: the promotion gate, and whether a version fits serve's configuration.

Both are pure functions of (the version's model.json, the live version's, the settings): the service, its
tests and a reader of the logs reach the same verdict from the same figures.

A metric decides only when it tells the two versions apart: both carry it, each measured on at least
`serve.min_samples` samples, and, for a held-out metric, the new version's evaluation is newer than the live
one's (with `versions.evaluate` off a version carries the latest evaluation, so consecutive versions often
share one: comparing it with itself says nothing). The verdict names each figure's step and sample count.

Before any comparison, a version must beat the trivial baseline measured beside its own figures (the training mean,
the most common class, the last value: `heldout_baseline_rmse` beside `heldout_rmse`; `serve.beat_baseline`), the
first version as much as any later one. The metrics compared follow the objective unless `serve.gate_metrics` is set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from streamtrain.config import StreamtrainConfig
from streamtrain.config.serve import ServeConfig
from streamtrain.versions import ModelSpec

__all__ = ["HEADLINES", "GateVerdict", "baseline_of", "gate_metrics", "judge", "lower_is_better", "measured",
           "misfit"]


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
    """For a person: what was compared, measured when and on how many samples, and how it came out."""
    measured_step: int | None = None
    """The step the candidate's deciding figure was measured at (its held-out evaluation's, or the end of its
    test-then-train window)."""


def _source(metric: str) -> str:
    """`heldout` or `prequential`: the figures a metric comes from (its step and samples are `<source>_step`,
    `<source>_samples`)."""
    return metric.split("_", 1)[0]


def measured(metric: str, metrics: Mapping[str, float]) -> tuple[int | None, int | None]:
    """(the step `metric` was measured at, the samples it is over), where the version says."""
    source = _source(metric)
    step, samples = metrics.get(f"{source}_step"), metrics.get(f"{source}_samples")
    return (int(step) if step is not None else None, int(samples) if samples is not None else None)


def _describe(value: float, step: int | None, samples: int | None) -> str:
    where = ", ".join(part for part in (f"step {step}" if step is not None else "",
                                        f"{samples} samples" if samples is not None else "") if part)
    return f"{value:.4f}" + (f" ({where})" if where else "")


def _passed_over(metric: str, candidate: Mapping[str, float], live: Mapping[str, float],
                 settings: ServeConfig) -> str | None:
    """Why `metric` cannot tell the two versions apart (None: it can decide)."""
    (new_step, new_n), (old_step, old_n) = measured(metric, candidate), measured(metric, live)
    fewest = min((n for n in (new_n, old_n) if n is not None), default=None)
    if fewest is not None and fewest < settings.min_samples:
        return f"{metric} is over {fewest} samples, fewer than serve.min_samples={settings.min_samples}"
    if _source(metric) == "heldout" and new_step is not None and old_step is not None and new_step <= old_step:
        return f"{metric} is the live version's own evaluation (step {old_step}), not a newer one"
    return None


#: The headline metric of each built-in objective: what the gate compares unless `serve.gate_metrics` says.
HEADLINES = {"classification": "accuracy", "regression": "rmse", "multilabel": "f1_mean", "forecast": "mae"}


def gate_metrics(settings: ServeConfig, objective: str) -> tuple[str, ...]:
    """The metrics the gate compares: `serve.gate_metrics` when set, else the objective's headline, held-out then
    test-then-train (an objective of your own: its loss)."""
    if settings.gate_metrics:
        return settings.gate_metrics
    headline = HEADLINES.get(objective, "loss")
    return (f"heldout_{headline}", f"prequential_{headline}")


def baseline_of(metric: str) -> str:
    """The trivial baseline's figure measured beside `metric`: `heldout_rmse` → `heldout_baseline_rmse`."""
    source, name = metric.split("_", 1)
    return f"{source}_baseline_{name}"


def _loses_to_baseline(candidate: Mapping[str, float], metrics: tuple[str, ...],
                       settings: ServeConfig) -> GateVerdict | None:
    """A refusal when the first gate metric the candidate carries beside its baseline's, over enough samples, is
    worse than the baseline's (None: it is not, or no figure can say)."""
    for metric in metrics:
        base = baseline_of(metric)
        _, samples = measured(metric, candidate)
        if metric not in candidate or base not in candidate or (samples is not None and samples < settings.min_samples):
            continue
        new, trivial = candidate[metric], candidate[base]
        worse = new > trivial if lower_is_better(metric) else new < trivial
        if not worse:
            return None
        step, _ = measured(metric, candidate)
        reason = (f"{metric} {_describe(new, step, samples)} is worse than the trivial baseline's {trivial:.4f} "
                  f"({base}: the training mean, the most common class or the last value); a model that loses to it "
                  "is not served (serve.beat_baseline)")
        return GateVerdict(False, metric, new, None, reason, step)
    return None


def judge(candidate: Mapping[str, float], live: Mapping[str, float] | None, settings: ServeConfig,
          objective: str = "classification") -> GateVerdict:
    """Whether a version with metrics `candidate` may replace the live one (metrics `live`; None: nothing is live).

    With `serve.beat_baseline` a version worse than the trivial baseline on the first gate metric that has the
    baseline's figure beside it is refused, live version or none. Then the first of the gate metrics (`gate_metrics`:
    `serve.gate_metrics`, or `objective`'s own) that tells the two apart (see the module doc) decides: the candidate
    passes unless it is worse than the live version by more than `serve.tolerance`. With none, `serve.unmeasured`
    decides.
    """
    metrics = gate_metrics(settings, objective)
    refusal = _loses_to_baseline(candidate, metrics, settings) if settings.beat_baseline else None
    if refusal is not None:
        return refusal
    if live is None:
        return GateVerdict(True, None, None, None, "no version is live yet")
    skipped: list[str] = []
    for metric in metrics:
        if metric not in candidate or metric not in live:
            continue
        why = _passed_over(metric, candidate, live, settings)
        if why is not None:
            skipped.append(why)
            continue
        new, old = candidate[metric], live[metric]
        worse_by = new - old if lower_is_better(metric) else old - new
        passed = worse_by <= settings.tolerance
        step, samples = measured(metric, candidate)
        reason = (f"{metric} {_describe(new, step, samples)} vs live {_describe(old, *measured(metric, live))}: "
                  f"{'worse' if worse_by > 0 else 'no worse'} by {max(worse_by, 0.0):.4f}, "
                  f"{'within' if passed else 'beyond'} the tolerance {settings.tolerance:g} (serve.tolerance)")
        return GateVerdict(passed, metric, new, old, reason, step)
    passed = settings.unmeasured == "accept"
    why = "; ".join(skipped) if skipped else f"no gate metric ({', '.join(metrics)}) on both versions"
    return GateVerdict(passed, None, None, None, f"{why}: {'accepted' if passed else 'rejected'} (serve.unmeasured)")


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
