"""A model plug-in that makes a step non-finite on demand: the default model, with NaN logits for marked samples.

Set `trainer.model=nan_model:build` (this directory on PYTHONPATH): a sample whose size is `MARKED_SIZE` gets
NaN logits, so the loss of any batch holding one is NaN while its gradients stay finite (`torch.where` passes no
gradient to the replaced rows): only the loss can tell the group to skip the step. With `trainer.num_layers`
and the other settings of the default model.
"""

from __future__ import annotations

import torch
from torch import nn

from streamtrain.config.trainer import TrainerConfig
from streamtrain.models.batching import PackedBatch
from streamtrain.models.conv import PackedConvNet

#: Size (frames) of a sample this model answers with NaN.
MARKED_SIZE = 13


class NanOnMarked(nn.Module):
    """`PackedConvNet` whose logits are NaN for every sample of size `MARKED_SIZE`."""

    def __init__(self, config: TrainerConfig) -> None:
        super().__init__()
        self.inner = PackedConvNet(config.num_features, config.num_classes, config.hidden_size, config.num_layers,
                                   config.kernel_size)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        logits = self.inner(batch)
        marked = (batch.lengths == MARKED_SIZE).unsqueeze(1)
        return torch.where(marked, torch.full_like(logits, float("nan")), logits)


def build(config: TrainerConfig) -> nn.Module:
    """The `trainer.model` factory."""
    return NanOnMarked(config)
