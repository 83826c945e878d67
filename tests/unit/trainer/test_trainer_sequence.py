"""The built-in real-series model (`seq`) and the start-up probe of plug-ins (`check_plugins`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch
from torch import nn

from streamtrain.config.trainer import BUILTIN_MODELS, TrainerConfig
from streamtrain.models.batching import PackedBatch, collate_packed, pack_samples
from streamtrain.models.plugins import build_collate, build_model, check_plugins
from streamtrain.models.sequence import SequenceClassifier, series_features
from streamtrain.synthetic import synthetic_samples
from streamtrain.trainer.errors import TrainerSetupError
from streamtrain.wire import Sample

SEQ = TrainerConfig(model="seq", num_features=2, num_classes=5, hidden_size=8, num_layers=3, kernel_size=3)


def test_every_builtin_name_builds_a_model_that_passes_the_probe() -> None:
    for name in BUILTIN_MODELS:
        config = TrainerConfig(model=name)
        check_plugins(build_model(config), build_collate(config), config)
    assert isinstance(build_model(SEQ), SequenceClassifier)


def test_a_packed_batch_equals_each_series_alone() -> None:
    model = build_model(SEQ).to(torch.float64)
    lengths = [1, 7, 2, 30, 5]
    samples = synthetic_samples(lengths, num_features=2, num_classes=5, seed=3)
    together = model(pack_samples(samples, 2, dtype=torch.float64))
    alone = torch.cat([model(pack_samples([s], 2, dtype=torch.float64)) for s in samples])
    torch.testing.assert_close(together, alone)  # no convolution reads across a series boundary
    assert together.shape == (5, 5)
    assert model(pack_samples([], 2, dtype=torch.float64)).shape == (0, 5)


def test_bucketed_lengths_repeat_the_conv_shapes_and_change_no_output() -> None:
    torch.manual_seed(0)
    bucketed = build_model(SEQ).to(torch.float64)
    exact = SequenceClassifier(2, 5, hidden_size=8, num_layers=3, kernel_size=3, length_buckets=0).to(torch.float64)
    exact.load_state_dict(bucketed.state_dict())
    seen: list[int] = []
    bucketed.convs[0].register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[-1]))
    for i, lengths in enumerate(([300, 411], [302, 409, 3], [700], [1, 2, 3])):
        batch = pack_samples(synthetic_samples(lengths, num_features=2, num_classes=5, seed=i), 2, dtype=torch.float64)
        torch.testing.assert_close(bucketed(batch), exact(batch))  # the padding is zeros no conv reads into a series
    # 711 frames + 3 gaps of 4, 714 + 4 gaps and 700 + 2 gaps all come to the bucket of 768 frames: one conv shape.
    assert seen == [768, 768, 768, 22]
    with pytest.raises(ValueError, match="per_octave"):
        SequenceClassifier(2, 5, length_buckets=3)


def test_normalisation_keeps_the_shape_unit_free_and_the_amplitude_visible() -> None:
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((40, 1)))
    seg = torch.zeros(40, dtype=torch.int64)
    lengths = torch.tensor([40])
    small, large = series_features(x, seg, lengths), series_features(1000.0 * x, seg, lengths)
    torch.testing.assert_close(small[:, 0], large[:, 0])  # z-scores: the same in any unit
    assert torch.allclose(large[:, 2] - small[:, 2], torch.full((40,), 3.0, dtype=torch.float64))  # log10 scale
    flat = series_features(torch.full((5, 1), 2.0), torch.zeros(5, dtype=torch.int64), torch.tensor([5]))
    assert torch.isfinite(flat).all() and (flat[:, 0] == 0).all()  # a constant series: no division by zero


def test_the_series_model_learns_amplitude_and_shape() -> None:
    # Class 0: slow sine of amplitude 1; class 1: the same sine x 50; class 2: fast sine of amplitude 1.
    rng = np.random.default_rng(1)
    torch.manual_seed(0)

    def series(label: int) -> Sample:
        n = int(rng.integers(20, 80))
        t = np.arange(n) / (4.0 if label == 2 else 16.0)
        x = np.sin(t + rng.uniform(0, 6)) * (50.0 if label == 1 else 1.0) + 0.05 * rng.standard_normal(n)
        return Sample.from_array("d", 0, x.astype(np.float32).reshape(n, 1), label=label)

    config = TrainerConfig(model="seq", num_features=1, num_classes=3, hidden_size=16, num_layers=3)
    model = build_model(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(60):
        batch = collate_packed([series(int(y)) for y in rng.integers(0, 3, 24)], config)
        loss = nn.functional.cross_entropy(model(batch), batch.labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    test = collate_packed([series(y) for y in (0, 1, 2) * 20], config)
    with torch.no_grad():
        accuracy = (model(test).argmax(1) == test.labels).float().mean().item()
    assert accuracy > 0.9, accuracy


# ---- the start-up probe of plug-ins -------------------------------------------------------------------------

class _Head(nn.Module):
    def __init__(self, outputs: int, rows: int | None = None, fail: bool = False) -> None:
        super().__init__()
        self.linear = nn.Linear(4, outputs)
        self.rows, self.fail = rows, fail

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        if self.fail:
            raise RuntimeError("shape mismatch in my layer")
        n = batch.num_samples if self.rows is None else self.rows
        return self.linear(torch.zeros(n, 4))


CONFIG = TrainerConfig(num_features=4, num_classes=3)


def _tuple_collate(samples: Sequence[Sample], config: TrainerConfig) -> object:
    return (torch.zeros(len(samples), 4), torch.zeros(len(samples), dtype=torch.int64))


def _raising_collate(samples: Sequence[Sample], config: TrainerConfig) -> PackedBatch:
    raise KeyError("payload")


def _float_labels(samples: Sequence[Sample], config: TrainerConfig) -> PackedBatch:
    batch = collate_packed(samples, config)
    return PackedBatch(batch.values, batch.segment_ids, batch.cu_seqlens, batch.lengths, batch.labels.float())


@pytest.mark.parametrize(("model", "collate", "setting", "words"), [
    (_Head(3, rows=2), collate_packed, "trainer.model", "outputs of shape (2, 3)"),
    (_Head(7), collate_packed, "trainer.model", "shape (3, 7)"),
    (_Head(3, fail=True), collate_packed, "trainer.model", "raised RuntimeError"),
    (_Head(3), _tuple_collate, "trainer.collate", "lacks labels, num_samples, total_size, to"),
    (_Head(3), _raising_collate, "trainer.collate", "raised KeyError"),
    (_Head(3), _float_labels, "trainer.collate", "expected an int64 tensor"),
])
def test_a_bad_plugin_fails_the_probe_naming_its_setting(model: nn.Module, collate: object, setting: str,
                                                         words: str) -> None:
    with pytest.raises(TrainerSetupError) as excinfo:
        check_plugins(model, collate, CONFIG)  # type: ignore[arg-type]
    assert str(excinfo.value).startswith(f"{setting}: ") and words in str(excinfo.value)


def test_the_probe_checks_the_empty_batch_too() -> None:
    class NoEmpty(_Head):
        def forward(self, batch: PackedBatch) -> torch.Tensor:
            if batch.num_samples == 0:
                raise ValueError("cannot pool nothing")
            return super().forward(batch)

    with pytest.raises(TrainerSetupError, match=r"trainer.model: .* on a probe batch of 0 samples"):
        check_plugins(NoEmpty(3), collate_packed, CONFIG)
    check_plugins(_Head(3), collate_packed, CONFIG)  # a good one passes, and stays in training mode
