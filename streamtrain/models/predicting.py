"""A model's predictions on samples, in its objective's terms: what `load_model(...).predict` and `serve` answer."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from streamtrain.config.trainer import TrainerConfig
from streamtrain.objectives import Objective, Predictions, build_objective
from streamtrain.wire import Sample

from .batching import collate_for_prediction
from .plugins import build_collate

__all__ = ["predict_samples"]


def predict_samples(model: nn.Module, samples: Sequence[Sample], config: TrainerConfig,
                    objective: Objective | None = None) -> Predictions:
    """Run `model` on `samples` and turn its outputs into predictions.

    The samples need no label or target: with the default packing they are packed as they are (a forecast's whole
    series is its input, and the forecast is of the values after it); a collate of the user's
    (`trainer.collate`) is called as in training. The model runs in eval mode, without gradients, on the device its
    parameters are on.

    Args:
        model: The trained model (the bare module, not a DDP wrapper).
        samples: What to predict on, shaped (size, trainer.num_features) each.
        config: The trainer settings the model was trained with (objective, widths, scaling).
        objective: The objective (default: the one `config.objective` names).

    Returns:
        `Predictions` (`labels` and `probabilities`; `values`; `probabilities` and `tags`; a forecast's `values`
        (N, horizon, num_features)); `.rows()` is JSON-ready. Classes are named by their numbers (a loaded
        model names them: `load_model`).

    Raises:
        SetupError: `config.objective` or `config.collate` cannot be built.
        ValueError: a sample does not fit the model's input (wrong shape).
    """
    objective = objective if objective is not None else build_objective(config)
    collate = collate_for_prediction if config.collate is None else build_collate(config)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    batch = collate(samples, config).to(device)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            return objective.predict(model(batch), batch)
    finally:
        model.train(was_training)
