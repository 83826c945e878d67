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

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from streamtrain.objectives import Objective

from .batching import PackedBatch
from .conv import segment_mean
from .ridge import MAX_RIDGE_WIDTH, RidgeHead
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
#: The share of the samples held out to score the heads on while the choice is open (`PackedBatch.draws` below it).
#: All on rank 0: in a group of N ranks it holds out N times this share of its own (at most half).
HOLDOUT_SHARE = 1 / 8
#: The head it predicts with until `MIN_SCORED` held-out samples have been scored.
WHOLE_DROPOUT = 0.5
#: Held-out samples the heads' scores average over (an exponential window: recent weights count, early ones fade).
SCORE_WINDOW = 100
#: Held-out samples scored before the model chooses by them.
MIN_SCORED = 32
#: Held-out samples scored (in all) after which the choice is settled: the chosen head then trains alone, on every
#: sample, as a model chosen on a validation set is refitted on all the data (Tecator's 172 spectra without the 16
#: held out: test RMSE 1.80 against 1.48-1.57 after 300 steps).
SETTLE_SCORED = 256
#: Steps trained while choosing before the choice may settle: held-out samples are scored at the pace of the batches
#: (a run of 60 samples a rank a step scored 256 in 18 steps, when no head had learned yet), the heads learn at the
#: pace of the steps.
SETTLE_STEPS = 100
#: Another head replaces the first (`seq` with the 0.5 head) only when its held-out loss is under this share of the
#: first's. A few dozen held-out samples tell a large difference from a small one, not a small one's sign, and a head
#: of less dropout learns faster: when the choice settled on Tecator (4 seeds), the 0.05 and 0.2 heads scored 0.49x
#: to 0.67x the first's, and at 0.49x the 0.05 head's test RMSE was 1.6x the first's; on the positions set (2 seeds)
#: they scored 0.11x to 0.18x.
SWITCH_RATIO = 0.3
#: The ridge head (`RidgeHead`) replaces the MLP head chosen when its held-out loss is under this share of that
#: head's. At 1 (the lower score wins): unlike a lighter MLP head, the line does not learn faster than the first
#: head early on (it is fitted in closed form from the first step), so a lower score is no head start. Where it won
#: when the choice settled it won by far (Tecator: 0.06x-0.09x the best MLP head's score, 6 runs; the line-in-the-
#: series set: 0.06x-0.15x) or held the signal the MLP heads lost (the low-signal set: 0.89x-0.95x); on Covid3Month
#: (0.75x-0.87x, 3 seeds) its test RMSE was 0.0424 against 0.040 for the 0.5 head alone (the mean's: 0.0447).
RIDGE_RATIO = 1.0
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


