"""How a built-in model chooses among candidate heads on samples none of them trains on: `HeldOutChoice`.

`seqflat` (`streamtrain.models.whole`) chooses among its whole-series MLP heads and a ridge line, `mlp`
(`streamtrain.models.tabular`) between its MLP and a ridge line, the same way:

- about one sample in eight (`HOLDOUT_SHARE`, by its draw, `PackedBatch.draws`: a sample replayed pass after pass
  is always or never one of them) is trained on by no head; each candidate's loss without dropout on those is kept
  as an exponentially weighted mean over the last `SCORE_WINDOW`;
- from `MIN_SCORED` on, the model outputs the first head, unless another gradient-trained head scores under
  `SWITCH_RATIO` of its score, and the ridge line (`RidgeHead`, the last candidate, for an objective with a
  least-squares target) over either when it scores under `RIDGE_RATIO` of that head's (`choice`, one-hot, a buffer:
  it travels with the weights into every checkpoint and version);
- once `SETTLE_SCORED` samples have been scored, over at least `SETTLE_STEPS` steps, the choice is settled: the
  chosen candidate trains on every sample, alone; the ridge line, not chosen, forgets its sums.

In a DDP group rank 0's device alone holds samples out and scores: DDP hands rank 0's buffers to the others before
each forward, so theirs would not count, and they train every head on all their samples. Rank 0 holds out N times
`HOLDOUT_SHARE` of its samples in a group of N (at most half), so the run's share held out, and the pace at which
the choice is made, do not change with N. The ridge line sums every rank's samples (`sum_over_ranks`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from streamtrain.objectives import Objective

from .batching import PackedBatch
from .ridge import MAX_RIDGE_WIDTH, RidgeHead

__all__ = ["CHOICE_BUFFERS", "HOLDOUT_SHARE", "MIN_SCORED", "RIDGE_RATIO", "SCORE_WINDOW", "SETTLE_SCORED",
           "SETTLE_STEPS", "SWITCH_RATIO", "HeldOutChoice", "WithLoss"]

#: The share of the samples held out to score the heads on while the choice is open (`PackedBatch.draws` below it).
#: All on rank 0: in a group of N ranks it holds out N times this share of its own (at most half).
HOLDOUT_SHARE = 1 / 8
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
#: Another gradient-trained head replaces the first only when its held-out loss is under this share of the first's.
#: A few dozen held-out samples tell a large difference from a small one, not a small one's sign, and a head of less
#: dropout learns faster: when the choice settled on Tecator (4 seeds), `seqflat`'s 0.05 and 0.2 heads scored 0.49x
#: to 0.67x the first's, and at 0.49x the 0.05 head's test RMSE was 1.6x the first's; on the positions set (2 seeds)
#: they scored 0.11x to 0.18x.
SWITCH_RATIO = 0.3
#: The ridge line (`RidgeHead`) replaces the gradient-trained head chosen when its held-out loss is under this share
#: of that head's. At 1 (the lower score wins): unlike a lighter MLP head, the line does not learn faster than the
#: first head early on (it is fitted in closed form from the first step), so a lower score is no head start. Where it
#: won when `seqflat`'s choice settled it won by far (Tecator: 0.06x-0.09x the best MLP head's score, 6 runs; the
#: line-in-the-series set: 0.06x-0.15x) or held the signal the MLP heads lost (the low-signal set: 0.89x-0.95x); on
#: Covid3Month (0.75x-0.87x, 3 seeds) its test RMSE was 0.0424 against 0.040 for the 0.5 head alone (the mean's:
#: 0.0447).
RIDGE_RATIO = 1.0
#: The buffers of the choice, beside the heads' weights.
CHOICE_BUFFERS = ("choice", "held_loss", "held_weight", "scored", "steps")


class WithLoss(torch.autograd.Function):
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


class HeldOutChoice(nn.Module):
    """The choice among a model's candidate heads (the module docstring): its buffers and its rules. A model
    subclasses it, calls `_init_choice` once its heads exist, and in training while `_choosing()` passes each
    candidate's outputs without dropout to `_score` and the ridge line its samples through `_fit_line`.

    Attributes:
        choice: (candidates,) one-hot, the candidate the model outputs.
        held_loss / held_weight: each candidate's weighted sum of held-out losses, and their weight.
        scored: held-out samples scored in all; steps: steps trained while choosing.
        ridge: the ridge line (the last candidate), or None.
    """

    choice: torch.Tensor
    held_loss: torch.Tensor
    held_weight: torch.Tensor
    scored: torch.Tensor
    steps: torch.Tensor

    def _init_choice(self, objective: Objective, first: int, trained: int, width: int, num_outputs: int) -> None:
        """Register the choice's buffers and the ridge line.

        Args:
            objective: What the heads' losses are.
            first: The candidate output until the scores say otherwise.
            trained: Candidates trained by gradient (the ridge line comes after them).
            width: Input features of the ridge line.
            num_outputs: Outputs per sample.
        """
        self.objective, self.first, self.trained = objective, first, trained
        closed_form = getattr(objective, "fits_in_closed_form", False)  # an objective not an `Objective`: none
        self.ridge = RidgeHead(width, num_outputs) if closed_form and width <= MAX_RIDGE_WIDTH else None
        candidates = trained + (self.ridge is not None)
        self.register_buffer("choice", nn.functional.one_hot(torch.tensor(first), candidates).float())
        self.register_buffer("held_loss", torch.zeros(candidates))
        self.register_buffer("held_weight", torch.zeros(()))
        self.register_buffer("scored", torch.zeros(()))
        self.register_buffer("steps", torch.zeros(()))
        self._settled, self._calls = False, 0
        self._rank: int | None = None  # this process's rank in the group, read at the first step
        self._share = HOLDOUT_SHARE  # the share of its samples rank 0 holds out (`_scores_here`)
        self._chosen: int | None = None  # the settled choice, read once from `choice`
        self._idle: dict[int, list[nn.Parameter]] = {}  # the weights a candidate trained alone leaves idle

    @property
    def chosen_ridge(self) -> bool:
        """Whether the model outputs the ridge line."""
        return self.ridge is not None and int(self.choice.argmax()) == self.trained

    def candidate_scores(self, names: list[Any]) -> dict[Any, float | None]:
        """Each candidate's mean loss over the held-out samples of the window, by `names` (the gradient-trained
        heads') and "ridge" (None: none scored yet)."""
        names = [*names, *(["ridge"] if self.ridge is not None else [])]
        if float(self.held_weight) <= 0:
            return dict.fromkeys(names)
        return dict(zip(names, (self.held_loss / self.held_weight).tolist(), strict=True))

    def _ridge_metrics(self, prefix: str) -> dict[str, float]:
        """The ridge line's figures a version records when it is chosen (`<prefix>_ridge` ...)."""
        if self.ridge is None or not self.chosen_ridge:
            return {}
        return {f"{prefix}_ridge": 1.0, f"{prefix}_ridge_penalty": float(self.ridge.penalty),
                f"{prefix}_ridge_fitted": float(self.ridge.fitted)}

    def _settled_choice(self) -> int | None:
        """In training: the settled choice (read once), or None while choosing."""
        if not self.training or self._choosing():
            return None
        if self._chosen is None:
            self._chosen = int(self.choice.argmax())
        return self._chosen

    def _held_out(self, batch: PackedBatch) -> torch.Tensor | None:
        """Which of the batch's samples are held out (None: this process holds none out)."""
        return None if batch.draws is None or not self._scores_here() else batch.draws < self._share

    def _alone(self, index: int, used: Callable[[], list[nn.Parameter]], outputs: torch.Tensor) -> torch.Tensor:
        """`outputs` of candidate `index`, trained alone (the settled choice): the weights it does not use (all but
        `used()`) get a zero gradient, which DDP expects for every parameter; the ridge line forgets its sums unless
        it is the one."""
        if self.ridge is not None and index != self.trained:
            self.ridge.forget()
        idle = self._idle.get(index)
        if idle is None:
            kept = set(used())
            idle = self._idle[index] = [p for p in self.parameters() if p not in kept]
        return outputs + 0.0 * torch.stack([p.sum() for p in idle]).sum() if idle else outputs

    def _fit_line(self, features: torch.Tensor, batch: PackedBatch, keep: torch.Tensor | None = None) -> None:
        """Show the ridge line the samples `keep` marks (all when None), on every rank."""
        target = self.objective.fitting_target(batch) if self.ridge is not None else None
        if self.ridge is not None and target is not None:
            self.ridge.observe(features, target, keep, batch.draws)

    def sum_over_ranks(self, reduce: Callable[[torch.Tensor], None]) -> None:
        """What the trainer calls on every rank once a step, after the optimizer's step: the ridge line sums the
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
    def _score(self, outputs: list[torch.Tensor], held: torch.Tensor, batch: PackedBatch) -> None:
        """Fold each candidate's losses on the batch's held-out samples (`outputs`: each candidate's without
        dropout, the ridge line's last) into its score, and once `MIN_SCORED` samples have been, choose (the module
        docstring's rule). On the device, with no host sync."""
        losses = torch.stack([self.objective.losses(out, batch) for out in outputs]).to(self.held_loss.dtype)
        count = held.to(losses.dtype).sum()
        kept = torch.pow(1.0 - 1.0 / SCORE_WINDOW, count)
        held_losses = torch.where(held, losses, 0.0).nan_to_num(nan=torch.inf)  # a head gone NaN is never chosen
        self.held_loss.mul_(kept).add_(held_losses.sum(1))
        self.held_weight.mul_(kept).add_(count)
        self.scored.add_(count)
        scores = self.held_loss.nan_to_num(nan=torch.inf)
        others = scores[:self.trained].clone()
        others[self.first] = torch.inf  # the other gradient-trained heads, against the first
        other = others.argmin()
        pick = torch.where(others[other] < SWITCH_RATIO * scores[self.first], other, self.first)
        if self.ridge is not None:
            pick = torch.where(scores[-1] < RIDGE_RATIO * scores[pick], self.trained, pick)
        best = nn.functional.one_hot(pick, scores.shape[0]).to(self.choice.dtype)
        self.choice.copy_(torch.where(self.held_weight >= MIN_SCORED, best, self.choice))

    def _choice_defaults(self, state_dict: dict[str, Any], prefix: str) -> None:
        """Fill in what a version saved before the choice's parts lacks: the buffers (as a new model has them, the
        first head chosen) and the ridge line (never chosen; a choice without it gets its place, zero)."""
        for name in CHOICE_BUFFERS:
            state_dict.setdefault(prefix + name, getattr(self, name))
        if self.ridge is not None and prefix + "ridge.weight" not in state_dict:
            for name, value in self.ridge.state_dict().items():
                state_dict[f"{prefix}ridge.{name}"] = value
            for name in ("choice", "held_loss"):
                saved = state_dict[prefix + name]
                if saved.shape[0] == self.trained:
                    state_dict[prefix + name] = torch.cat([saved, saved.new_zeros(1)])
        self._settled, self._chosen = False, None  # read again from the loaded `scored` and `choice`
