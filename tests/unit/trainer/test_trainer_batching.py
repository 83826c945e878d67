"""Packing variable-length samples: layout, boundaries, empty batches and bad samples."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain.config.trainer import TrainerConfig
from streamtrain.models.batching import bucketed_length, collate_packed, pack_samples, sample_problems
from streamtrain.synthetic import synthetic_samples
from streamtrain.wire import Sample


def test_pack_concatenates_without_padding() -> None:
    samples = synthetic_samples([3, 1, 5], num_features=4, num_classes=3, seed=7)
    batch = pack_samples(samples, num_features=4)
    assert batch.values.shape == (9, 4)
    assert batch.total_size == 9 and batch.num_samples == 3 and batch.num_features == 4
    assert batch.segment_ids.tolist() == [0, 0, 0, 1, 2, 2, 2, 2, 2]
    assert batch.cu_seqlens.tolist() == [0, 3, 4, 9]
    assert batch.lengths.tolist() == [3, 1, 5]
    assert batch.labels.tolist() == [s.label for s in samples]
    for i, sample in enumerate(samples):
        lo, hi = batch.cu_seqlens[i], batch.cu_seqlens[i + 1]
        np.testing.assert_array_equal(batch.values[lo:hi].numpy(), sample.array())


def test_payloads_of_one_dtype_or_of_several_pack_alike_and_bytes_that_do_not_fit_a_shape_are_refused() -> None:
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((n, 3)) for n in (2, 5, 1)]
    one = [Sample.from_array("d", i, a.astype(np.float32), label=0) for i, a in enumerate(arrays)]
    mixed = [Sample.from_array("d", i, a.astype(dtype), label=0) for i, (a, dtype) in
             enumerate(zip(arrays, ("float32", "float64", "float16"), strict=True))]
    expected = torch.from_numpy(np.concatenate(arrays))
    for samples, tolerance in ((one, 1e-7), (mixed, 1e-3)):
        values = pack_samples(samples, 3, dtype=torch.float64).values
        assert values.shape == (8, 3) and values.dtype == torch.float64
        torch.testing.assert_close(values, expected, rtol=tolerance, atol=tolerance)
    short = replace(one[1], data=one[1].data[:-4])  # a byte count its shape does not fit
    with pytest.raises(ValueError):
        pack_samples([one[0], short], 3)


def test_empty_batch_is_well_shaped() -> None:
    batch = pack_samples([], num_features=6)
    assert batch.values.shape == (0, 6)
    assert batch.segment_ids.shape == (0,) and batch.lengths.shape == (0,) and batch.labels.shape == (0,)
    assert batch.cu_seqlens.tolist() == [0]
    assert batch.num_samples == 0 and batch.total_size == 0


def test_collate_follows_config_precision() -> None:
    samples = synthetic_samples([2, 2], num_features=16)
    assert collate_packed(samples, TrainerConfig()).values.dtype == torch.float32
    assert collate_packed(samples, TrainerConfig(precision="float64")).values.dtype == torch.float64


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=40), max_size=12))
def test_packing_round_trips_any_sizes(sizes: list[int]) -> None:
    samples = synthetic_samples(sizes, num_features=3, num_classes=5, seed=len(sizes))
    batch = pack_samples(samples, num_features=3)
    assert batch.total_size == sum(sizes)
    assert torch.equal(torch.bincount(batch.segment_ids, minlength=len(sizes)), torch.tensor(sizes, dtype=torch.long))
    assert torch.equal(batch.cu_seqlens[1:] - batch.cu_seqlens[:-1], batch.lengths)
    for i, sample in enumerate(samples):
        np.testing.assert_array_equal(batch.values[batch.segment_ids == i].numpy(), sample.array())


def test_wrong_feature_count_is_refused() -> None:
    samples = synthetic_samples([2], num_features=5)
    with pytest.raises(ValueError, match=r"not \(size, 4\)"):
        pack_samples(samples, num_features=4)
    assert any("not (size, 4)" in p for p in sample_problems(samples[0], 4))


def test_missing_or_out_of_range_label_is_refused() -> None:
    unlabeled = Sample.from_array("d", 0, np.zeros((2, 4), np.float32), label=None)
    with pytest.raises(ValueError, match="label None"):
        pack_samples([unlabeled], num_features=4)
    assert sample_problems(unlabeled, 4) == []  # what a sample must carry is the objective's to say
    big = Sample.from_array("d", 1, np.zeros((2, 4), np.float32), label=9)
    with pytest.raises(ValueError, match="label 9"):
        pack_samples([big], num_features=4, num_classes=3)


def test_an_empty_sample_is_refused_in_its_objectives_terms() -> None:
    empty = Sample.from_array("d", 4, np.zeros((0, 2), np.float32), label=1)
    with pytest.raises(ValueError, match=r"^sample seq=4: no frames \(size 0\): a sample needs at least one$"):
        pack_samples([empty], num_features=2)  # a classifier forecasts nothing: no word of a horizon
    short = Sample.from_array("d", 5, np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match=r"3 frames leave none to forecast trainer\.horizon=3 from"):
        pack_samples([short], num_features=2, require_labels=False, horizon=3)


def test_good_sample_has_no_problems() -> None:
    assert sample_problems(synthetic_samples([3], num_features=4)[0], 4) == []


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=10**7), st.sampled_from([1, 2, 4, 8, 16]))
def test_a_bucketed_length_covers_the_length_with_bounded_padding(length: int, per_octave: int) -> None:
    padded = bucketed_length(length, per_octave)
    assert length <= padded <= length + length / per_octave
    assert bucketed_length(padded, per_octave) == padded  # a bucket's length is its own bucket
    assert bucketed_length(length, 0) == length


@pytest.mark.parametrize("per_octave", [1, 4, 8])
def test_every_power_of_two_holds_per_octave_buckets(per_octave: int) -> None:
    for octave in (64, 1024, 1 << 20):
        lengths = {bucketed_length(n, per_octave) for n in range(octave + 1, 2 * octave + 1)}
        assert len(lengths) == per_octave  # a stream of ever new sizes comes back to the same few shapes
        assert max(lengths) == 2 * octave


@pytest.mark.parametrize("per_octave", [-1, 3, 6])
def test_a_bucket_count_that_is_not_a_power_of_two_is_refused(per_octave: int) -> None:
    with pytest.raises(ValueError, match="per_octave"):
        bucketed_length(100, per_octave)