class _WithLoss(torch.autograd.Function):
    """`outputs` as they are, with `loss` added to the loss that backward starts from: the heads train on losses of
    their own through a forward that returns one output (how Megatron-LM adds its MoE auxiliary losses). Its gradient
    is `loss`'s alone: `outputs` come in detached."""

    @staticmethod
    def forward(ctx: Any, outputs: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        ctx.loss_shape = loss.shape
        return outputs.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        return None, grad.new_ones(ctx.loss_shape)


class WholeSeriesNet(nn.Module):
    """`seq` (`SequenceClassifier`) plus an MLP with a linear path over `whole_series_features`; outputs summed.

    With several dropouts (and the objective, whose losses train and score them), the whole-series MLP is one head
    per dropout: the first (at `WHOLE_DROPOUT`) with `seq`, as the model is with one, the others alone. Each trains
    on its own loss over the batch's samples but those held out (`draws` under `HOLDOUT_SHARE`); on those, each
    head's loss without dropout is kept as an exponentially weighted mean (`SCORE_WINDOW` samples). From
    `MIN_SCORED` on, the model outputs the first head unless another scores under `SWITCH_RATIO` of its score
    (`choice`, one-hot, a buffer: it travels with the weights into every checkpoint and version). Once
    `SETTLE_SCORED` samples have been scored, over at least `SETTLE_STEPS` steps, the choice is settled: the chosen
    head trains on every sample, alone. A batch without `draws` trains every head on every sample and changes no
    score. In a DDP group, rank 0's device alone holds samples out and scores: DDP hands rank 0's buffers to the
    others before each forward, so theirs would not count, and they train every head on all their samples. Rank 0
    holds out N times `HOLDOUT_SHARE` of its samples in a group of N (at most half), so the run's share held out,
    and the pace at which the choice is made, do not change with N.

    With an objective that has a least-squares target (`Objective.fitting_target`) and features few enough
    (`MAX_RIDGE_WIDTH`), the last candidate is `ridge`, a line fitted in closed form (`RidgeHead`) to every rank's
    samples but the held-out ones (the trainer calls `sum_over_ranks` once a step). It is chosen over the MLP head
    the rule above picks when its score is under `RIDGE_RATIO` of that head's; once settled on it, no weight trains
    and the line goes on fitting to every sample.

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

    choice: torch.Tensor
    held_loss: torch.Tensor
    held_weight: torch.Tensor
    scored: torch.Tensor
    steps: torch.Tensor

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
        self.objective = objective
        self.whole = nn.ModuleList(TabularMLP(width, num_outputs, hidden_size, WHOLE_LAYERS, d) for d in dropouts)
        first = dropouts.index(WHOLE_DROPOUT) if WHOLE_DROPOUT in dropouts else len(dropouts) - 1
        self.first = first
        # A line fitted in closed form, for an objective with a least-squares target and features few enough.
        closed_form = getattr(objective, "fits_in_closed_form", False)  # an objective not an `Objective`: none
        if closed_form and width <= MAX_RIDGE_WIDTH:
            self.ridge = RidgeHead(width, num_outputs)
        candidates = len(dropouts) + (self.ridge is not None)  # the ridge head last
        self.register_buffer("choice", nn.functional.one_hot(torch.tensor(first), candidates).float())
        self.register_buffer("held_loss", torch.zeros(candidates))
        self.register_buffer("held_weight", torch.zeros(()))
        self.register_buffer("scored", torch.zeros(()))
        self.register_buffer("steps", torch.zeros(()))  # steps trained while choosing
        self._settled, self._calls = False, 0
        self._rank: int | None = None  # this process's rank in the group, read at the first step
        self._share = HOLDOUT_SHARE  # the share of its samples rank 0 holds out (`_scores_here`)
        self._chosen: int | None = None  # the settled choice, read once from `choice`
        self._idle: dict[int, list[nn.Parameter]] = {}  # the weights a head trained alone leaves idle

    @property
    def heads(self) -> list[TabularMLP]:
        """The whole-series MLPs, one per dropout."""
        if isinstance(self.whole, TabularMLP):
            return [self.whole]
        return cast(list[TabularMLP], list(cast(nn.ModuleList, self.whole)))

    @property
    def chosen_ridge(self) -> bool:
        """Whether the model outputs the ridge head."""
        return self.ridge is not None and int(self.choice.argmax()) == len(self.dropouts)

    @property
    def chosen_dropout(self) -> float | None:
        """The dropout of the MLP head the model outputs (None: it outputs the ridge head)."""
        if len(self.dropouts) == 1:
            return self.dropouts[0]
        return None if self.chosen_ridge else self.dropouts[int(self.choice.argmax())]

    def held_out_scores(self) -> dict[float | str, float | None]:
        """Each head's mean loss over the held-out samples of the window, by dropout and "ridge" (None: none scored
        yet)."""
        names: list[float | str] = [*self.dropouts, *(["ridge"] if self.ridge is not None else [])]
        if len(self.dropouts) == 1 or float(self.held_weight) <= 0:
            return dict.fromkeys(names)
        return dict(zip(names, (self.held_loss / self.held_weight).tolist(), strict=True))

    def version_metrics(self) -> dict[str, float]:
        """What a published version records of the choice (`metrics` in its model.json): the chosen MLP head's
        dropout (`seqflat_dropout`) or the ridge head's penalty (`seqflat_ridge_penalty`, with `seqflat_ridge` 1), and
        each head's held-out score; nothing with one head."""
        if len(self.dropouts) == 1:
            return {}
        scores = {f"seqflat_holdout_loss_{d:g}" if isinstance(d, float) else f"seqflat_holdout_loss_{d}": s
                  for d, s in self.held_out_scores().items() if s is not None}
        chosen = self.chosen_dropout
        head = {"seqflat_ridge": 1.0, "seqflat_ridge_penalty": float(self.ridge.penalty),
                "seqflat_ridge_fitted": float(self.ridge.fitted)} if self.ridge is not None and chosen is None else {}
        return {**({"seqflat_dropout": chosen} if chosen is not None else head),
                "seqflat_with_seq": float(self.choice[self.first]), "seqflat_holdout_scored": float(self.scored),
                **scores}

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """Outputs of shape (batch.num_samples, num_outputs); an empty batch gives (0, num_outputs)."""
        features = whole_series_features(batch, self.points)
        if isinstance(self.whole, TabularMLP):
            return self.seq(batch) + self.whole.outputs(features)
        if self.training and not self._choosing():
            if self._chosen is None:
                self._chosen = int(self.choice.argmax())
            return self._alone(batch, features, self._chosen)
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
        held = None if batch.draws is None or not self._scores_here() else batch.draws < self._share
        train = outputs[0].new_ones(batch.num_samples) if held is None else (~held).to(base.dtype)
        n = max(batch.num_samples, 1)
        loss = torch.stack([(self.objective.losses(out, batch) * train).sum() for out in outputs]).sum() / n
        if held is not None:
            self._score(base.detach(), features.detach(), line, held, batch)
        self._fit_line(features, batch, None if held is None else ~held)  # the samples the heads train on
        chosen = torch.einsum("k,kno->no", choice, torch.stack([*outputs, *line]).detach())
        return _WithLoss.apply(chosen, loss)

    def _alone(self, batch: PackedBatch, features: torch.Tensor, index: int) -> torch.Tensor:
        """Head `index` (with `seq`, for the first) trained on every sample, as any model trains: the settled choice.
        The ridge head (the last index) goes on fitting to every sample, or forgets its sums when another was
        chosen. The other weights get a zero gradient: DDP expects one for every parameter."""
        idle = self._idle.get(index)
        if idle is None:
            heads = self.heads
            used = {*(heads[index].parameters() if index < len(heads) else ()),
                    *(self.seq.parameters() if index == self.first else ())}
            idle = self._idle[index] = [p for p in self.parameters() if p not in used]
        if self.ridge is not None and index == len(self.dropouts):
            self._fit_line(features, batch)
            return self.ridge.outputs(features) + 0.0 * torch.stack([p.sum() for p in idle]).sum()
        if self.ridge is not None:
            self.ridge.forget()
        outputs = self.heads[index].outputs(features)
        if index == self.first:
            outputs = outputs + self.seq(batch)
        return outputs + 0.0 * torch.stack([p.sum() for p in idle]).sum() if idle else outputs

    def _fit_line(self, features: torch.Tensor, batch: PackedBatch, keep: torch.Tensor | None = None) -> None:
        """Show the ridge head the samples `keep` marks (all when None), on every rank."""
        target = self.objective.fitting_target(batch) if self.ridge is not None else None
        if self.ridge is not None and target is not None:
            self.ridge.observe(features, target, keep, batch.draws)

    def sum_over_ranks(self, reduce: Callable[[torch.Tensor], None]) -> None:
        """What the trainer calls on every rank once a step, after the optimizer's step: the ridge head sums the
        ranks' samples with `reduce` (an in-place all-reduce) at its refit steps (`RidgeHead.sum_over_ranks`)."""
        if self.ridge is not None:
            self.ridge.sum_over_ranks(reduce)

    def _scores_here(self) -> bool:
        """Whether this process scores the heads: alone, or as rank 0 of a group. DDP hands rank 0's buffers to every
        rank before each forward (as it does batch-norm statistics), so the others' scores would be overwritten:
        they train every head on every sample instead."""
        if self._rank is None:
            group = dist.is_available() and dist.is_initialized()
            self._rank = dist.get_rank() if group else 0
            # The whole run's share held out stays HOLDOUT_SHARE: rank 0 holds out that share of every rank's.
            self._share = min(0.5, HOLDOUT_SHARE * (dist.get_world_size() if group else 1))
        return self._rank == 0

    def _choosing(self) -> bool:
        """Whether fewer than `SETTLE_SCORED` held-out samples have been scored, or fewer than `SETTLE_STEPS` steps
        trained (counted here, while choosing): read from the buffers on the CPU, and every 16th step on a GPU (a
        host sync)."""
        if self._settled:
            return False
        self._calls += 1
        if self.scored.device.type == "cpu" or self._calls % 16 == 0:
            self._settled = float(self.scored) >= SETTLE_SCORED and float(self.steps) >= SETTLE_STEPS
        if not self._settled:
            self.steps.add_(1)
        return not self._settled

    @torch.no_grad()
    def _score(self, base: torch.Tensor, features: torch.Tensor, line: list[torch.Tensor], held: torch.Tensor,
               batch: PackedBatch) -> None:
        """Fold each head's losses without dropout on the batch's held-out samples into its score, and once
        `MIN_SCORED` samples have been, choose: the first head unless another MLP head's score is under
        `SWITCH_RATIO` of the first's, and the ridge head (`line`: its outputs, when there is one) over either when
        its score is under `RIDGE_RATIO` of that head's. On the device, with no host sync."""
        outputs = [*(base * float(k == self.first) + head.outputs(features, drop=False)
                     for k, head in enumerate(self.heads)), *line]
        losses = torch.stack([self.objective.losses(out, batch) for out in outputs]).to(self.held_loss.dtype)
        count = held.to(losses.dtype).sum()
        kept = torch.pow(1.0 - 1.0 / SCORE_WINDOW, count)
        held_losses = torch.where(held, losses, 0.0).nan_to_num(nan=torch.inf)  # a head gone NaN is never chosen
        self.held_loss.mul_(kept).add_(held_losses.sum(1))
        self.held_weight.mul_(kept).add_(count)
        self.scored.add_(count)
        scores = self.held_loss.nan_to_num(nan=torch.inf)
        others = scores[:len(self.dropouts)].clone()
        others[self.first] = torch.inf  # the lighter heads, against the first
        other = others.argmin()
        pick = torch.where(others[other] < SWITCH_RATIO * scores[self.first], other, self.first)
        if self.ridge is not None:
            pick = torch.where(scores[-1] < RIDGE_RATIO * scores[pick], len(self.dropouts), pick)
        best = nn.functional.one_hot(pick, scores.shape[0]).to(self.choice.dtype)
        self.choice.copy_(torch.where(self.held_weight >= MIN_SCORED, best, self.choice))

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        """A version saved with one whole-series MLP (before heads were chosen) loads as the choice of its dropout."""
        old = [key for key in state_dict if key.startswith(prefix + "whole.") and not key[len(prefix) + 6].isdigit()]
        if isinstance(self.whole, nn.ModuleList) and old:
            first = int(self.choice.argmax())
            for key in old:
                state_dict[f"{prefix}whole.{first}.{key[len(prefix) + 6:]}"] = state_dict.pop(key)
            for index, head in enumerate(self.heads):
                if index != first:
                    for name, value in head.state_dict().items():
                        state_dict.setdefault(f"{prefix}whole.{index}.{name}", value)
            for name in ("choice", "held_loss", "held_weight", "scored", "steps"):
                state_dict.setdefault(prefix + name, getattr(self, name))
        if self.ridge is not None and prefix + "ridge.weight" not in state_dict:  # saved before it: never chosen
            for name, value in self.ridge.state_dict().items():
                state_dict[f"{prefix}ridge.{name}"] = value
            for name in ("choice", "held_loss"):
                saved = state_dict.get(prefix + name)
                if saved is not None and saved.shape[0] == len(self.dropouts):
                    state_dict[prefix + name] = torch.cat([saved, saved.new_zeros(1)])
        super()._load_from_state_dict(state_dict, prefix, *args)
        self._settled, self._chosen = False, None  # read again from the loaded `scored` and `choice`
