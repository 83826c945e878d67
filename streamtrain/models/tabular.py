"""The built-in model for tabular data (`trainer.model = "mlp"`): one-frame samples, a row of features each.

`streamtrain up --dataset` picks it when every sample is one frame (a CSV row, a feature vector): a row has no
time axis for a convolution to slide along, and a convolution over one frame is a linear layer with most of its
weights unused. The features arrive standardised (`streamtrain.models.standardise`), so a small MLP learns them
as it would after scikit-learn's StandardScaler; a linear path from the inputs straight to the outputs, beside
the hidden layers, makes the model start as, and never be worse placed than, the linear model the references
fit. A sample of several frames is read as the mean of its frames.

Dropout (`trainer.dropout`, by default `DROPOUT`) on the inputs of both paths and on the hidden layers, in
training only: a few hundred rows are replayed many times over within a run, and without it the MLP fits their
noise (diabetes on the quality panel: held-out RMSE 61 at dropout 0 against 56 at 0.2 after the same steps, ridge
regression 55; digits 0.97 at 0, 0.98 at 0.2, 0.96 at 0.5). The same MLP reads the whole series in `seqflat`
(`streamtrain.models.whole`).
"""

from __future__ import annotations

import itertools

import torch.nn.functional as F
from torch import Tensor, nn

from .batching import PackedBatch
from .conv import segment_mean

__all__ = ["DROPOUT", "TabularMLP"]

#: `mlp`'s dropout when `trainer.dropout` is unset.
DROPOUT = 0.2
_KEEP = nn.Identity()


class TabularMLP(nn.Module):
    """Features (mean over a sample's frames) → hidden layers with GELU, plus a linear path → outputs.

    Args:
        num_features: Features per frame (F).
        num_outputs: Outputs per sample.
        hidden_size: Width of the hidden layers.
        num_layers: Hidden layers.
        dropout: Share of the inputs and hidden units dropped in training (0: none).
    """

    def __init__(self, num_features: int, num_outputs: int, hidden_size: int = 64, num_layers: int = 2,
                 dropout: float = 0.0) -> None:
        super().__init__()
        widths = [num_features] + [hidden_size] * num_layers
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))
        self.head = nn.Linear(hidden_size, num_outputs)
        self.linear = nn.Linear(num_features, num_outputs)
        self.dropout = nn.Dropout(dropout)

    def forward(self, batch: PackedBatch) -> Tensor:
        """Outputs of shape (batch.num_samples, num_outputs); an empty batch gives (0, num_outputs)."""
        return self.outputs(segment_mean(batch.values, batch.segment_ids, batch.lengths))

    def outputs(self, x: Tensor, drop: bool = True) -> Tensor:
        """Outputs (n, num_outputs) of feature vectors `x` (n, num_features); `drop=False`: without dropout, as in
        evaluation, whatever the module's mode."""
        dropout = self.dropout if drop else _KEEP
        h = dropout(x)
        for layer in self.hidden:
            h = dropout(F.gelu(layer(h)))
        return self.head(h) + self.linear(dropout(x))
