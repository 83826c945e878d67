"""The step runner and its pieces in a group of one (in-process gloo; the multi-rank cases are integration)."""

from __future__ import annotations

import mmap
from collections.abc import Iterator

import pytest
import torch

from streamtrain.config.trainer import TrainerConfig
from streamtrain.synthetic import synthetic_samples
from streamtrain.trainer.compression import CompressionStats, TopKCompressor, energy_loss, topk
from streamtrain.trainer.distributed import (
    DistContext,
    destroy_distributed,
    init_distributed,
    peak_memory_bytes,
    reset_peak_memory,
    select_device,
)
from streamtrain.trainer.step import StepRunner, build_step_runner, linear_lr_scale

CONFIG = TrainerConfig(num_features=4, num_classes=3, hidden_size=8, num_layers=1, kernel_size=3, device="cpu")


@pytest.fixture(scope="module")
def ctx() -> Iterator[DistContext]:
    context = init_distributed(CONFIG, rank=0, world_size=1)
    yield context
    destroy_distributed()


def _params(runner: StepRunner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in runner.model.parameters()]


def test_step_trains_and_reports(ctx: DistContext) -> None:
    runner = build_step_runner(CONFIG, ctx)
    samples = synthetic_samples([3, 9, 1], num_features=4, num_classes=3)
    before = _params(runner)
    result = runner.run_step(samples)
    assert (result.samples, result.total_size, result.weight, result.global_samples) == (3, 13, 3.0, 3)
    assert result.stepped and result.loss is not None and result.loss > 0
    assert result.lr == pytest.approx(CONFIG.lr * 3 / CONFIG.base_batch)
    assert result.step_seconds >= result.compute_seconds + result.comm_seconds - 1e-6
    assert result.comm_seconds >= 0 and result.collate_seconds >= 0
    assert result.memory_bytes > 0 and result.buckets >= 1
    assert any(not torch.equal(a, b) for a, b in zip(before, _params(runner), strict=True))


def test_the_flat_bucket_norm_and_scale_train_as_the_per_tensor_ones_clipping_included(ctx: DistContext) -> None:
    config = CONFIG.model_copy(update={"max_grad_norm": 0.05})  # small enough that every step clips
    runners = []
    for _ in range(2):
        torch.manual_seed(3)
        runners.append(build_step_runner(config, ctx))
    flat, per_tensor = runners
    per_tensor._flat_gradients = lambda: None  # type: ignore[method-assign]  # the path for any other layout
    assert flat._flat_gradients() is None  # no bucket reduced yet
    for step in range(4):
        samples = synthetic_samples([3, 5, 2 + step], num_features=4, num_classes=3, seed=step)
        a, b = flat.run_step(samples), per_tensor.run_step(samples)
        assert flat._flat_gradients() is not None
        assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-6) and a.grad_norm > config.max_grad_norm
    for x, y in zip(_params(flat), _params(per_tensor), strict=True):
        torch.testing.assert_close(x, y)


