"""The built-in model for tabular data (`trainer.model = "mlp"`): one-frame samples, a row of features each.

`streamtrain up --dataset` picks it when every sample is one frame (a CSV row, a feature vector): a row has no
time axis for a convolution to slide along, and a convolution over one frame is a linear layer with most of its
weights unused. The features arrive standardised (`streamtrain.models.standardise`), so a small MLP learns them
as it would after scikit-learn's StandardScaler; a linear path from the inputs straight to the outputs, beside
the hidden layers, makes the model start as, and never be worse placed than, the linear model the references
fit. A sample of several frames is read as the mean of its frames.
"""

from __future__ import annotations

import itertools

import torch.nn.functional as F
from torch import Tensor, nn

from .batching import PackedBatch
from .conv import segment_mean

__all__ = ["TabularMLP"]


class TabularMLP(nn.Module):
    """Features (mean over a sample's frames) → hidden layers with GELU, plus a linear path → outputs.

    Args:
        num_features: Features per frame (F).
        num_outputs: Outputs per sample.
        hidden_size: Width of the hidden layers.
        num_layers: Hidden layers.
    """

    def __init__(self, num_features: int, num_outputs: int, hidden_size: int = 64, num_layers: int = 2) -> None:
        super().__init__()
        widths = [num_features] + [hidden_size] * num_layers
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))
        self.head = nn.Linear(hidden_size, num_outputs)
        self.linear = nn.Linear(num_features, num_outputs)

    def forward(self, batch: PackedBatch) -> Tensor:
        """Outputs of shape (batch.num_samples, num_outputs); an empty batch gives (0, num_outputs)."""
        x = segment_mean(batch.values, batch.segment_ids, batch.lengths)
        h = x
        for layer in self.hidden:
            h = F.gelu(layer(h))
        return self.head(h) + self.linear(x)
