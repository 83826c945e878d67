"""A linear head fitted in closed form: ridge regression on running sums, its penalty chosen by generalised
cross-validation (GCV).

Steps of gradient descent do not hold a weak linear signal: on series whose target they explain by a few percent
of its variance, every MLP head of `seqflat` fits noise (held-out RMSE 1.15 against the mean's 1.05), where ridge
regression with its penalty chosen by GCV reaches 1.04. So `seqflat` keeps this head beside its MLP heads, for an
objective with a least-squares target (`Objective.fitting_target`: regression, forecast), scored on the same
held-out samples: what it hands out does not lose to a line.

- The sums: those a least-squares fit needs (count, Σx, Σxxᵀ, Σy, Σxyᵀ, Σy²), in float64 on the features' device,
  of the samples the head is shown, each once. A dataset replayed pass after pass (as `up --dataset` streams one)
  would otherwise count a sample as often as it came, and GCV would take the copies for evidence and fit the
  noise. A sample is known by its draw (`PackedBatch.draws`), in a table of `SEEN_SLOTS`.
- The fit: at steps spaced geometrically (`REFIT_GROWTH` times as many steps each time, at most `REFIT_EVERY`
  apart), each feature standardised by the sums' mean and standard deviation (a constant one left out); the
  correlation matrix's eigenvectors give every penalty of `PENALTIES` at once, and the one of least GCV score is
  kept (the residual mean square over (1 - degrees of freedom / n)², the rotation-invariant approximation of the
  leave-one-out error; Golub, Heath and Wahba, 1979). scikit-learn's `RidgeCV` chooses the same.
- The state: the sums are not; the fitted `weight`, `bias`, `penalty` and `fitted` (samples fitted on) are buffers,
  so they travel with the model into checkpoints and versions. A fit from fewer samples than the loaded one (after a
  restart) does not replace it.
- A DDP group: every rank keeps the sums of its own samples apart, and the trainer's once-a-step call of
  `sum_over_ranks` adds them up over the ranks at the refit steps, so the group fits one line to every rank's
  samples, as one process would.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["MAX_RIDGE_WIDTH", "PENALTIES", "REFIT_EVERY", "REFIT_GROWTH", "SEEN_SLOTS", "RidgeHead"]

#: The widest input the head is kept for: its sums hold width² values, and a refit decomposes a matrix that wide
#: (1024: 8 MiB of sums, a refit of ~0.2 s on a CPU core).
MAX_RIDGE_WIDTH = 1024
#: Penalties tried at every refit, as multiples of the correlation matrix's mean eigenvalue (1).
PENALTIES = torch.logspace(-9, 4, 66, dtype=torch.float64)
#: Steps between refits grow by this factor (the first steps refit at every step, the fit changes most then).
REFIT_GROWTH = 1.25
#: The most steps between refits.
REFIT_EVERY = 50
#: Slots of the table of draws the head has seen (one byte each): two samples in one slot count once, so past a few
#: million samples fewer and fewer new ones are added.
SEEN_SLOTS = 1 << 22


class RidgeHead(nn.Module):
    """`features @ weight.T + bias`, fitted by `observe` to the targets it is shown, never by a gradient.

    Alone, the samples `observe` is shown go straight into the sums. In a DDP group each rank keeps those of its own
    samples apart, and `sum_over_ranks` (which the trainer calls on every rank once a step, after the optimizer's
    step) adds every rank's into every rank's sums at the refit steps, with one all-reduce: a group fits one line to
    all the ranks' samples, as one process would.

    Args:
        width: Input features.
        num_outputs: Outputs (the least-squares target's width).
    """

    weight: torch.Tensor
    bias: torch.Tensor
    penalty: torch.Tensor
    fitted: torch.Tensor

    def __init__(self, width: int, num_outputs: int) -> None:
        super().__init__()
        self.register_buffer("weight", torch.zeros(num_outputs, width))
        self.register_buffer("bias", torch.zeros(num_outputs))
        self.register_buffer("penalty", torch.zeros(()))  # the penalty of the fit, a multiple of `PENALTIES`' unit
        self.register_buffer("fitted", torch.zeros(()))  # samples the fit was made from
        self._sums: list[torch.Tensor] | None = None  # (count, Σx, Σxxᵀ, Σy, Σxyᵀ, Σy²) of the fit's samples
        self._own: list[torch.Tensor] | None = None  # this rank's, not yet summed over the ranks
        self._seen: torch.Tensor | None = None
        self._active = True
        self._calls, self._refit_at = 0, 1

    def outputs(self, features: torch.Tensor) -> torch.Tensor:
        """The fitted line's outputs (N, num_outputs); no gradient flows through them."""
        return torch.addmm(self.bias.to(features.dtype), features, self.weight.to(features.dtype).t())

    def forget(self) -> None:
        """Drop the sums and stop fitting (the fit stays): the head is no longer a candidate. In a group
        `sum_over_ranks` goes on taking part in the all-reduces (with nothing to add), so that a rank that forgets
        a step before another does not leave it waiting."""
        self._sums = self._own = self._seen = None
        self._active = False

    def _zeros(self, like: torch.Tensor) -> list[torch.Tensor]:
        width, outputs = self.weight.shape[1], self.weight.shape[0]
        return [like.new_zeros(()), like.new_zeros(width), like.new_zeros(width, width), like.new_zeros(outputs),
                like.new_zeros(width, outputs), like.new_zeros(outputs)]

    @torch.no_grad()
    def observe(self, features: torch.Tensor, targets: torch.Tensor, keep: torch.Tensor | None = None,
                draws: torch.Tensor | None = None) -> None:
        """Add the samples `keep` marks (all when None) to this rank's sums, those of `draws` seen before and any
        with a value not finite left out; alone, refit when it is time. No host sync but the refit's own.

        Args:
            features: (N, width) inputs.
            targets: (N, num_outputs) what the outputs are fitted to.
            keep: (N,) bool, the samples to add.
            draws: (N,) each sample's draw in [0, 1) (`PackedBatch.draws`); None: every sample is new.
        """
        if not self._active:
            return
        x, y = features.to(torch.float64), targets.to(torch.float64)
        finite = torch.isfinite(x).all(1) & torch.isfinite(y).all(1)
        keep = finite if keep is None else keep & finite
        if draws is not None:
            if self._seen is None:
                self._seen = torch.zeros(SEEN_SLOTS, dtype=torch.uint8, device=draws.device)
            slots = (draws.to(torch.float64) * SEEN_SLOTS).long().clamp(0, SEEN_SLOTS - 1)
            ordered, order = slots.sort()
            again = torch.cat([ordered.new_zeros(1, dtype=torch.bool), ordered[1:] == ordered[:-1]])
            seen = self._seen[slots].bool() | torch.empty_like(again).scatter_(0, order, again)  # or once before
            keep = keep & ~seen
            # Only the samples added are marked: one left out now (held out) may come in later.
            self._seen.scatter_reduce_(0, slots, keep.to(torch.uint8), reduce="amax")
        mask = keep.unsqueeze(1)
        x, y = torch.where(mask, x, 0.0), torch.where(mask, y, 0.0)
        grouped = _grouped()
        if grouped and self._own is None:
            self._own = self._zeros(x)
        elif not grouped and self._sums is None:
            self._sums = self._zeros(x)
        n, sx, sxx, sy, sxy, syy = self._own if grouped else self._sums  # type: ignore[misc]
        n.add_(keep.sum())
        sx.add_(x.sum(0))
        sxx.addmm_(x.t(), x)
        sy.add_(y.sum(0))
        sxy.addmm_(x.t(), y)
        syy.add_((y * y).sum(0))
        if not grouped:
            self._merge(None)

    @torch.no_grad()
    def sum_over_ranks(self, reduce: Callable[[torch.Tensor], None]) -> None:
        """In a DDP group, on every rank once a step: at the refit steps, sum the ranks' own sums with `reduce` (an
        in-place all-reduce) into every rank's, and refit. Alone: nothing (`observe` has added them)."""
        if _grouped():
            self._merge(reduce)

    def _merge(self, reduce: Callable[[torch.Tensor], None] | None) -> None:
        self._calls += 1
        if self._calls < self._refit_at:
            return
        self._refit_at = self._calls + min(REFIT_EVERY, max(1, int(self._calls * (REFIT_GROWTH - 1))))
        if reduce is not None:  # the ranks' own sums, in one all-reduce, into every rank's
            own = self._own if self._own is not None else self._zeros(self.weight.to(torch.float64))
            flat = torch.cat([part.flatten() for part in own])
            reduce(flat)
            own = [piece.view_as(part) for piece, part in zip(flat.split([p.numel() for p in own]), own,
                                                               strict=True)]
            self._own = None
            if self._active:
                self._sums = own if self._sums is None else [a + b for a, b in zip(self._sums, own, strict=True)]
        if self._active:
            self.refit()

    @torch.no_grad()
    def refit(self) -> None:
        """Fit `weight` and `bias` to the sums, at the penalty of least GCV score."""
        if self._sums is None:
            return
        n, sx, sxx, sy, sxy, syy = self._sums
        count = float(n)
        if count < 2 or count < float(self.fitted):
            return
        mean_x, mean_y = sx / count, sy / count
        cov = sxx / count - torch.outer(mean_x, mean_x)
        std = cov.diagonal().clamp_min(0).sqrt()
        live = std > 1e-6 * std.max().clamp_min(1e-30)  # a constant feature carries nothing: left out
        inverse = torch.where(live, 1.0 / std.clamp_min(1e-30), 0.0)
        corr = cov * torch.outer(inverse, inverse)
        cross = (sxy / count - torch.outer(mean_x, mean_y)) * inverse.unsqueeze(1)
        variance = syy / count - mean_y * mean_y
        eigenvalues, vectors = torch.linalg.eigh(corr)
        eigenvalues = eigenvalues.clamp_min(0)
        rotated = vectors.t() @ cross  # (width, outputs)
        penalties = PENALTIES.to(corr.device)  # the live features' mean eigenvalue is 1
        shrink = 1.0 / (eigenvalues.unsqueeze(0) + penalties.unsqueeze(1))  # (penalties, width)
        explained = ((2 * shrink - eigenvalues * shrink * shrink).unsqueeze(2) * (rotated * rotated).unsqueeze(0))
        residual = (variance.unsqueeze(0) - explained.sum(1)).clamp_min(0).sum(1)  # mean square, summed over outputs
        freedom = (eigenvalues * shrink).sum(1) + 1  # the intercept's too
        gcv = residual / (1 - freedom / count).clamp_min(1e-6) ** 2
        best = int(gcv.argmin())
        coefficients = vectors @ (shrink[best].unsqueeze(1) * rotated) * inverse.unsqueeze(1)  # (width, outputs)
        self.weight.copy_(coefficients.t())
        self.bias.copy_(mean_y - mean_x @ coefficients)
        self.penalty.fill_(float(PENALTIES[best]))
        self.fitted.fill_(count)


def _grouped() -> bool:
    """Whether this process trains in a group of more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
