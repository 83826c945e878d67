"""The guarded model: the payload rule (accepted dtypes, conversion that must stay finite), the magnitude bound
of the default collate, gradient clipping, and the skip of a step whose loss or gradients are not finite
(in a group of one, in-process gloo; every rank agreeing is tested with several ranks in the integration suite)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fuzzing import extreme_sample
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from streamtrain.config.trainer import TrainerConfig
from streamtrain.models.batching import DTYPE_NOT_ACCEPTED, DTYPE_OVERFLOW, PackedBatch, collate_packed, payload_problem
from streamtrain.models.conv import PackedConvNet
from streamtrain.models.plugins import build_model
from streamtrain.synthetic import synthetic_samples
from streamtrain.trainer.aggregation import AggregationState, aggregation_hook
from streamtrain.trainer.distributed import DistContext, destroy_distributed, init_distributed
from streamtrain.trainer.step import StepRunner, build_optimizer, build_step_runner
from streamtrain.wire import DTYPES, Sample

CONFIG = TrainerConfig(num_features=4, num_classes=3, hidden_size=8, num_layers=1, kernel_size=3, device="cpu")
#: Marks a sample the `_NanOnLong` model answers with NaN: its size.
MARKED = 11


@pytest.fixture(scope="module")
def ctx() -> Iterator[DistContext]:
    context = init_distributed(CONFIG, rank=0, world_size=1)
    yield context
    destroy_distributed()


# ---- the payload rule ------------------------------------------------------------------------------------------


def test_a_dtype_outside_accepted_dtypes_is_refused_with_the_setting_named() -> None:
    config = CONFIG.model_copy(update={"accepted_dtypes": ("float32", "float16")})
    sample = Sample.from_array("d", 0, np.zeros((2, 4), np.uint8), label=0)
    reason, detail = payload_problem(sample, config) or ("", "")
    assert reason == DTYPE_NOT_ACCEPTED and "trainer.accepted_dtypes" in detail and "uint8" in detail
    assert payload_problem(Sample.from_array("d", 0, np.zeros((2, 4), np.float16), label=0), config) is None


def test_a_float64_that_overflows_the_model_dtype_is_refused_and_one_that_fits_is_not() -> None:
    huge = Sample.from_array("d", 0, np.array([[1.0, -1e300, 2.0, 3.0]]), label=0)
    reason, detail = payload_problem(huge, CONFIG) or ("", "")
    assert reason == DTYPE_OVERFLOW and "1e+300" in detail and "float32" in detail
    assert payload_problem(huge, CONFIG.model_copy(update={"precision": "float64"})) is None  # it fits there
    assert payload_problem(Sample.from_array("d", 0, np.full((1, 4), 1e30), label=0), CONFIG) is None


def test_accepted_dtypes_is_checked_at_start_up() -> None:
    with pytest.raises(ValueError, match="'bfloat16' not among the wire's dtypes"):
        TrainerConfig(accepted_dtypes="float32,bfloat16")
    assert TrainerConfig(accepted_dtypes="[float32, uint8]").accepted_dtypes == ("float32", "uint8")
    assert TrainerConfig().accepted_dtypes == DTYPES


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16), frames=st.integers(1, 30),
       max_abs=st.sampled_from([1.0, 100.0, 1e4]))
def test_collated_magnitude_is_bounded_and_shape_kept(dtype: str, seed: int, frames: int, max_abs: float) -> None:
    extreme = extreme_sample("d", 0, dtype, np.random.default_rng(seed), frames, num_features=4, num_classes=3)
    payload = extreme.array()
    small = np.full((3, 4), 0.5, dtype=np.float32)  # well scaled: passes unchanged
    samples = [extreme, Sample.from_array("d", 1, small, label=2)]
    config = CONFIG.model_copy(update={"max_input_abs": max_abs})
    assert payload_problem(samples[0], config) is None  # every wire dtype fits float32 at these scales
    values = collate_packed(samples, config).values
    assert torch.isfinite(values).all() and float(values.abs().max()) <= max_abs * (1 + 1e-6)
    np.testing.assert_array_equal(values[frames:].numpy(), small)
    big = payload.astype(np.float64)
    if np.abs(big).max() > max_abs:  # scaled as a whole: proportional to the original, signs kept
        ratio = values[:frames].double().numpy() / np.where(big == 0, 1.0, big)
        assert np.allclose(ratio[big != 0], ratio[big != 0].flat[0], rtol=1e-3)


# ---- the default model under every dtype and scale -------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dtypes=st.lists(st.sampled_from(DTYPES), min_size=1, max_size=8), seed=st.integers(0, 2**16))
def test_default_model_stays_finite_under_extreme_samples_of_any_dtype(ctx: DistContext, dtypes: list[str],
                                                                      seed: int) -> None:
    """Thirty extreme-but-finite samples of the given dtypes, among ordinary ones, for a few steps: loss,
    gradients and parameters stay finite and no step has to be skipped."""
    rng = np.random.default_rng(seed)
    runner = build_step_runner(CONFIG, ctx)
    normal = synthetic_samples([5] * 10, num_features=4, num_classes=3, seed=seed)
    extreme = [extreme_sample("d", i, dtypes[i % len(dtypes)], rng, int(rng.integers(1, 20)), num_features=4,
                              num_classes=3) for i in range(30)]
    for step in range(3):
        result = runner.run_step(extreme[10 * step:10 * step + 10] + normal)
        assert not result.skipped and result.loss is not None and np.isfinite(result.loss)
    assert all(torch.isfinite(p).all() for p in runner.model.parameters())


# ---- clipping and the skipped step -----------------------------------------------------------------------------


def test_gradients_are_clipped_to_max_grad_norm(ctx: DistContext) -> None:
    config = CONFIG.model_copy(update={"max_grad_norm": 1e-3})
    runner = build_step_runner(config, ctx)
    result = runner.run_step(synthetic_samples([4, 6], num_features=4, num_classes=3))
    assert result.stepped and result.grad_norm is not None and result.grad_norm > 1e-3
    clipped = torch.nn.utils.get_total_norm([p.grad for p in runner.model.parameters() if p.grad is not None])
    assert float(clipped) == pytest.approx(1e-3, rel=1e-4)


class _NanOnLong(nn.Module):
    """The default model with a float buffer the forward pass updates; NaN logits for samples of size MARKED."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = PackedConvNet(4, 3, 8, 1, 3)
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        self.seen += batch.values.sum()  # as batch-norm statistics would: NaN input must not stick
        logits = self.inner(batch)
        return logits * torch.where(batch.lengths == MARKED, float("nan"), 1.0).unsqueeze(1)


