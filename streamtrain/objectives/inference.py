"""Which objective a dataset is for, read from what its samples carry, and whether a chosen one fits it.

- float targets of 0 and 1 only, two or more per sample: `multilabel` (that many tags);
- any other float targets: `regression` (that many values), standardised by the targets' mean and standard
  deviation, each value by its own;
- integer labels on every sample: `classification`;
- neither: `forecast`, the one objective that needs nothing but the series (one series over time, a CSV with no
  label, sample or target column, among them: `up --dataset` cuts it into windows).

An objective of your own (a dotted path) gets the same shape settings as `regression` when the data carries float
targets (their width, their per-value shift and scale, their names), so it can standardise its targets as the
built-in one does (`Objective.to_standard`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from streamtrain.config.trainer import BUILTIN_OBJECTIVES, TrainerConfig
from streamtrain.datasets import Dataset

__all__ = ["ObjectiveFit", "fit_objective", "infer_objective"]

#: A series no longer than the horizon cannot be forecast: `fit_objective` warns when this share of them is.
SHORT_SHARE_WARNED = 0.5


@dataclass(frozen=True)
class ObjectiveFit:
    """The objective for a dataset, and the trainer settings it needs that were left unset."""

    objective: str
    why: str
    """Why this objective, for the user: read from the data (and what in it), or set (and what the data carries)."""
    settings: dict[str, object] = field(default_factory=dict)
    """`trainer.*` settings to give every service (only ones the user did not set)."""
    warnings: tuple[str, ...] = ()
    """What will not train as the user may expect (samples that will be dead-lettered, and why)."""


def _tag_rows(targets: np.ndarray) -> np.ndarray:
    """Per sample: whether its target holds only values in [0, 1] (a multilabel target; `target-range` otherwise)."""
    return np.asarray(((targets >= 0.0) & (targets <= 1.0)).all(axis=1))


def infer_objective(dataset: Dataset) -> tuple[str, str]:
    """(the objective the data is for, what in the data says so): see the module doc."""
    targets = dataset.targets
    if targets is not None:
        width = targets.shape[1]
        values = f"{width} value{'s' if width > 1 else ''}"
        if width > 1 and np.isin(targets, (0.0, 1.0)).all():
            return "multilabel", f"a 0/1 target of {width} tags per sample"
        return "regression", f"a float target of {values} per sample"
    if dataset.labelled:
        return "classification", "an integer class label per sample"
    if len(dataset) == 1:  # one series over time (a CSV of frames, nothing named to learn): `up` cuts it into windows
        return "forecast", "one series over time, no label or target: its own future"
    return "forecast", "no label or target: the series themselves"


def fit_objective(dataset: Dataset, trainer: TrainerConfig, explicit: set[str], where: str,
                  target_columns: Sequence[str] = ()) -> ObjectiveFit:
    """The objective for `dataset`: the one set (`trainer.objective` in `explicit`), checked against the data, or
    the one the data says; with the settings of its shape the user left unset.

    Args:
        dataset: The training data.
        trainer: The trainer settings as configured.
        explicit: The trainer settings the user set (the rest are defaults).
        where: How the error names the dataset (e.g. "--dataset Tecator_TRAIN.ts").
        target_columns: The CSV columns the targets came from (`producer.dataset.target_columns`): the names of
            the target's values in metric names (`trainer.target_names`), unless set.

    Raises:
        ValueError: the objective set does not fit the data, or a width set does not; the message names the setting.
    """
    inferred, what = infer_objective(dataset)
    chosen = trainer.objective if "objective" in explicit else inferred
    own = chosen not in BUILTIN_OBJECTIVES
    if chosen == inferred:
        why = f"read from the data: {what}"
    else:
        why = f"{'yours, ' if own else ''}set by trainer.objective; the data carries {what}"
    warnings: list[str] = []
    if not own:
        _check_fit(chosen, inferred, what, dataset, where, warnings)
    if chosen == "regression" and "objective" not in explicit:
        warnings.extend(_mostly_tags(dataset))
        warnings.extend(_whole_numbers(dataset, target_columns))
    settings: dict[str, object] = {} if chosen == trainer.objective else {"trainer.objective": chosen}
    targets = dataset.targets
    if targets is not None and (own or chosen in ("regression", "multilabel")):
        settings |= _shape(chosen, targets, trainer, explicit, where, target_columns, warnings)
    if chosen == "forecast":
        _check_horizon(dataset, trainer, where, warnings)
    return ObjectiveFit(chosen, why, settings, tuple(warnings))


def _outside(tags: np.ndarray) -> str:
    """"3 of 600 samples hold" (or "1 of 600 samples holds"): those whose target is not all in [0, 1]."""
    bad = int((~tags).sum())
    return f"{bad} of {len(tags)} samples {'holds' if bad == 1 else 'hold'}"


def _first_outside(dataset: Dataset, tags: np.ndarray) -> str:
    """The first sample whose target is not all in [0, 1] (`tags` False), its file and the value at fault."""
    assert dataset.targets is not None
    first = int(np.flatnonzero(~tags)[0])
    row = dataset.targets[first]
    return f"sample {first} (of {dataset.sources[first]}) holds {float(row[(row < 0) | (row > 1)][0]):g}"


def _mostly_tags(dataset: Dataset) -> list[str]:
    """A note when most samples' targets are tags, some not: which sample makes the data regression, and how to
    train it as tags instead."""
    targets = dataset.targets
    if targets is None or targets.shape[1] < 2:
        return []
    tags = _tag_rows(targets)
    if tags.all() or tags.mean() <= 0.5:
        return []
    return [f"most samples' targets are tags (0 or 1), but {_outside(tags)} a value outside [0, 1], the first "
            f"{_first_outside(dataset, tags)}: trained as regression; --set trainer.objective=multilabel trains the "
            "others as tags"]


#: A one-value target of whole numbers with at most this many distinct values, each seen this many times on
#: average, reads like class numbers: `up` says how to train it as classes.
CLASS_LIKE_VALUES, CLASS_LIKE_REPEATS = 20, 10


def _whole_numbers(dataset: Dataset, target_columns: Sequence[str]) -> list[str]:
    """A note when a one-value float target holds a few whole numbers only (0, 1, 2, ...: iris's species as a
    column of numbers): it is trained as regression, as asked, and the note says how to train it as classes."""
    targets = dataset.targets
    if targets is None or targets.shape[1] != 1 or not len(targets):
        return []
    values = np.unique(targets[:, 0])
    if not (2 <= len(values) <= CLASS_LIKE_VALUES and len(targets) >= CLASS_LIKE_REPEATS * len(values)
            and np.array_equal(values, np.round(values))):
        return []
    name = target_columns[0] if len(target_columns) == 1 else None
    how = (f"read the column as labels: --set producer.dataset.label_column={name} (without "
           "producer.dataset.target_columns)" if name is not None else "give them as integer labels")
    shown = ", ".join(f"{v:g}" for v in values[:8]) + (", ..." if len(values) > 8 else "")
    return [f"the target{f' {name!r}' if name else ''} holds {len(values)} distinct whole numbers only ({shown}): "
            f"trained as regression (a number between them is a valid answer); if they are classes, {how}"]


def _check_fit(chosen: str, inferred: str, what: str, dataset: Dataset, where: str, warnings: list[str]) -> None:
    """Whether the samples carry what the built-in objective `chosen` trains on; a multilabel target with values
    outside [0, 1] in a few samples, fewer than half, fits (those are dead-lettered as `target-range`, and said so
    in `warnings`).

    Raises:
        ValueError: they do not (naming the setting, and for multilabel the first sample at fault).
    """
    targets = dataset.targets
    fits = {"classification": dataset.labelled, "regression": targets is not None,
            "multilabel": targets is not None}.get(chosen, True)  # forecast: the series are all it needs
    if not fits:
        raise ValueError(f"{where}: trainer.objective is {chosen}, but the data carries {what} (it fits {inferred}: "
                         f"--set trainer.objective={inferred})")
    if chosen != "multilabel" or targets is None:
        return
    tags = _tag_rows(targets)
    if tags.all():
        return
    at = _first_outside(dataset, tags)
    if tags.mean() < 0.5:  # mostly not tags: not a multilabel dataset with a few bad samples
        raise ValueError(f"{where}: trainer.objective is multilabel, but {_outside(tags)} a target value outside "
                         f"[0, 1] (a tag is 1 or 0), the first {at}; the data carries {what} (it fits {inferred}: "
                         f"--set trainer.objective={inferred})")
    warnings.append(f"{_outside(tags)} a target value outside [0, 1], the first {at}: dead-lettered "
                    "as target-range as they arrive, the rest trained as tags")


def _shape(chosen: str, targets: np.ndarray, trainer: TrainerConfig, explicit: set[str], where: str,
           target_columns: Sequence[str], warnings: list[str]) -> dict[str, object]:
    """The target's width (`target_width`, or `num_tags` for multilabel), standardisation and value names, those
    the user left unset.

    Raises:
        ValueError: a built-in objective's width is set and differs from the data's.
    """
    key = "num_tags" if chosen == "multilabel" else "target_width"
    width = targets.shape[1]
    out: dict[str, object] = {}
    if key not in explicit:
        out[f"trainer.{key}"] = width
    elif getattr(trainer, key) != width:
        if chosen in BUILTIN_OBJECTIVES:
            raise ValueError(f"{where}: its targets have {width} values but trainer.{key} is "
                             f"{getattr(trainer, key)} (--set trainer.{key}={width})")
        warnings.append(f"its targets have {width} values but trainer.target_width is {trainer.target_width}: "
                        "trainer.target_shift and target_scale are not derived from them")
        return out
    if "target_names" not in explicit and len(target_columns) == width:
        out["trainer.target_names"] = list(target_columns)
    if chosen != "multilabel":
        out |= _standardising(targets, explicit)
    return out


def _number(value: float) -> float:
    return float(f"{value:.6g}")


def _standardising(targets: np.ndarray, explicit: set[str]) -> dict[str, object]:
    """`trainer.target_shift` / `target_scale` from the training targets' mean and standard deviation, each value of
    the target by its own (one number for a scalar target, a list for a vector), unless set."""
    means = [_number(float(m)) for m in targets.mean(axis=0)]
    scales = [_number(float(s)) if s > 0 else 1.0 for s in targets.std(axis=0)]
    out: dict[str, object] = {}
    if "target_shift" not in explicit:
        out["trainer.target_shift"] = means[0] if len(means) == 1 else means
    if "target_scale" not in explicit:
        out["trainer.target_scale"] = scales[0] if len(scales) == 1 else scales
    return out


def _check_horizon(dataset: Dataset, trainer: TrainerConfig, where: str, warnings: list[str]) -> None:
    """Refuse a horizon no series is longer than; warn when most series are no longer (they are dead-lettered)."""
    sizes = dataset.sizes
    if int(sizes.max()) <= trainer.horizon:
        raise ValueError(f"{where}: its longest series has {int(sizes.max())} values, none left to forecast "
                         f"trainer.horizon={trainer.horizon} from (--set trainer.horizon=N, N < {int(sizes.max())})")
    short = int((sizes <= trainer.horizon).sum())
    if short >= SHORT_SHARE_WARNED * len(sizes):
        warnings.append(f"{short} of {len(sizes)} series are no longer than trainer.horizon={trainer.horizon}: they "
                        f"will be dead-lettered as series-too-short (their median length is {int(np.median(sizes))}; "
                        "--set trainer.horizon=N with N below it)")
