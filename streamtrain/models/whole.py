"""The built-in model for series of one length (`trainer.model = "seqflat"`): `seq` beside a path that reads the
whole series, position by position.

In a dataset whose series all have one length, a position means the same thing in every sample: the 40th
wavelength of a spectrum (Tecator), the 30th day of an epidemic (Covid3Month), the 100th point of an outline
(ArrowHead). `seq`'s convolutions and pooling are blind to where in the series a pattern sits, which is what a
gesture or an appliance's current wants and what these do not: on the quality panel `seq` reached a held-out RMSE
3x a ridge regression's on Tecator and lost to the mean on Covid3Month. So `seqflat` adds to `seq`'s outputs those
of an MLP with a linear path (`TabularMLP`, with dropout) over the whole series laid out flat, the way the
references read it:

- each series resampled to `trainer.series_points` points per channel (`resample`: unchanged when it has that many
  frames, linearly interpolated when fewer, each point the mean of its share of the frames when more), so the
  model takes any length, as every model must (the start-up probe, `predict`, an exported graph);
- those points twice, as they come (standardised per feature by the default packing: the level a fat content or a
  death rate follows) and z-scored within the series per channel (its shape: chemometrics' standard normal
  variate, which takes out the baseline shifts that make a spectrum's raw points nearly collinear), with each
  channel's level and scale (`asinh(mean)`, `log10(std)`), as `seq` has them.

Summed logits: each path learns what the other misses, and on the panel the sum was at least as good as the better
of the two alone on every series of one length (Tecator's RMSE 2.2-2.6 against ridge's 2.65; BasicMotions,
gestures, 0.95 where the flat path alone reached 0.77). Series of varying length keep `seq`: there a position
means different things in different samples (resampled, PLAID lost 2 to 8 points of accuracy).

How strongly the whole-series path is regularised is chosen from the data, unless `trainer.dropout` is set. Which
dropout a set wants does not follow from its shape: Tecator's 172 spectra want 0.5 (held-out RMSE 1.5 against 2.6
at 0.05), 160 series whose target is the difference of two positions want 0.05 (0.30x the mean's RMSE, 0.79x at
0.5: input dropout acts as a ridge penalty). So the MLP is one head per dropout of `WHOLE_DROPOUTS`, trained side
by side, each on its own loss; about one sample in eight (`HOLDOUT_SHARE`, chosen by its bytes, so a
replayed sample is always or never one of them) is trained on by none and scores each head without dropout, and
the model outputs the head whose recent score is lowest. `seq` learns beside the chosen head alone: trained on
every head's residuals it drifts toward fitting what the weakest leaves, and every head carries that drift (the
positions set: 0.53x the mean's RMSE instead of 0.3x). The choice is a buffer, so it travels with the weights;
a published version records it and the scores in its metrics.

What no MLP head does is hold a weak linear signal: on 160 series whose target the series explain by a few percent
of its variance every dropout fits noise (held-out RMSE 1.15 against the mean's 1.05). So for an objective with a
least-squares target (regression, forecast) a third candidate is a line fitted in closed form to the same features
(`RidgeHead`: ridge regression, its penalty chosen by GCV, fitted to the samples the heads train on, every rank's),
scored on the same held-out samples. It wins there (1.04), where the target is a line in the series (0.07x the
mean's RMSE, 0.2x for the best MLP head) and on Tecator (held-out RMSE 1.3-1.4 against 1.4-2.5: the z-scored copy
of each spectrum is what chemometrics regresses on), and a step that trains it alone costs next to nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import nn

from streamtrain.objectives import Objective

from .batching import PackedBatch
from .choosing import (
    HOLDOUT_SHARE,
    MIN_SCORED,
    RIDGE_RATIO,
    SCORE_WINDOW,
    SETTLE_SCORED,
    SETTLE_STEPS,
    SWITCH_RATIO,
    HeldOutChoice,
    WithLoss,
)
from .conv import segment_mean
from .ridge import RidgeHead
from .sequence import MIN_STD, SequenceClassifier
from .tabular import TabularMLP

__all__ = ["HOLDOUT_SHARE", "MIN_SCORED", "RIDGE_RATIO", "SCORE_WINDOW", "SETTLE_SCORED", "SETTLE_STEPS",
           "SWITCH_RATIO", "WHOLE_DROPOUT", "WHOLE_DROPOUTS", "WHOLE_LAYERS", "WholeSeriesNet", "resample",
           "whole_series_features"]

#: The whole-series MLP's dropouts when `trainer.dropout` is unset: one head at each, trained side by side and
#: scored on samples no head trains on. Which one a set wants is not to be read from its shape: Tecator's RMSE is 1.5
#: at 0.5 against 2.6 at 0.05, and on the panel 0.5 held BasicMotions at 0.93-0.96 where 0.2 let it fall to 0.85; a
#: target read from two positions of 24 wants 0.05 (0.2x the mean's RMSE, 0.79x at 0.5). A third head at 0.2 won
#: nothing on the panel or on that set and costs every step its compute.
WHOLE_DROPOUTS = (0.05, 0.5)
#: The head it predicts with until `MIN_SCORED` held-out samples have been scored.
WHOLE_DROPOUT = 0.5
#: Hidden layers of the whole-series MLP (`trainer.num_layers` is `seq`'s blocks).
WHOLE_LAYERS = 2


def resample(values: torch.Tensor, cu_seqlens: torch.Tensor, lengths: torch.Tensor, points: int) -> torch.Tensor:
    """Every packed series on `points` evenly spaced points per channel: (n, points, F).

    A series of `points` frames comes out unchanged; a shorter one is linearly interpolated (one of one frame is that
    frame repeated); a longer one gives, for each point, the mean of the frames of its share of the series
    (`points` equal bins), so no frame is skipped.

    Args:
        values: (N, F) packed frames.
        cu_seqlens: (n + 1,) cumulative lengths.
        lengths: (n,) frames per series, each at least 1.
        points: Points per series (at least 1).
    """
    n, features = lengths.shape[0], values.shape[1]
    dtype, device = values.dtype, values.device
    grid = torch.arange(points, device=device, dtype=dtype).unsqueeze(0)
    last = (lengths - 1).clamp_min(0).unsqueeze(1)
    where = grid * last.to(dtype) / max(points - 1, 1)
    below = where.floor().to(torch.int64)
    weight = (where - below.to(dtype)).unsqueeze(2)
    start = cu_seqlens[:-1].unsqueeze(1)
    interpolated = values[start + below] * (1 - weight) + values[start + torch.minimum(below + 1, last)] * weight
    segment = torch.repeat_interleave(torch.arange(n, device=device), lengths, output_size=values.shape[0])
    within = torch.arange(values.shape[0], device=device) - cu_seqlens[:-1][segment]
    bins = segment * points + within * points // lengths[segment].clamp_min(1)
    sums = values.new_zeros(n * points, features).index_add_(0, bins, values)
    counts = values.new_zeros(n * points).index_add_(0, bins, torch.ones_like(values[:, 0]))
    binned = (sums / counts.clamp_min(1).unsqueeze(1)).view(n, points, features)
    return torch.where((lengths > points).view(n, 1, 1), binned, interpolated)


def whole_series_features(batch: PackedBatch, points: int) -> torch.Tensor:
    """(n, 2·F·points + 2·F): each series resampled (`resample`), as it comes and z-scored by its own mean and standard
    deviation per channel (those of its frames, as `seq` takes them: a constant series, one frame included, comes out
    exactly 0), with each channel's `asinh(mean)` and `log10(std)`."""
    grid = resample(batch.values, batch.cu_seqlens, batch.lengths, points)
    seg, lengths = batch.segment_ids, batch.lengths
    mean = segment_mean(batch.values, seg, lengths)
    centred = batch.values - mean[seg]
    std = segment_mean(centred * centred, seg, lengths).sqrt().clamp_min(MIN_STD)
    z = (grid - mean.unsqueeze(1)) / std.unsqueeze(1)
    return torch.cat([grid.flatten(1), z.flatten(1), torch.asinh(mean), torch.log10(std)], dim=1)