def test_a_cpu_rank_reads_its_peak_memory_at_the_edges_of_each_window(ctx: DistContext,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import streamtrain.trainer.step as step_module

    reads: list[int] = []

    def peak(device: torch.device) -> int:
        reads.append(len(reads))
        return 1000 + len(reads)

    monkeypatch.setattr(step_module, "peak_memory_bytes", peak)
    runner = build_step_runner(CONFIG, ctx)
    window = step_module.CPU_MEMORY_WINDOW
    figures = [runner.run_step(synthetic_samples([2], num_features=4, num_classes=3)).memory_bytes
               for _ in range(window + 2)]
    # Read after a window's first step and after its last: every step between reports the last figure read.
    assert len(reads) == 3
    assert figures == [1001] * (window - 1) + [1002, 1003, 1003]


def test_empty_step_does_not_move_parameters_despite_momentum(ctx: DistContext) -> None:
    runner = build_step_runner(CONFIG, ctx)
    runner.run_step(synthetic_samples([4, 4], num_features=4, num_classes=3))  # builds momentum
    before = _params(runner)
    result = runner.run_step([])
    assert result.loss is None and not result.stepped and result.samples == 0 and result.global_samples == 0
    assert all(torch.equal(a, b) for a, b in zip(before, _params(runner), strict=True))


def test_an_idle_step_runs_none_of_the_models_layers_and_leaves_its_forward_as_it_was(ctx: DistContext) -> None:
    runner = build_step_runner(CONFIG, ctx)
    module = runner.model.module
    layers = [m for m in module.modules() if m is not module]
    calls: list[str] = []
    for layer in layers:
        layer.register_forward_hook(lambda m, *_: calls.append(type(m).__name__))
    runner.run_step([])
    assert calls == [] and "forward" not in vars(module)  # the stand-in is gone again
    runner.run_step(synthetic_samples([4], num_features=4, num_classes=3))
    assert calls  # a step with samples runs them


def test_an_idle_step_of_a_module_that_refuses_a_forward_attribute_runs_its_layers(
    ctx: DistContext, monkeypatch: pytest.MonkeyPatch,
) -> None:
    runner = build_step_runner(CONFIG, ctx)
    kind = type(runner.model.module)

    def refuse(self: torch.nn.Module, name: str, value: object) -> None:
        if name == "forward":
            raise AttributeError("forward is read-only here")
        torch.nn.Module.__setattr__(self, name, value)

    monkeypatch.setattr(kind, "__setattr__", refuse)
    before = _params(runner)
    result = runner.run_step([])
    assert result.samples == 0 and all(torch.equal(a, b) for a, b in zip(before, _params(runner), strict=True))


def test_weight_and_lr_scale_overrides(ctx: DistContext) -> None:
    runner = build_step_runner(CONFIG, ctx)
    result = runner.run_step(synthetic_samples([2], num_features=4, num_classes=3), weight=5.0, lr_scale=2.0)
    assert result.weight == 5.0 and result.global_weight == 5.0
    assert result.lr == pytest.approx(2 * CONFIG.lr)
    fixed = build_step_runner(CONFIG.model_copy(update={"lr_scaling": False}), ctx)
    assert fixed.run_step(synthetic_samples([2] * 40, 4, 3), lr_scale=2.0).lr == pytest.approx(CONFIG.lr)


def test_linear_lr_scale_is_capped() -> None:
    assert linear_lr_scale(32, 64, 16.0) == 0.5
    assert linear_lr_scale(64 * 100, 64, 16.0) == 16.0
    assert linear_lr_scale(0, 64, 16.0) == 0.0


def test_compressed_step_in_a_group_of_one(ctx: DistContext) -> None:
    config = CONFIG.model_copy(update={"compression": True, "compression_delta": 10.0, "topk_ratio": 0.25})
    runner = build_step_runner(config, ctx)
    result = runner.run_step(synthetic_samples([5, 6], num_features=4, num_classes=3))
    stats = runner.compression_stats
    assert stats is not None and result.compressed_buckets == result.buckets == stats.compressed_buckets
    assert stats.compressed_step_ratio == 1.0
    assert stats.elements_sent < 0.3 * stats.elements_dense


def test_topk_reduce_alone_keeps_the_largest_entries(ctx: DistContext) -> None:
    flat = torch.tensor([0.1, -5.0, 0.2, 3.0, -0.3, 0.0, 0.05, 1.0])
    sparse = TopKCompressor(0.25, 1.0).reduce(flat.clone()).wait()
    assert sparse.tolist() == [0.0, -5.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0]
    dense = TopKCompressor(0.25, 0.0).reduce(flat.clone()).wait()
    assert torch.equal(dense, flat)


def test_energy_loss_and_stats() -> None:
    flat = torch.tensor([3.0, 4.0, 0.0])
    index, values = topk(flat, 1)
    assert index.tolist() == [1] and values.tolist() == [4.0]
    assert energy_loss(flat, values) == pytest.approx(9.0 / 25.0)
    assert energy_loss(torch.zeros(3), torch.zeros(1)) == 0.0
    assert CompressionStats().compressed_step_ratio == 0.0
    assert CompressionStats(steps=4, compressed_steps=1).compressed_step_ratio == 0.25
    with pytest.raises(ValueError, match="ratio"):
        TopKCompressor(0.0, 0.1)


def test_peak_memory_is_measured() -> None:
    cpu = torch.device("cpu")
    reset_peak_memory(cpu)
    base = peak_memory_bytes(cpu)
    # 64 MiB of fresh pages, touched (an anonymous mapping: not served from memory the allocator kept).
    with mmap.mmap(-1, 64 * 1024 * 1024) as block:
        block.write(b"\x01" * len(block))
        assert peak_memory_bytes(cpu) >= base + 32 * 1024 * 1024


def test_bad_environment_fails_before_any_rendezvous(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK='x'"):
        init_distributed(CONFIG)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="rank 3 is not in a group of 2"):
        init_distributed(CONFIG)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(ValueError, match="MASTER_PORT"):
        init_distributed(CONFIG)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a host without CUDA")
def test_cuda_requested_without_cuda_is_refused() -> None:
    with pytest.raises(ValueError, match=r"trainer\.device"):
        select_device(TrainerConfig(device="cuda"), 0)
    assert select_device(TrainerConfig(), 0) == (torch.device("cpu"), "gloo")


def test_a_step_runs_no_collective_of_its_own_beside_its_buckets(ctx: DistContext,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The step's weight, samples and flags ride in the first bucket's all-reduce (a collective of their own was a
    fixed cost every step paid at every rank's pace), and still come back summed."""
    runner = build_step_runner(CONFIG, ctx)
    runner.run_step(synthetic_samples([2, 2], num_features=4, num_classes=3))  # DDP rebuilds its buckets once
    calls: list[int] = []
    real = torch.distributed.all_reduce

    def counted(tensor: torch.Tensor, *args: object, **kwargs: object) -> object:
        calls.append(tensor.numel())
        return real(tensor, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(torch.distributed, "all_reduce", counted)
    result = runner.run_step(synthetic_samples([3, 9, 1], num_features=4, num_classes=3), backlog=7, publish=True)
    assert len(calls) == result.buckets >= 1
    assert (result.global_weight, result.global_samples, result.group_backlog, result.publish) == (3.0, 3, 7, True)
    assert not result.stop and result.stepped
