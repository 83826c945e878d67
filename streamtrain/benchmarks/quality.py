"""`streamtrain bench quality`: the model `up --dataset` hands out, with its defaults, on a panel of public datasets,
held against the trivial baseline and simple strong references (docs/benchmarks/quality.md)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Annotated

import typer

from .common import Bench, LaunchOptions, Out, Record, Result, Target, WorkDir, num, publish, table, targets_table
from .live import StackCell, live_broker, run_stack_cell
from .quality_reference import PANEL, QualitySet, fit_references, panel_files

__all__ = ["BENCH", "QualityCell", "QualityResult"]

#: Targets: the median over the panel of ours / the reference's (accuracy at least, RMSE at most), and a strongly
#: predictive regression set's held-out RMSE over the mean's.
ACCURACY_RATIO, RMSE_RATIO, STRONG_RMSE = 0.9, 1.1, 0.5
#: A regression set is strongly predictive when the reference's RMSE is at most this share of the mean's.
STRONG_REFERENCE = 0.4
#: `up`'s default device count and rates (samples/s per device).
DEVICES, RATES = 4, (15.0, 30.0, 45.0, 60.0)


class QualityCell(Record):
    """One dataset: ours (held-out at the last evaluation, test-then-train over the last window) beside the
    baseline's and the references'."""

    dataset: str
    kind: str
    shape: str
    model: str | None = None
    """The model `up` chose from the data's shape."""
    samples: int = 0
    ours: float | None = None
    baseline: float | None = None
    reference: float | None = None
    reference_name: str = ""
    linear: float | None = None
    ours_prequential: float | None = None
    baseline_prequential: float | None = None
    online_prequential: float | None = None
    steps: int = 0
    seconds: float = 0.0
    error: str | None = None

    @property
    def higher_is_better(self) -> bool:
        return self.kind == "classification"

    @property
    def ratio(self) -> float | None:
        """Ours over the reference (accuracy: higher is better; RMSE: lower is)."""
        return None if self.ours is None or not self.reference else self.ours / self.reference

    @property
    def beats_baseline(self) -> bool | None:
        if self.ours is None or self.baseline is None:
            return None
        return self.ours > self.baseline if self.higher_is_better else self.ours < self.baseline

    @property
    def strong(self) -> bool:
        """A regression set on which the reference reaches `STRONG_REFERENCE` x the mean's RMSE or better."""
        if self.kind != "regression" or self.reference is None or self.baseline is None:
            return False
        return self.reference <= STRONG_REFERENCE * self.baseline


class QualityResult(Result):
    """What `bench quality` measured."""

    duration_s: float
    devices: int
    cells: list[QualityCell]


def _metric(kind: str) -> str:
    return "accuracy" if kind == "classification" else "rmse"


def _run_one(entry: QualitySet, index: int, duration: float, work: Path, bootstrap: str,
             launch: LaunchOptions) -> QualityCell:
    """`up --dataset` on one panel dataset with defaults, its figures read from the run's report."""
    from streamtrain.stack.replay import resolve_replay
    from streamtrain.stack.services import device_streams

    train, test = panel_files(entry, work / "data")
    refs = fit_references(entry, train, test)
    cell = QualityCell(dataset=entry.name, kind=entry.kind, shape=entry.shape, baseline=refs.baseline,
                       reference=refs.reference, reference_name=refs.reference_name, linear=refs.linear,
                       online_prequential=refs.online)
    base: dict[str, object] = {"kafka.bootstrap_servers": bootstrap}
    if entry.kind == "regression" and train.suffix == ".csv":
        base["producer.dataset.target_columns"] = ["Y"]
    replay = resolve_replay(str(train), launch.config(base), DEVICES)
    began = time.monotonic()
    ran = run_stack_cell(StackCell(streams=device_streams(DEVICES, RATES), out=work / "runs" / entry.name,
                                   tag="quality", index=index, settings={**base, **replay.settings},
                                   duration_s=duration, replay=True, replay_samples=replay.samples,
                                   drain_timeout_s=10.0), bootstrap, launch)
    report, metric = ran.report, _metric(entry.kind)
    update: dict[str, object] = {"model": str(replay.settings.get("trainer.model", "")), "samples": replay.samples,
                                 "seconds": round(time.monotonic() - began, 1), "error": ran.error}
    if report is not None and report.objective is not None:
        figures = report.objective
        update |= {"ours": figures.heldout_final.get(metric), "steps": report.steps,
                   "ours_prequential": figures.prequential.recent.get(metric),
                   "baseline_prequential": figures.prequential.recent.get(f"baseline_{metric}")}
    return cell.model_copy(update=update)