class WholeSeriesNet(HeldOutChoice):
    """`seq` (`SequenceClassifier`) plus an MLP with a linear path over `whole_series_features`; outputs summed.

    With several dropouts (and the objective, whose losses train and score them), the whole-series MLP is one head
    per dropout: the first (at `WHOLE_DROPOUT`) with `seq`, as the model is with one, the others alone, each
    trained on its own loss over the batch's samples but those held out; for an objective with a least-squares
    target (`Objective.fitting_target`) and features few enough (`MAX_RIDGE_WIDTH`), a ridge line fitted in closed
    form to the same samples (`RidgeHead`) is the last candidate. How the model chooses among them on held-out
    samples, and settles, is `HeldOutChoice`'s. Settled on the line, no weight trains.

    Args:
        num_features: Channels per frame (F).
        num_outputs: Outputs per series.
        hidden_size: Channels of `seq` and width of the MLP's hidden layers.
        num_layers: `seq`'s conv blocks (the MLP has `WHOLE_LAYERS`).
        kernel_size: `seq`'s temporal kernel width.
        points: Points per channel the whole-series path resamples each series to (`trainer.series_points`).
        dropout: The whole-series MLP's dropout in training (`trainer.dropout`), or one per head.
        length_buckets: `seq`'s padded lengths per power of two.
        last_state: `seq` pools each series' last frame too (`forecast`).
        objective: What the heads' losses are (needed by more than one head).
    """

    def __init__(self, num_features: int, num_outputs: int, hidden_size: int = 64, num_layers: int = 2,
                 kernel_size: int = 5, points: int = 64, dropout: float | Sequence[float] = WHOLE_DROPOUT,
                 length_buckets: int = 8, last_state: bool = False, objective: Objective | None = None) -> None:
        super().__init__()
        self.points = points
        self.seq = SequenceClassifier(num_features, num_outputs, hidden_size, num_layers, kernel_size,
                                      length_buckets=length_buckets, last_state=last_state)
        width = 2 * num_features * (points + 1)
        self.last_state = last_state
        dropouts = (dropout,) if isinstance(dropout, float | int) else tuple(dropout)
        self.dropouts = dropouts
        self.ridge: RidgeHead | None = None
        if len(dropouts) == 1:
            self.whole: nn.Module = TabularMLP(width, num_outputs, hidden_size, WHOLE_LAYERS, dropouts[0])
            return
        if objective is None:
            raise ValueError("a WholeSeriesNet with several dropouts needs the objective its heads train on")
        self.whole = nn.ModuleList(TabularMLP(width, num_outputs, hidden_size, WHOLE_LAYERS, d) for d in dropouts)
        first = dropouts.index(WHOLE_DROPOUT) if WHOLE_DROPOUT in dropouts else len(dropouts) - 1
        self._init_choice(objective, first, len(dropouts), width, num_outputs)

    @property
    def heads(self) -> list[TabularMLP]:
        """The whole-series MLPs, one per dropout."""
        if isinstance(self.whole, TabularMLP):
            return [self.whole]
        return cast(list[TabularMLP], list(cast(nn.ModuleList, self.whole)))

    @property
    def chosen_dropout(self) -> float | None:
        """The dropout of the MLP head the model outputs (None: it outputs the ridge line)."""
        if len(self.dropouts) == 1:
            return self.dropouts[0]
        return None if self.chosen_ridge else self.dropouts[int(self.choice.argmax())]

    def held_out_scores(self) -> dict[float | str, float | None]:
        """Each head's mean loss over the held-out samples of the window, by dropout and "ridge" (None: none scored
        yet)."""
        if len(self.dropouts) == 1:
            return dict.fromkeys(self.dropouts)
        return self.candidate_scores(list(self.dropouts))

    def version_metrics(self) -> dict[str, float]:
        """What a published version records of the choice (`metrics` in its model.json): the chosen MLP head's
        dropout (`seqflat_dropout`) or the ridge line's penalty (`seqflat_ridge_penalty`, with `seqflat_ridge` 1), and
        each candidate's held-out score; nothing with one head."""
        if len(self.dropouts) == 1:
            return {}
        scores = {f"seqflat_holdout_loss_{d:g}" if isinstance(d, float) else f"seqflat_holdout_loss_{d}": s
                  for d, s in self.held_out_scores().items() if s is not None}
        chosen = self.chosen_dropout
        return {**({"seqflat_dropout": chosen} if chosen is not None else self._ridge_metrics("seqflat")),
                "seqflat_with_seq": float(self.choice[self.first]), "seqflat_holdout_scored": float(self.scored),
                **scores}

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """Outputs of shape (batch.num_samples, num_outputs); an empty batch gives (0, num_outputs)."""
        features = whole_series_features(batch, self.points)
        if isinstance(self.whole, TabularMLP):
            return self.seq(batch) + self.whole.outputs(features)
        settled = self._settled_choice()
        if settled is not None:
            return self._settled_outputs(batch, features, settled)
        line = [self.ridge.outputs(features)] if self.ridge is not None else []  # the last candidate's outputs
        if not self.training:  # every head, weighted by the one-hot choice: an exported graph takes no branch
            heads = torch.stack([*(head.outputs(features) for head in self.heads), *line])
            return self.choice[self.first] * self.seq(batch) + torch.einsum("k,kno->no", self.choice, heads)
        # The first head is `seq` with the 0.5 MLP (the model as it was before heads were chosen), the others the MLP
        # alone: none trains on the held-out samples, and each on its own loss.
        base = self.seq(batch)
        choice = self.choice.clone()  # the choice of this step (`_score` updates it)
        outputs = [base + head.outputs(features) if k == self.first else head.outputs(features)
                   for k, head in enumerate(self.heads)]
        held = self._held_out(batch)
        train = outputs[0].new_ones(batch.num_samples) if held is None else (~held).to(base.dtype)
        n = max(batch.num_samples, 1)
        loss = torch.stack([(self.objective.losses(out, batch) * train).sum() for out in outputs]).sum() / n
        if held is not None:
            with torch.no_grad():
                plain = [base * float(k == self.first) + head.outputs(features, drop=False)
                         for k, head in enumerate(self.heads)]
            self._score([*plain, *line], held, batch)
        self._fit_line(features, batch, None if held is None else ~held)  # the samples the heads train on
        chosen = torch.einsum("k,kno->no", choice, torch.stack([*outputs, *line]).detach())
        return WithLoss.apply(chosen, loss)

    def _settled_outputs(self, batch: PackedBatch, features: torch.Tensor, index: int) -> torch.Tensor:
        """Candidate `index` (an MLP head, with `seq` for the first; the ridge line, fitted to every sample) trained
        alone, as any model trains: the settled choice."""
        if self.ridge is not None and index == self.trained:
            self._fit_line(features, batch)
            return self._alone(index, list, self.ridge.outputs(features))
        outputs = self.heads[index].outputs(features)
        if index == self.first:
            outputs = outputs + self.seq(batch)
        return self._alone(index, lambda: [*self.heads[index].parameters(),
                                           *(self.seq.parameters() if index == self.first else ())], outputs)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        """A version saved with one whole-series MLP (before heads were chosen) loads as the choice of its dropout;
        one saved before the ridge line, with the head it chose."""
        old = [key for key in state_dict if key.startswith(prefix + "whole.") and not key[len(prefix) + 6].isdigit()]
        if isinstance(self.whole, nn.ModuleList):
            first = int(self.choice.argmax())
            for key in old:
                state_dict[f"{prefix}whole.{first}.{key[len(prefix) + 6:]}"] = state_dict.pop(key)
            if old:
                for index, head in enumerate(self.heads):
                    if index != first:
                        for name, value in head.state_dict().items():
                            state_dict.setdefault(f"{prefix}whole.{index}.{name}", value)
            self._choice_defaults(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args)
