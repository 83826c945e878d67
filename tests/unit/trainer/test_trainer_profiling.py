"""Compute follows the batch's total size: the time-vs-size fit and the one-long-many-short batch.

Wall-clock assertions use one CPU thread, medians, and wide margins (ratios, not absolute times),
so a busy two-core machine does not make them flaky.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from streamtrain.config.trainer import TrainerConfig
from streamtrain.models.batching import pack_samples
from streamtrain.models.plugins import build_model
from streamtrain.synthetic import synthetic_samples
from streamtrain.trainer.profiling import fit_linear, profile_size_time, sizes_summing_to, time_forward_backward

CONFIG = TrainerConfig(hidden_size=32)


@pytest.fixture
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_fit_recovers_a_line() -> None:
    fit = fit_linear([1, 2, 4, 8], [5.0, 7.0, 11.0, 19.0])
    assert fit.slope == pytest.approx(2.0) and fit.intercept == pytest.approx(3.0) and fit.r2 == pytest.approx(1.0)
    assert fit.predict(10) == pytest.approx(23.0)
    with pytest.raises(ValueError, match="two distinct sizes"):
        fit_linear([3, 3], [1.0, 2.0])


def test_sizes_sum_exactly() -> None:
    rng = np.random.default_rng(0)
    sizes = sizes_summing_to(1000, 4, 256, rng)
    assert sum(sizes) == 1000 and all(1 <= s <= 256 for s in sizes)


def test_packed_elements_follow_total_size_not_count_times_longest() -> None:
    samples = synthetic_samples([512] + [8] * 31, num_features=16)
    batch = pack_samples(samples, num_features=16)
    assert batch.values.numel() == (512 + 31 * 8) * 16  # a padded batch would hold 32 * 512 * 16


def test_step_time_is_linear_in_total_size(one_thread: None) -> None:
    fit = profile_size_time(CONFIG, [512, 1024, 2048, 4096, 8192], repeats=3)
    assert fit.slope > 0
    assert fit.r2 > 0.8, fit
    assert fit.seconds[-1] > 3 * fit.seconds[1], fit  # 8x the frames costs well over 3x the time


def test_one_long_many_short_costs_its_total_size(one_thread: None) -> None:
    model = build_model(CONFIG)

    def seconds(sizes: list[int]) -> float:
        batch = pack_samples(synthetic_samples(sizes, 16, 10, seed=len(sizes)), 16)
        return time_forward_backward(model, batch, batch.labels, repeats=5)

    # Interleaved rounds, the fastest of each: a busy neighbour slows some timings, never speeds one up.
    rounds = [(seconds([512] + [8] * 31),  # 760 frames
               seconds([20] * 38),  # 760 frames, every sample the same length
               seconds([512] * 32))  # what padding the mixed batch to its longest sample would cost
              for _ in range(3)]
    mixed, uniform, padded = (min(r[i] for r in rounds) for i in range(3))
    # Same total size, about the same cost (within what a shared machine's timing noise allows), while padding
    # to the longest sample (21x the frames) costs several times more.
    assert 1 / 3 < mixed / uniform < 3.0, (mixed, uniform)
    assert padded > 4 * mixed, (padded, mixed)


def test_series_model_time_fits_a_line_in_total_size(one_thread: None) -> None:
    # The coordinator's time model T = a*size + b must still describe it: PLAID-like lengths, 1 to 16 k frames.
    config = TrainerConfig(model="seq", num_features=1, num_classes=11, hidden_size=32, num_layers=4)
    fit = profile_size_time(config, [1024, 2048, 4096, 8192, 16384], sample_sizes=(100, 1344), repeats=3)
    assert fit.slope > 0 and fit.r2 > 0.8, fit
    assert fit.seconds[-1] > 4 * fit.seconds[1], fit  # 8x the frames costs well over 4x the time
