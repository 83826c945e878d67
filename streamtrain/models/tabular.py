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

For a regression or forecast with `trainer.dropout` unset, `mlp` is `TabularWithLine`: the MLP beside a ridge line
fitted in closed form to the same features (`streamtrain.models.ridge`), the one that scores lower on held-out
samples kept (`streamtrain.models.choosing`). Gradient steps do not hold a weak signal: on rows whose target the
features explain by a few percent of its variance the MLP reached RMSE 1.003-1.008 where the mean's was
0.996-1.036, and lost to it on one split of three; ridge regression with its penalty chosen by GCV reached
0.981-1.002.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from streamtrain.objectives import Objective

from .batching import PackedBatch
from .choosing import HeldOutChoice, WithLoss
from .conv import segment_mean

__all__ = ["DROPOUT", "TabularMLP", "TabularWithLine"]

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


class TabularWithLine(TabularMLP, HeldOutChoice):
    """`TabularMLP` beside a ridge line over the same features (the mean of a sample's frames), for an objective with
    a least-squares target: trained and scored on held-out samples side by side until the choice settles
    (`HeldOutChoice`), then the chosen one alone. Without such a target (an objective that is not an `Objective`,
    or one with no `fitting_target`) it is the MLP alone.

    Args:
        num_features: Features per frame (F).
        num_outputs: Outputs per sample.
        hidden_size: Width of the hidden layers.
        num_layers: Hidden layers.
        dropout: The MLP's dropout in training.
        objective: What the MLP's loss is and what the line is fitted to.
    """

    def __init__(self, num_features: int, num_outputs: int, hidden_size: int, num_layers: int, dropout: float,
                 objective: Objective) -> None:
        super().__init__(num_features, num_outputs, hidden_size, num_layers, dropout)
        self._init_choice(objective, 0, 1, num_features, num_outputs)

    def version_metrics(self) -> dict[str, float]:
        """What a published version records of the choice: `mlp_ridge` (with the line's penalty and samples) when
        the line was chosen, the held-out samples scored and each candidate's score."""
        if self.ridge is None:
            return {}
        scores = {f"mlp_holdout_loss_{name}": score for name, score in self.candidate_scores(["mlp"]).items()
                  if score is not None}
        return {**self._ridge_metrics("mlp"), "mlp_holdout_scored": float(self.scored), **scores}

    def forward(self, batch: PackedBatch) -> Tensor:
        """Outputs of shape (batch.num_samples, num_outputs); an empty batch gives (0, num_outputs)."""
        x = segment_mean(batch.values, batch.segment_ids, batch.lengths)
        if self.ridge is None:
            return self.outputs(x)
        settled = self._settled_choice()
        if settled == 1:  # the line, fitted to every sample; no weight trains
            self._fit_line(x, batch)
            return self._alone(1, list, self.ridge.outputs(x))
        if settled == 0:
            return self._alone(0, lambda: list(self.parameters()), self.outputs(x))
        line = self.ridge.outputs(x)
        if not self.training:  # both, weighted by the one-hot choice: an exported graph takes no branch
            return torch.einsum("k,kno->no", self.choice, torch.stack([self.outputs(x), line]))
        choice = self.choice.clone()  # the choice of this step (`_score` updates it)
        outputs = self.outputs(x)
        held = self._held_out(batch)
        train = outputs.new_ones(batch.num_samples) if held is None else (~held).to(outputs.dtype)
        loss = (self.objective.losses(outputs, batch) * train).sum() / max(batch.num_samples, 1)
        if held is not None:
            with torch.no_grad():
                plain = self.outputs(x, drop=False)
            self._score([plain, line], held, batch)
        self._fit_line(x, batch, None if held is None else ~held)
        return WithLoss.apply(torch.einsum("k,kno->no", choice, torch.stack([outputs, line]).detach()), loss)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        """A version saved with the MLP alone (before the line) loads with the MLP chosen."""
        if self.ridge is not None:
            self._choice_defaults(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args)