def _runner(ctx: DistContext) -> StepRunner:
    torch.manual_seed(0)
    model = _NanOnLong()
    ddp = DistributedDataParallel(model)
    state = AggregationState(ctx.device)
    ddp.register_comm_hook(state, aggregation_hook)
    return StepRunner(ddp, build_optimizer(model, CONFIG), state, CONFIG, collate_packed, ctx.device)


def _state(runner: StepRunner) -> list[torch.Tensor]:
    momentum = [runner.optimizer.state[p].get("momentum_buffer") for p in runner.model.module.parameters()]
    return [t.detach().clone() for t in [*runner.model.module.state_dict().values(), *momentum] if t is not None]


def test_a_non_finite_step_changes_nothing_and_the_next_one_trains_as_if_it_never_happened(ctx: DistContext) -> None:
    runner, reference = _runner(ctx), _runner(ctx)
    first = synthetic_samples([4, 6], num_features=4, num_classes=3, seed=1)
    poisoned = synthetic_samples([3, MARKED], num_features=4, num_classes=3, seed=2)
    after = synthetic_samples([5, 2], num_features=4, num_classes=3, seed=3)
    runner.run_step(first)
    reference.run_step(first)
    before = _state(runner)
    result = runner.run_step(poisoned)
    assert result.skipped and not result.stepped and result.samples == 2 and runner.skipped_steps == 1
    assert result.grad_norm is not None and not np.isfinite(result.grad_norm)
    # Parameters, momentum and the forward pass's buffer all as they were: no step, no decay, no statistics.
    assert all(torch.equal(a, b) for a, b in zip(before, _state(runner), strict=True))
    assert runner.run_step(after).stepped and reference.run_step(after).stepped
    assert all(torch.equal(a, b) for a, b in zip(_state(reference), _state(runner), strict=True))


def test_an_idle_group_step_is_neither_stepped_nor_skipped(ctx: DistContext) -> None:
    result = _runner(ctx).run_step([])
    assert not result.stepped and not result.skipped and result.grad_norm is None


def test_loss_of_the_default_model_on_a_huge_unbounded_input_would_not_be_finite() -> None:
    """Why the bound exists: without it, an int64 payload near 2^62 drives the default model's gradients to inf."""
    sample = Sample.from_array("d", 0, np.full((8, 4), 2**62, dtype=np.int64), label=1)
    model = build_model(CONFIG)
    unbounded = collate_packed([sample], CONFIG.model_copy(update={"max_input_abs": 0.0}))
    F.cross_entropy(model(unbounded), unbounded.labels).backward()
    norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    assert not torch.isfinite(norm)
