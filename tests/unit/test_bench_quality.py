"""bench quality's panel, references and verdicts (the runs themselves are `streamtrain bench quality`'s)."""

from __future__ import annotations

from pathlib import Path

from streamtrain.benchmarks.quality import QualityCell, QualityResult, quality_targets, render_quality
from streamtrain.benchmarks.quality_reference import PANEL, fit_references, panel_files, read_split


def test_the_panel_has_every_kind_of_dataset_the_issue_asks_for() -> None:
    kinds = {(e.kind, e.shape) for e in PANEL}
    assert len(PANEL) >= 10 and {("classification", "fixed"), ("classification", "variable"), ("regression", "fixed"),
                                 ("regression", "tabular"), ("classification", "tabular")} <= kinds


def test_a_tabular_set_is_written_as_a_users_csv_and_its_references_beat_the_baseline(tmp_path: Path) -> None:
    wine = next(e for e in PANEL if e.name == "wine")
    train, test = panel_files(wine, tmp_path)
    assert train.name == "wine_TRAIN.csv" and len(read_split(train, "classification")) == 124
    refs = fit_references(wine, train, test)
    assert refs.reference >= refs.linear > 0.9 > 0.5 > refs.baseline and 0.5 < refs.online <= 1.0


def _cell(name: str, kind: str, ours: float, baseline: float, reference: float) -> QualityCell:
    return QualityCell(dataset=name, kind=kind, shape="tabular", ours=ours, baseline=baseline, reference=reference,
                       reference_name="ridge" if kind == "regression" else "logistic")


def test_the_targets_read_the_ratios_and_name_a_dataset_that_loses_to_the_baseline() -> None:
    cells = [_cell("a", "classification", 0.90, 0.4, 0.95), _cell("b", "classification", 0.5, 0.6, 0.9),
             _cell("r", "regression", 3.0, 12.0, 2.5), _cell("s", "regression", 50.0, 70.0, 55.0)]
    baseline, accuracy, rmse, strong = quality_targets(QualityResult(duration_s=45, devices=4, cells=cells))
    assert not baseline.met and "3 of 4 (not: b)" in baseline.measured
    assert accuracy.met is False and accuracy.measured.startswith("0.751")  # median of 0.947 and 0.556
    assert rmse.met and rmse.measured.startswith("1.055")  # median of 1.2 and 0.909
    assert strong.met and "r 0.250" in strong.measured  # Tecator-like: the reference is 0.21x the mean's
    text = render_quality(QualityResult(duration_s=45, devices=4, cells=cells))
    assert "| b | classification, tabular |" in text and "**not met**" in text
