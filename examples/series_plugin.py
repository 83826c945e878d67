"""Your own model and collate function for streamtrain: a complete plug-in module, outside the package.

This module shows the whole contract with a design different from the built-in ones: the collate
function *pads* a batch to its longest series (a (batch, length, features) tensor plus a mask),
and the model is a small 1-D conv net with masked mean pooling over that padding. (Padding makes a
batch cost count x longest rather than its total size, so the coordinator's time model fits it less
well than the packed built-ins: it is the plug-in's choice to make.) The padded length is rounded up
with `streamtrain.bucketed_length`, so a stream of batches comes back to a few shapes and a
kernel library that builds kernels per shape (oneDNN on a CPU) reuses them.

Train it on a `.ts` dataset of your own (here the toy one `toy_series.py` writes):

    .venv/bin/python examples/toy_series.py data/                      # data/Toy_TRAIN.ts, data/Toy_TEST.ts
    PYTHONPATH=examples .venv/bin/streamtrain \\
        --set trainer.model=series_plugin:build_model --set trainer.collate=series_plugin:collate \\
        --set trainer.num_features=2 --set trainer.num_classes=3 \\
        up --dataset data/Toy_TRAIN.ts --duration 60                   # Toy_TEST.ts is the held-out set

`--dataset` takes any `.ts` file (or `.npz`/`.npy`/`.csv`, or a directory of them); the `_TEST.ts`
beside a `_TRAIN.ts` is evaluated every `trainer.eval_every` steps, or name the held-out set with
`--set trainer.eval_path=...`. Without `up`, replay into the device topics with `streamtrain produce
--dataset data/Toy_TRAIN.ts` and train with `streamtrain train` and the same `--set` options.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from streamtrain import Sample, TrainerConfig, bucketed_length

__all__ = ["PaddedBatch", "PaddedConvNet", "build_model", "collate"]


@dataclass(frozen=True)
class PaddedBatch:
    """Series padded to the longest one. What a step needs from any batch: `labels`, `num_samples`,
    `total_size` (the sum of the samples' sizes, which is what the coordinator plans by) and `to(device)`."""

    values: torch.Tensor
    """(batch, longest, features) float, zero past each series' end."""
    mask: torch.Tensor
    """(batch, longest) 1.0 where a series has a value."""
    labels: torch.Tensor
    """(batch,) int64 class of each series."""

    @property
    def num_samples(self) -> int:
        return int(self.labels.shape[0])

    @property
    def total_size(self) -> int:
        return int(self.mask.sum())

    def to(self, device: torch.device) -> PaddedBatch:
        return PaddedBatch(self.values.to(device), self.mask.to(device), self.labels.to(device))


def collate(samples: Sequence[Sample], config: TrainerConfig) -> PaddedBatch:
    """`trainer.collate`: samples (each `sample.array()` of shape (size, num_features)) → one padded batch.

    Normalisation lives here in this plug-in: each series is z-scored per feature, so the model sees
    shapes, not units. An empty list must give an empty batch (an idle rank still runs its step).
    """
    longest = bucketed_length(max((s.size for s in samples), default=1))  # at most 1/8 more, few shapes
    values = np.zeros((len(samples), longest, config.num_features), dtype=np.float32)
    mask = np.zeros((len(samples), longest), dtype=np.float32)
    for i, sample in enumerate(samples):
        x = sample.array().astype(np.float32)
        values[i, : sample.size] = (x - x.mean(axis=0)) / (x.std(axis=0) + 1e-6)
        mask[i, : sample.size] = 1.0
    labels = torch.tensor([s.label for s in samples], dtype=torch.int64)
    dtype = torch.float64 if config.precision == "float64" else torch.float32
    return PaddedBatch(torch.from_numpy(values).to(dtype), torch.from_numpy(mask).to(dtype), labels)


class PaddedConvNet(nn.Module):
    """Two conv layers over padded series, masked mean pooling, a linear head."""

    def __init__(self, features: int, classes: int, hidden: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(features, hidden, 5, padding=2)
        self.conv2 = nn.Conv1d(hidden, hidden, 5, padding=2)
        self.head = nn.Linear(hidden, classes)

    def forward(self, batch: PaddedBatch) -> torch.Tensor:
        """Logits (batch.num_samples, classes)."""
        mask = batch.mask.unsqueeze(1)  # (batch, 1, longest): zero the padding after every layer
        h = F.gelu(self.conv1(batch.values.transpose(1, 2))) * mask
        h = F.gelu(self.conv2(h)) * mask
        pooled = h.sum(dim=2) / mask.sum(dim=2).clamp_min(1.0)
        return self.head(pooled)


def build_model(config: TrainerConfig) -> nn.Module:
    """`trainer.model`: a factory taking the trainer settings, returning the module every rank trains."""
    return PaddedConvNet(config.num_features, config.num_classes, config.hidden_size)
