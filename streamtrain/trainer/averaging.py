"""The moving average of the weights that held-out evaluations and published versions use (`trainer.ema_decay`).

A stream trains on small, uneven batches at a constant learning rate, so the weights after the last step sit
anywhere in a neighbourhood of the optimum that the steps' noise keeps them wandering in; on the quality panel a
run's held-out RMSE moved by half of itself from one evaluation to the next. The average of the recent weights sits
near the middle of that neighbourhood (Polyak averaging; what `torch.optim.swa_utils.AveragedModel` keeps with an
EMA). Training runs on the live weights; the average is what the run hands out.

Every rank keeps its own copy and updates it after every optimizer step from the weights DDP keeps identical on
every rank, so the copies stay identical without a collective. A checkpoint holds the live weights only: a group
restarted from one starts its average there again, and the warm-up (`min(decay, (1 + n) / (10 + n))` after n
updates) lets it forget that start within a few dozen steps.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

__all__ = ["WeightAverage"]


class WeightAverage:
    """An exponential moving average of `model`'s parameters, its buffers copied as they are.

    Args:
        model: The bare module being trained (not its DDP wrapper); the average starts as a copy of it.
        decay: Weight of the average so far at each update, once warmed up (0 < decay < 1).
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.module = copy.deepcopy(model)
        self.module.requires_grad_(False)
        self.updates = 0
        self._averages: list[torch.Tensor] = list(self.module.parameters())
        self._buffers = list(self.module.buffers())
        self._live: tuple[nn.Module, list[torch.Tensor]] | None = None

    def update(self, model: nn.Module) -> None:
        """Fold `model`'s weights (after an optimizer step) into the average."""
        self.updates += 1
        kept = min(self.decay, (1 + self.updates) / (10 + self.updates))
        live = self._parameters_of(model)
        with torch.no_grad():
            # One fused call over every tensor (as torch.optim's own averaging does): a step of a small model
            # otherwise pays a Python round per parameter tensor.
            torch._foreach_lerp_(self._averages, live, 1.0 - kept)
            # Walked every time (a module may assign a buffer anew rather than update it in place), when there are any.
            for buffer, current in zip(self._buffers, model.buffers() if self._buffers else (), strict=True):
                buffer.copy_(current)

    def _parameters_of(self, model: nn.Module) -> list[torch.Tensor]:
        """`model`'s parameters, detached, listed once per model (the optimizer updates them in place): walking its
        modules every step is a fixed cost a small model's step feels (bench overhead)."""
        if self._live is None or self._live[0] is not model:
            live = [p.detach() for p in model.parameters()]
            if len(live) != len(self._averages):
                raise ValueError(f"the model has {len(live)} parameter tensors, its average {len(self._averages)}")
            self._live = (model, live)
        return self._live[1]

    def reset(self, model: nn.Module) -> None:
        """Start the average again from `model`'s weights (a restored checkpoint)."""
        self.module.load_state_dict(model.state_dict())
        self.updates = 0
