"""The moving average of the weights (`trainer.ema_decay`): its arithmetic, step by step, and its buffers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from streamtrain.trainer.averaging import WeightAverage


def test_the_average_folds_each_update_in_with_the_warmed_up_decay() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    average = WeightAverage(model, decay=0.9)
    expected = [p.detach().clone() for p in model.parameters()]
    for n in range(1, 30):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        model(torch.randn(8, 3))  # training mode: the batch norm's running statistics move
        average.update(model)
        kept = min(0.9, (1 + n) / (10 + n))  # the warm-up, then the decay
        expected = [kept * e + (1 - kept) * p.detach() for e, p in zip(expected, model.parameters(), strict=True)]
    for got, want in zip(average.module.parameters(), expected, strict=True):
        torch.testing.assert_close(got, want)
    for got, live in zip(average.module.buffers(), model.buffers(), strict=True):
        assert torch.equal(got, live)  # buffers are copied as they are, not averaged
    assert not any(p.requires_grad for p in average.module.parameters())


def test_a_model_of_another_shape_is_refused() -> None:
    average = WeightAverage(nn.Linear(3, 2), decay=0.9)
    with pytest.raises(ValueError, match="the model has 4 parameter tensors, its average 2"):
        average.update(nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2)))