def quality_command(
    ctx: typer.Context,
    out: Out = Path("reports/bench"),
    duration: Annotated[float, typer.Option(min=10.0, help="Seconds of training per dataset.")] = 60.0,
    dataset: Annotated[list[str] | None, typer.Option(help="Only these panel datasets (default: all).")] = None,
    work_dir: WorkDir = Path("reports/bench-runs"),
) -> None:
    """The model `up --dataset` gives with its defaults (the model chosen from the data's shape, standardised inputs,
    default optimiser) on each dataset of the panel — UEA/UCR sets bundled with sktime and scikit-learn's tabular
    sets — trained for --duration seconds on 4 devices, against the trivial baseline, a standardised ridge / logistic
    regression or 1-NN (whichever is better) fitted on the same training split, and an online linear learner
    test-then-train. Targets: better than the baseline everywhere; median ratio to the reference >= 0.9 (accuracy),
    <= 1.1 (RMSE)."""
    from streamtrain.runtime.commands import EXIT_CONFIG, config_from, console, die

    chosen = [e for e in PANEL if not dataset or e.name in dataset]
    if dataset and (unknown := sorted(set(dataset) - {e.name for e in PANEL})):
        die(f"--dataset {', '.join(unknown)}: not in the panel ({', '.join(e.name for e in PANEL)})", EXIT_CONFIG)
    cfg, launch = config_from(ctx), LaunchOptions.of(ctx)
    cells = []
    with live_broker(cfg, "bootstrap_servers" in cfg.kafka.model_fields_set, "quality") as broker:
        for i, entry in enumerate(chosen):
            console.print(f"quality: {entry.name} ({entry.kind}, {entry.shape}), {duration:g} s", highlight=False)
            cell = _run_one(entry, i, duration, work_dir / "quality", broker.kafka.bootstrap_servers, launch)
            cells.append(cell)
            console.print(f"  {cell.model}: held-out {_metric(entry.kind)} {num(cell.ours, 3)}, baseline "
                          f"{num(cell.baseline, 3)}, {cell.reference_name} {num(cell.reference, 3)}"
                          + (f"; error: {cell.error}" if cell.error else ""), highlight=False)
    publish(BENCH, QualityResult(duration_s=duration, devices=DEVICES, cells=cells), out)
    if any(c.error for c in cells):
        raise typer.Exit(1)


def _median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def quality_targets(result: QualityResult) -> list[Target]:
    """Better than the baseline everywhere; the median ratios to the reference; strongly predictive regression."""
    cells = [c for c in result.cells if c.error is None]
    beaten = [c for c in cells if c.beats_baseline]
    losing = ", ".join(c.dataset for c in cells if not c.beats_baseline) or "none"
    out = [Target("better than the trivial baseline on every dataset (held-out)",
                  f"{len(beaten)} of {len(result.cells)} (not: {losing})",
                  None if not cells else len(beaten) == len(result.cells))]
    for kind, bound, word in (("classification", ACCURACY_RATIO, ">="), ("regression", RMSE_RATIO, "<=")):
        median = _median([c.ratio for c in cells if c.kind == kind])
        met = None if median is None else (median >= bound if kind == "classification" else median <= bound)
        out.append(Target(f"median {_metric(kind)} over the reference's {word} {bound:g}",
                          f"{num(median, 3)} over {sum(c.kind == kind for c in cells)} datasets", met))
    strong = [c for c in cells if c.strong]
    shown = ", ".join(f"{c.dataset} {num(None if c.ours is None or not c.baseline else c.ours / c.baseline, 3)}"
                      for c in strong)
    out.append(Target(f"strongly predictive regression (reference <= {STRONG_REFERENCE:g}x the mean's RMSE): "
                      f"held-out RMSE <= {STRONG_RMSE:g}x the mean's", shown or "no such dataset",
                      None if not strong else all(c.ours is not None and c.baseline and
                                                  c.ours <= STRONG_RMSE * c.baseline for c in strong)))
    return out


def render_quality(result: QualityResult) -> str:
    """The quality section of BENCHMARKS.md: the targets, then one row per dataset."""
    rows = [(c.dataset, f"{c.kind}, {c.shape}", c.model or "—", c.samples, _metric(c.kind), num(c.ours, 3),
             num(c.baseline, 3), f"{num(c.reference, 3)} ({c.reference_name})", num(c.ratio, 2),
             num(c.ours_prequential, 3), num(c.baseline_prequential, 3), num(c.online_prequential, 3),
             c.error or "") for c in result.cells]
    header = ("dataset", "task", "model", "train samples", "metric", "ours held-out", "baseline held-out",
              "reference held-out", "ours / reference", "ours test-then-train", "baseline test-then-train",
              "online linear test-then-train", "error")
    return "\n\n".join((f"Setup: `up --dataset` with defaults, {result.duration_s:g} s of training per dataset on "
                        f"{result.devices} devices; single runs.", targets_table(quality_targets(result)),
                        table(header, rows)))


BENCH = Bench("quality", quality_command, QualityResult, render_quality, quality_targets,
              args=("--duration", "60"), quick_args=("--duration", "20", "--dataset", "wine", "--dataset",
                                                     "GunPoint"), timeout_s=3600.0)
