"""Datasets that an installed Python package ships as files, found without importing the package.

PLAID (plug-load appliance currents: 11 classes, 1,074 univariate series of 100 to 1,344 values) is
the reference real dataset: sktime's wheel carries it as the UEA/UCR archive's `PLAID_TRAIN.ts` and
`PLAID_TEST.ts`, and the project's `plaid` extra installs that wheel, so nothing is downloaded at run
time. The same wheel carries two of the archive's regression problems: Tecator (the fat content of
meat from its near-infrared absorbance spectrum: 215 series of 100 values) and Covid3Month (a country's
Covid-19 death rate from its first three months of cases: 201 series of 84 values). The files are
read straight from the package's directory: `importlib.util.find_spec` locates a top-level package
without running its `__init__` (importing sktime would pull pandas and scikit-learn into every
producer and rank for nothing).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .files import DatasetError

__all__ = ["PACKAGED", "PackagedDataset", "check_packaged_name", "packaged_file"]

Split = Literal["train", "test"]


@dataclass(frozen=True)
class PackagedDataset:
    """Where one shipped dataset's files lie inside its package, and how to install it."""

    name: str
    package: str
    directory: str
    """Path of the dataset's directory inside the package."""
    train: str
    test: str
    extra: str
    """The streamtrain extra that installs the package."""
    classes: int
    """Its classes (0: a regression problem, each series' target a float)."""


#: Every dataset `producer.dataset.packaged` and `trainer.eval_packaged` can name.
PACKAGED: dict[str, PackagedDataset] = {
    "plaid": PackagedDataset("plaid", "sktime", "datasets/data/PLAID", "PLAID_TRAIN.ts", "PLAID_TEST.ts",
                             extra="plaid", classes=11),
    "tecator": PackagedDataset("tecator", "sktime", "datasets/data/Tecator", "Tecator_TRAIN.ts", "Tecator_TEST.ts",
                               extra="plaid", classes=0),
    "covid3month": PackagedDataset("covid3month", "sktime", "datasets/data/Covid3Month", "Covid3Month_TRAIN.ts",
                                   "Covid3Month_TEST.ts", extra="plaid", classes=0),
}


def check_packaged_name(value: str | None) -> str | None:
    """`value` when it names a packaged dataset (or is None), for the settings that take one.

    Raises:
        ValueError: naming the datasets there are.
    """
    if value is not None and value not in PACKAGED:
        raise ValueError(f"{value!r} is not a packaged dataset (known: {', '.join(sorted(PACKAGED))})")
    return value


def packaged_file(name: str, split: Split) -> Path:
    """The file of one split of a shipped dataset.

    Args:
        name: a key of `PACKAGED` (e.g. "plaid").
        split: "train" (what producers replay) or "test" (the held-out set trainers evaluate on).

    Raises:
        DatasetError: the name is unknown, or its package (or the file in it) is not installed; the
            message says which extra installs it.
    """
    entry = PACKAGED.get(name)
    if entry is None:
        raise DatasetError(f"no packaged dataset {name!r} (known: {', '.join(sorted(PACKAGED))})")
    hint = f"install it with `pip install -e '.[{entry.extra}]'` (make setup does)"
    spec = importlib.util.find_spec(entry.package)
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    if not roots:
        raise DatasetError(f"dataset {name}: the {entry.package} package is not installed; {hint}")
    path = Path(roots[0]) / entry.directory / (entry.train if split == "train" else entry.test)
    if not path.is_file():
        raise DatasetError(f"dataset {name}: {path} is missing from the installed {entry.package} package; {hint}")
    return path
