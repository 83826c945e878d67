"""`trainer.objective` → an objective: a built-in one by name, or yours by dotted path.

Your objective is any object with `output_width()`, `losses(outputs, batch)` and `metric_sums(outputs,
batch)` (subclass `Objective` and the rest comes with it); one that is not an `Objective` is adapted with
the base class's defaults for what it lacks. Named by `package.module:attribute`, the attribute is a factory
`(TrainerConfig) -> objective` (a subclass of `Objective` is one). `check_plugins` then runs it on a probe
batch at start-up, so an objective that raises or answers in the wrong shape fails there, naming the setting.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from streamtrain.config.trainer import TrainerConfig
from streamtrain.plugins import SetupError, resolve_dotted
from streamtrain.wire import Sample

from .base import Objective, Predictions, TargetProblem
from .classification import Classification
from .forecast import Forecast
from .multilabel import Multilabel
from .regression import Regression

__all__ = ["BUILTIN", "REQUIRED_METHODS", "build_objective"]

logger = logging.getLogger(__name__)

#: The objectives `trainer.objective` names (every name of `BUILTIN_OBJECTIVES` in the config).
BUILTIN: dict[str, type[Objective]] = {cls.name: cls for cls in (Classification, Regression, Multilabel, Forecast)}

#: What an objective of your own must have (the rest of `Objective` has defaults).
REQUIRED_METHODS = ("output_width", "losses", "metric_sums")


class _Adapted(Objective):
    """A user's objective that is not an `Objective`: its methods, and the base class's where it has none."""

    def __init__(self, inner: Any, config: TrainerConfig) -> None:
        self.inner = inner
        self.name = str(getattr(inner, "name", config.objective))
        for attribute in ("headline", "baseline", "higher_is_better", "ratios"):
            if hasattr(inner, attribute):
                setattr(self, attribute, getattr(inner, attribute))
        super().__init__(config)

    def output_width(self) -> int:
        return int(self.inner.output_width())

    def losses(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        losses: torch.Tensor = self.inner.losses(outputs, batch)
        return losses

    def metric_sums(self, outputs: torch.Tensor, batch: Any,
                    baseline: torch.Tensor | None = None) -> dict[str, torch.Tensor | float]:
        return dict(self.inner.metric_sums(outputs, batch))

    def target_problem(self, sample: Sample) -> TargetProblem | None:
        own = getattr(self.inner, "target_problem", None)
        return own(sample) if own is not None else None

    def summarise(self, sums: Mapping[str, float]) -> dict[str, float]:
        own = getattr(self.inner, "summarise", None)
        return dict(own(sums)) if own is not None else super().summarise(sums)

    def predicted(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        own = getattr(self.inner, "predicted", None)
        return own(outputs, batch) if own is not None else outputs

    def predict(self, outputs: torch.Tensor, batch: Any) -> Predictions:
        own = getattr(self.inner, "predict", None)
        predictions: Predictions = own(outputs, batch) if own is not None else super().predict(outputs, batch)
        return predictions


def build_objective(config: TrainerConfig) -> Objective:
    """The objective `config.objective` names.

    Raises:
        SetupError: naming `trainer.objective` when the dotted path cannot be resolved, its factory raises, or
            what it returns lacks a method of the contract.
    """
    builtin = BUILTIN.get(config.objective)
    if builtin is not None:
        return builtin(config)
    factory = resolve_dotted(config.objective, "trainer.objective")
    try:
        made = factory(config)
    except Exception as exc:  # user code may raise anything: report it as this setting's failure
        raise SetupError(f"trainer.objective: {config.objective!r} raised {type(exc).__name__} when built with the "
                         f"trainer settings: {exc}") from exc
    if isinstance(made, Objective):
        objective = made
    else:
        missing = [m for m in REQUIRED_METHODS if not callable(getattr(made, m, None))]
        if missing:
            raise SetupError(f"trainer.objective: {config.objective!r} returned {type(made).__name__}, which lacks "
                             f"{', '.join(missing)} (an objective needs {', '.join(REQUIRED_METHODS)}; subclass "
                             "streamtrain.objectives.Objective)")
        objective = _Adapted(made, config)
    logger.info("using objective %s from trainer.objective", config.objective)
    return objective
