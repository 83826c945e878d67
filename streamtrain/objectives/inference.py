"""Which objective a dataset is for, read from what its samples carry, and whether a chosen one fits it.

- float targets of 0 and 1 only, two or more per sample: `multilabel` (that many tags);
- any other float targets: `regression` (that many values), standardised by the targets' mean and standard
  deviation;
- integer labels on every sample: `classification`;
- neither: `forecast`, the one objective that needs nothing but the series.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from streamtrain.config.trainer import BUILTIN_OBJECTIVES, TrainerConfig
from streamtrain.datasets import Dataset

__all__ = ["ObjectiveFit", "fit_objective", "infer_objective"]


@dataclass(frozen=True)
class ObjectiveFit:
    """The objective for a dataset, and the trainer settings it needs that were left unset."""

    objective: str
    why: str
    """What in the data says so (for the user)."""
    settings: dict[str, object] = field(default_factory=dict)
    """`trainer.*` settings to give every service (only ones the user did not set)."""


def infer_objective(dataset: Dataset) -> tuple[str, str]:
    """(the objective the data is for, why): see the module doc."""
    targets = dataset.targets
    if targets is not None:
        width = targets.shape[1]
        if width > 1 and np.isin(targets, (0.0, 1.0)).all():
            return "multilabel", f"a 0/1 target of {width} tags per sample"
        return "regression", f"a float target of {width} value{'s' if width > 1 else ''} per sample"
    if dataset.labelled:
        return "classification", "an integer class label per sample"
    return "forecast", "no label or target: the series themselves"


def fit_objective(dataset: Dataset, trainer: TrainerConfig, explicit: set[str], where: str) -> ObjectiveFit:
    """The objective for `dataset`: the one set (`trainer.objective` in `explicit`), checked against the data, or
    the one the data says; with the settings of its shape the user left unset.

    Args:
        dataset: The training data.
        trainer: The trainer settings as configured.
        explicit: The trainer settings the user set (the rest are defaults).
        where: How the error names the dataset (e.g. "--dataset Tecator_TRAIN.ts").

    Raises:
        ValueError: the objective set does not fit the data, or a width set does not; the message names the setting.
    """
    inferred, why = infer_objective(dataset)
    chosen = trainer.objective if "objective" in explicit else inferred
    if chosen not in BUILTIN_OBJECTIVES:
        return ObjectiveFit(chosen, "your own (trainer.objective)")
    if not _fits(chosen, dataset):
        raise ValueError(f"{where}: trainer.objective is {chosen}, but the data carries {why} (it fits {inferred}: "
                         f"--set trainer.objective={inferred})")
    settings: dict[str, object] = {} if chosen == trainer.objective else {"trainer.objective": chosen}
    targets = dataset.targets
    if chosen in ("regression", "multilabel") and targets is not None:
        key = "target_width" if chosen == "regression" else "num_tags"
        width = targets.shape[1]
        if key in explicit and getattr(trainer, key) != width:
            raise ValueError(f"{where}: its targets have {width} values but trainer.{key} is {getattr(trainer, key)} "
                             f"(--set trainer.{key}={width})")
        settings[f"trainer.{key}"] = width
    if chosen == "regression" and targets is not None:
        settings |= _standardising(targets, explicit)
    if chosen == "forecast":
        _check_horizon(dataset, trainer, where)
    return ObjectiveFit(chosen, why if chosen == inferred else f"set (the data carries {why})", settings)


def _fits(objective: str, dataset: Dataset) -> bool:
    """Whether the samples carry what `objective` trains on."""
    targets = dataset.targets
    if objective == "classification":
        return dataset.labelled
    if objective == "regression":
        return targets is not None
    if objective == "multilabel":
        return targets is not None and bool(np.isin(targets, (0.0, 1.0)).all())
    return True  # forecast: the series are all it needs


def _standardising(targets: np.ndarray, explicit: set[str]) -> dict[str, object]:
    """`trainer.target_shift` / `target_scale` from the training targets' mean and standard deviation, unless set."""
    out: dict[str, object] = {}
    std = float(targets.std())
    if "target_shift" not in explicit:
        out["trainer.target_shift"] = round(float(targets.mean()), 6)
    if "target_scale" not in explicit:
        out["trainer.target_scale"] = float(f"{std:.6g}") if std > 0 else 1.0
    return out


def _check_horizon(dataset: Dataset, trainer: TrainerConfig, where: str) -> None:
    sizes = dataset.sizes
    if int(sizes.max()) <= trainer.horizon:
        raise ValueError(f"{where}: its longest series has {int(sizes.max())} values, none left to forecast "
                         f"trainer.horizon={trainer.horizon} from (--set trainer.horizon=N, N < {int(sizes.max())})")
