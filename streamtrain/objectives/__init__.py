"""Objectives: what the model learns and how it is judged (`trainer.objective`).

Each objective gives the model's output width, the per-sample loss, metric sums that add up exactly across
samples, steps and ranks (test-then-train and held-out alike), a baseline that needs no model, the check of a
sample's target (a sample without it is dead-lettered before it reaches the loss) and the prediction a
loaded model answers with. Built-in: `classification`, `regression`, `multilabel`, `forecast`; any other by
dotted path (`build_objective`).

A model's predictions in an objective's terms come from `streamtrain.models.predict_samples`.
"""

from streamtrain.predictions import Predictions

from .base import (
    MISSING_TARGET,
    SERIES_TOO_SHORT,
    TARGET_RANGE,
    TARGET_WIDTH,
    Objective,
    Ratio,
    TargetProblem,
    add_sums,
    read_sums,
)
from .classification import Classification
from .forecast import Forecast
from .inference import infer_objective
from .multilabel import Multilabel
from .registry import BUILTIN, build_objective
from .regression import Regression
from .window import SumWindow

__all__ = [
    "BUILTIN",
    "MISSING_TARGET",
    "SERIES_TOO_SHORT",
    "TARGET_RANGE",
    "TARGET_WIDTH",
    "Classification",
    "Forecast",
    "Multilabel",
    "Objective",
    "Predictions",
    "Ratio",
    "Regression",
    "SumWindow",
    "TargetProblem",
    "add_sums",
    "build_objective",
    "infer_objective",
    "read_sums",
]
