"""The panel of `bench quality` and what each dataset is held against: the trivial baseline, a simple strong
reference fitted on the same training split, and an online linear learner scored test-then-train.

The datasets ship inside packages the set-up installs: sktime's copies of UEA/UCR archive sets (`.ts` files, found
without importing sktime) and scikit-learn's bundled tabular sets, written once as `<name>_TRAIN.csv` /
`<name>_TEST.csv` (a fixed 70/30 split, stratified for classes) so that `up --dataset` reads them as a user's CSV.
Every figure here is computed from the files `up` replays, read by `streamtrain.datasets.load_dataset`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from streamtrain.datasets import Dataset, load_dataset

__all__ = ["PANEL", "QualitySet", "References", "fit_references", "panel_files"]

Kind = Literal["classification", "regression"]

#: Points each channel of a variable-length series is resampled to for the references.
RESAMPLED = 64


@dataclass(frozen=True)
class QualitySet:
    """One dataset of the panel."""

    name: str
    kind: Kind
    shape: Literal["tabular", "fixed", "variable"]
    source: str
    """`sktime:<directory>` (its `<dir>_TRAIN.ts` / `_TEST.ts`) or `sklearn:<loader>`."""


PANEL: tuple[QualitySet, ...] = (
    QualitySet("ArrowHead", "classification", "fixed", "sktime:ArrowHead"),
    QualitySet("GunPoint", "classification", "fixed", "sktime:GunPoint"),
    QualitySet("ItalyPowerDemand", "classification", "fixed", "sktime:ItalyPowerDemand"),
    QualitySet("BasicMotions", "classification", "fixed", "sktime:BasicMotions"),
    QualitySet("JapaneseVowels", "classification", "variable", "sktime:JapaneseVowels"),
    QualitySet("PLAID", "classification", "variable", "sktime:PLAID"),
    QualitySet("Tecator", "regression", "fixed", "sktime:Tecator"),
    QualitySet("Covid3Month", "regression", "fixed", "sktime:Covid3Month"),
    QualitySet("diabetes", "regression", "tabular", "sklearn:load_diabetes"),
    QualitySet("breast_cancer", "classification", "tabular", "sklearn:load_breast_cancer"),
    QualitySet("wine", "classification", "tabular", "sklearn:load_wine"),
    QualitySet("digits", "classification", "tabular", "sklearn:load_digits"),
)


def _sktime_dir(name: str) -> Path:
    spec = importlib.util.find_spec("sktime")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    if not roots:
        raise FileNotFoundError("the sktime package is not installed (pip install -e '.[plaid]')")
    return Path(roots[0]) / "datasets" / "data" / name


def _write_csv(path: Path, x: np.ndarray, y: np.ndarray, kind: Kind) -> None:
    names = [f"x{j}" for j in range(x.shape[1])]
    last = "label" if kind == "classification" else "Y"
    rows = [",".join([*names, last])]
    rows += [",".join([*(f"{v:.10g}" for v in row), str(int(t)) if kind == "classification" else f"{t:.10g}"])
             for row, t in zip(x, y, strict=True)]
    path.write_text("\n".join(rows) + "\n")


def panel_files(entry: QualitySet, work: Path) -> tuple[Path, Path]:
    """(training file, held-out file) of a panel dataset, the tabular ones written under `work` first."""
    where, what = entry.source.split(":", 1)
    if where == "sktime":
        root = _sktime_dir(what)
        return root / f"{what}_TRAIN.ts", root / f"{what}_TEST.ts"
    import sklearn.datasets
    from sklearn.model_selection import train_test_split

    x, y = getattr(sklearn.datasets, what)(return_X_y=True)
    stratify = y if entry.kind == "classification" else None
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.3, random_state=0, stratify=stratify)
    work.mkdir(parents=True, exist_ok=True)
    train, test = work / f"{entry.name}_TRAIN.csv", work / f"{entry.name}_TEST.csv"
    _write_csv(train, x_train, y_train, entry.kind)
    _write_csv(test, x_test, y_test, entry.kind)
    return train, test


def read_split(path: Path, kind: Kind) -> Dataset:
    """A split as `up` reads it (CSV targets from the `Y` column)."""
    return load_dataset(path, target_columns=("Y",) if kind == "regression" and path.suffix == ".csv" else ())


def _features(data: Dataset, shape: str) -> np.ndarray:
    """One row per sample: the frame (tabular), the flattened series (fixed length), or each channel resampled to
    `RESAMPLED` points with its mean, standard deviation, minimum and maximum (variable length)."""
    if shape == "tabular":
        return np.stack([s.reshape(-1) for s in data.samples]).astype(np.float64)
    if shape == "fixed" and len({s.shape for s in data.samples}) == 1:
        return np.stack([s.reshape(-1) for s in data.samples]).astype(np.float64)
    rows = []
    for s in data.samples:
        series = np.asarray(s, dtype=np.float64).reshape(len(s), -1)
        grid = np.linspace(0, len(series) - 1, RESAMPLED)
        resampled = [np.interp(grid, np.arange(len(series)), series[:, c]) for c in range(series.shape[1])]
        stats = [series.mean(0), series.std(0), series.min(0), series.max(0)]
        rows.append(np.concatenate([*resampled, *stats]))
    return np.stack(rows)


@dataclass(frozen=True)
class References:
    """A dataset's figures without streamtrain: held-out, and test-then-train over one pass of the training split."""

    baseline: float
    """The trivial baseline on the held-out split (the training split's majority class or mean)."""
    reference: float
    reference_name: str
    linear: float
    """The standardised ridge / logistic regression alone (`reference` is the better of it and 1-NN)."""
    online: float
    """An online linear learner (running standardisation, SGD) scored on each training sample before it learns it."""
    mean_rmse_ratio: float | None
    """A regression reference's held-out RMSE over the mean's (None for classification)."""


