"""The packed conv net: equal to per-sample unpadded convolution, isolated samples, empty batches, learns."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from streamtrain.config.trainer import TrainerConfig
from streamtrain.models.batching import PackedBatch, pack_samples
from streamtrain.models.conv import MaskedConv1d, PackedConvNet
from streamtrain.models.plugins import build_model
from streamtrain.synthetic import synthetic_samples


def _reference_logits(model: PackedConvNet, frames: torch.Tensor) -> torch.Tensor:
    """One sample, no packing: embedding, then Conv1d with zero 'same' padding, mean over time, head."""
    h = model.embed(frames)
    for conv in model.convs:
        assert isinstance(conv, MaskedConv1d)
        conv_out = F.conv1d(h.T.unsqueeze(0), conv.conv1d_weight(), conv.linear.bias, padding=model.kernel_size // 2)
        h = h + F.gelu(conv_out.squeeze(0).T)
    return model.head(h.mean(dim=0))


def _model() -> PackedConvNet:
    torch.manual_seed(0)
    return PackedConvNet(num_features=4, num_classes=3, hidden_size=8, num_layers=2, kernel_size=5).double()


def test_packed_forward_equals_unpadded_per_sample_forward() -> None:
    model = _model()
    samples = synthetic_samples([1, 2, 7, 3, 12], num_features=4, num_classes=3, seed=3)
    batch = pack_samples(samples, num_features=4, dtype=torch.float64)
    logits = model(batch)
    assert logits.shape == (5, 3)
    for i, sample in enumerate(samples):
        expected = _reference_logits(model, torch.from_numpy(sample.array().copy()).double())
        torch.testing.assert_close(logits[i], expected, rtol=1e-10, atol=1e-10)


def test_samples_do_not_leak_into_each_other() -> None:
    model = _model()
    samples = synthetic_samples([4, 6, 5], num_features=4, num_classes=3, seed=4)
    batch = pack_samples(samples, num_features=4, dtype=torch.float64)
    values = batch.values.clone()
    values[batch.segment_ids == 1] += 100.0  # perturb the middle sample only
    changed = PackedBatch(values, batch.segment_ids, batch.cu_seqlens, batch.lengths, batch.labels)
    before, after = model(batch), model(changed)
    torch.testing.assert_close(before[[0, 2]], after[[0, 2]], rtol=0, atol=0)
    assert not torch.allclose(before[1], after[1])


def test_empty_batch_gives_no_logits_and_zero_gradients() -> None:
    model = _model()
    logits = model(pack_samples([], num_features=4, dtype=torch.float64))
    assert logits.shape == (0, 3)
    touch = sum(p.sum() for p in model.parameters())
    ((logits.sum() + touch) * 0.0).backward()
    for p in model.parameters():
        assert p.grad is not None and torch.count_nonzero(p.grad) == 0


def test_default_model_learns_the_synthetic_task_quickly() -> None:
    config = TrainerConfig(num_features=16, num_classes=10, hidden_size=32)
    model = build_model(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    losses: list[float] = []
    for step in range(40):
        sizes = torch.randint(4, 48, (16,), generator=generator).tolist()
        batch = pack_samples(synthetic_samples(sizes, 16, 10, seed=step, signal=0.5), 16)
        loss = F.cross_entropy(model(batch), batch.labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert first > 1.5  # chance level is ln(10) = 2.30
    assert last < 0.3 * first
    held_out = pack_samples(synthetic_samples([10, 30, 60] * 20, 16, 10, seed=999, signal=0.5), 16)
    with torch.no_grad():
        accuracy = (model(held_out).argmax(dim=1) == held_out.labels).float().mean()
    assert accuracy > 0.75