def _score(kind: Kind, truth: np.ndarray, guess: np.ndarray) -> float:
    if kind == "classification":
        return float(np.mean(truth == guess))
    return float(np.sqrt(np.mean((truth - guess) ** 2)))


def _targets(data: Dataset, kind: Kind) -> np.ndarray:
    if kind == "classification":
        return data.labels
    assert data.targets is not None
    return data.targets[:, 0]


def _online(kind: Kind, x: np.ndarray, y: np.ndarray) -> float:
    """Test-then-train over one shuffled pass: StandardScaler.partial_fit, then SGD's partial_fit."""
    from sklearn.linear_model import SGDClassifier, SGDRegressor
    from sklearn.preprocessing import StandardScaler

    order = np.random.default_rng(0).permutation(len(y))
    scaler = StandardScaler()
    model: Any = SGDClassifier(loss="log_loss", random_state=0) if kind == "classification" else \
        SGDRegressor(random_state=0)
    classes = np.unique(y)
    level, spread = float(np.mean(y)), float(np.std(y)) or 1.0
    guesses = []
    for i in order:
        row = scaler.partial_fit(x[i: i + 1]).transform(x[i: i + 1])
        started = hasattr(model, "coef_")
        if kind == "classification":
            guesses.append(model.predict(row)[0] if started else classes[0])
            model.partial_fit(row, y[i: i + 1], classes=classes)
        else:
            guesses.append(float(model.predict(row)[0]) * spread + level if started else level)
            model.partial_fit(row, (y[i: i + 1] - level) / spread)
    return _score(kind, y[order], np.asarray(guesses))


def fit_references(entry: QualitySet, train_path: Path, test_path: Path) -> References:
    """The baseline, the reference and the online learner of one panel dataset (see `References`)."""
    from sklearn.linear_model import LogisticRegression, RidgeCV
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    train, test = read_split(train_path, entry.kind), read_split(test_path, entry.kind)
    x_train, x_test = _features(train, entry.shape), _features(test, entry.shape)
    y_train, y_test = _targets(train, entry.kind), _targets(test, entry.kind)
    if entry.kind == "classification":
        baseline = _score(entry.kind, y_test, np.full(len(y_test), np.bincount(y_train).argmax()))
        linear_model: Any = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000))
        neighbour = make_pipeline(StandardScaler(), KNeighborsClassifier(1)).fit(x_train, y_train)
        nn = _score(entry.kind, y_test, neighbour.predict(x_test))
    else:
        baseline = _score(entry.kind, y_test, np.full(len(y_test), y_train.mean()))
        linear_model = make_pipeline(StandardScaler(), RidgeCV(alphas=np.logspace(-3, 3, 13)))
        nn = float("inf")
    linear = _score(entry.kind, y_test, linear_model.fit(x_train, y_train).predict(x_test))
    best_nn = nn > linear if entry.kind == "classification" else nn < linear
    name = "1-NN" if best_nn else ("logistic" if entry.kind == "classification" else "ridge")
    reference = nn if best_nn else linear
    ratio = reference / baseline if entry.kind == "regression" and baseline > 0 else None
    return References(baseline, reference, name, linear, _online(entry.kind, x_train, y_train), ratio)
