"""Emulated heterogeneity (`trainer.slowdowns`) and the start-up profile that must see it, the stop flag on the
weight all-reduce, and what `streamtrain train` reports as a configuration error (exit 2) versus a bug (traceback,
exit 1).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch
from pydantic import ValidationError
from typer.testing import CliRunner

from streamtrain.cli import app
from streamtrain.config import load_config
from streamtrain.config.trainer import TrainerConfig
from streamtrain.synthetic import synthetic_samples
from streamtrain.trainer.distributed import DistContext, destroy_distributed, init_distributed
from streamtrain.trainer.emulation import SlowDevice, slow_device, slowdown_for
from streamtrain.trainer.errors import TrainerSetupError
from streamtrain.trainer.startup_profile import fit_nonnegative, profile_counts, profile_runner
from streamtrain.trainer.step import build_step_runner

CONFIG = TrainerConfig(num_features=4, num_classes=3, hidden_size=8, num_layers=1, kernel_size=3, device="cpu")


@pytest.fixture(scope="module")
def ctx() -> Iterator[DistContext]:
    context = init_distributed(CONFIG, rank=0, world_size=1)
    yield context
    destroy_distributed()


@pytest.mark.parametrize("given", ["[1,1,1,4]", "1,1,1,4", "1, 1, 1, 4.0"])
def test_slowdowns_from_set_flags(given: str) -> None:
    cfg = load_config(env={}, overrides={"trainer.slowdowns": given})
    assert cfg.trainer.slowdowns == (1.0, 1.0, 1.0, 4.0)
    assert [slowdown_for(cfg.trainer, r, 4) for r in range(4)] == [1.0, 1.0, 1.0, 4.0]


def test_no_slowdowns_means_full_speed() -> None:
    assert CONFIG.slowdowns == ()
    assert slowdown_for(CONFIG, 3, 8) == 1.0


@pytest.mark.parametrize("bad", ["1,0.5", "0", "nan", "1,x", "2000"])
def test_slowdowns_below_one_or_not_numbers_fail_naming_the_setting(bad: str) -> None:
    with pytest.raises(ValidationError, match="slowdowns"):
        TrainerConfig(slowdowns=bad)


def test_slowdowns_must_name_one_factor_per_rank() -> None:
    with pytest.raises(TrainerSetupError, match=r"trainer.slowdowns names 2 factors but the group has 4 ranks"):
        slowdown_for(CONFIG.model_copy(update={"slowdowns": (1.0, 2.0)}), 0, 4)


def test_slowdown_stretches_compute_by_the_factor_on_the_wall_clock(ctx: DistContext) -> None:
    samples = synthetic_samples([40, 30, 50, 20] * 4, num_features=4, num_classes=3)
    config = CONFIG.model_copy(update={"slowdowns": (4.0,), "slowdown_clock": "wall"})
    device = slow_device(config, ctx)
    assert device is not None and (device.factor, device.clock) == (4.0, "wall")
    assert slow_device(CONFIG, ctx) is None  # no slow-downs: the rank runs the production step as it is
    slow = device.wrap(build_step_runner(config, ctx).run_step)
    for _ in range(2):  # warm up the allocator and the kernels
        slow(samples)
    s = slow(samples)
    own = s.compute_seconds - device.slept  # what the step really took
    assert own > 0
    # Slept (4 - 1) x the measured compute (sleep never returns early), and reported inside compute and step time.
    assert device.slept >= 3 * own * 0.999
    assert device.slept <= 3 * own + 0.05
    assert s.compute_seconds == pytest.approx(own + device.slept)
    assert s.step_seconds >= s.compute_seconds


def test_cpu_clock_stretches_the_threads_cpu_time_whatever_the_load(ctx: DistContext) -> None:
    """On the CPU clock (the default without CUDA) the emulated compute is factor x the training thread's CPU
    time, so a core shared with a busy neighbour stretches the rank's wall time, not its emulated time."""
    samples = synthetic_samples([40, 30, 50, 20] * 4, num_features=4, num_classes=3)
    config = CONFIG.model_copy(update={"slowdowns": (6.0,)})
    device = slow_device(config, ctx)
    assert device is not None and device.clock == "cpu"  # auto: the CPU clock without CUDA
    slow = device.wrap(build_step_runner(config, ctx).run_step)
    for _ in range(2):
        slow(samples)
    stop = threading.Event()

    def busy() -> None:  # a neighbour competing for the interpreter and the core
        while not stop.is_set():
            sum(range(10_000))

    neighbour = threading.Thread(target=busy, daemon=True)
    neighbour.start()
    try:
        results = [(slow(samples), device.slept) for _ in range(3)]
    finally:
        stop.set()
        neighbour.join()
    for r, slept in results:
        own = r.compute_seconds - slept
        assert 0 < r.cpu_seconds <= own + 0.01
        if slept > 0:  # slept up to 6 x CPU time (sleep never returns early, so at least that)
            assert r.compute_seconds >= 6 * r.cpu_seconds * 0.999
            assert r.compute_seconds <= 6 * r.cpu_seconds + 0.05
        else:  # the wall time already exceeded 6 x CPU time: nothing to add
            assert own >= 6 * r.cpu_seconds


def test_stop_flag_rides_on_the_step(ctx: DistContext) -> None:
    runner = build_step_runner(CONFIG, ctx)
    samples = synthetic_samples([3, 4], num_features=4, num_classes=3)
    assert runner.run_step(samples).stop is False
    assert runner.run_step(samples, stop=True).stop is True
    assert runner.run_step([], stop=True).stop is True  # an idle rank can ask too
    assert runner.run_step(samples).stop is False


def test_backlog_rides_on_the_step(ctx: DistContext) -> None:
    runner = build_step_runner(CONFIG, ctx)
    samples = synthetic_samples([3, 4], num_features=4, num_classes=3)
    assert runner.run_step(samples, backlog=7).group_backlog == 7  # a group of one: its own
    assert runner.run_step([], backlog=2).group_backlog == 2
    assert runner.run_step(samples).group_backlog == 0


# ---- the start-up profile (LBB's profiling phase) ----------------------------------------------------------------


def test_profiled_batches_are_a_quarter_one_and_two_shares() -> None:
    assert profile_counts(64, 4) == [4, 16, 32]
    assert profile_counts(256, 3) == [22, 86, 172]
    assert profile_counts(2, 4) == [1, 2]  # a share of one sample: still two distinct sizes to fit a line through


def test_fit_is_least_squares_with_a_positive_slope_and_no_negative_intercept() -> None:
    assert fit_nonnegative([100, 400, 800], [0.012, 0.042, 0.082]) == pytest.approx((1e-4, 0.002))
    a, b = fit_nonnegative([100, 200, 300], [0.0, 0.1, 0.2])  # intercept -0.1: through the origin instead
    assert b == 0.0 and a == pytest.approx(0.8 / 1400)
    a, b = fit_nonnegative([100, 200, 400], [0.03, 0.029, 0.028])  # flat (noise): fixed cost, a token slope
    assert b == pytest.approx(0.029) and a * 400 == pytest.approx(0.001 * b)


class _Recording(SlowDevice):
    """A slow device that records what each profiled pass measured."""

    def __init__(self, factor: float) -> None:
        super().__init__(factor, clock="wall")
        self.measured: list[float] = []

    def stretched(self, compute_seconds: float, cpu_seconds: float) -> float:
        self.measured.append(compute_seconds)
        return super().stretched(compute_seconds, cpu_seconds)


def test_profile_goes_through_the_slow_down_so_a_4x_device_profiles_4x_slower(ctx: DistContext) -> None:
    runner = build_step_runner(CONFIG, ctx)
    samples = synthetic_samples([40, 30, 50, 20], num_features=4, num_classes=3)
    slow = _Recording(4.0)
    sizes, seconds = profile_runner(runner, samples, [2, 8], slow)
    assert sizes == [70, 280]  # the samples in turn: 40 + 30, then twice all four
    assert len(slow.measured) == 2 * (1 + 3)  # per batch a warm-up pass, then three timed
    for i, t in enumerate(seconds):  # each the least of its three passes, stretched 4x as the rank's steps are
        assert t == pytest.approx(4 * min(slow.measured[4 * i + 1: 4 * i + 4]))
    assert all(t > 0 for t in seconds)


def test_profile_leaves_the_model_as_it_was(ctx: DistContext) -> None:
    runner = build_step_runner(CONFIG, ctx)
    module = runner.model.module
    module.register_buffer("running", torch.zeros(3))  # a float buffer the forward pass changes, like batch norm
    original_forward = module.forward

    def forward(batch: object) -> torch.Tensor:
        module.running += 1.0
        return original_forward(batch)

    module.forward = forward  # type: ignore[method-assign]
    before = {k: v.clone() for k, v in module.state_dict().items()}
    profile_runner(runner, synthetic_samples([40, 30], num_features=4, num_classes=3), [1, 4])
    after = module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in module.parameters())


def test_profile_needs_a_sample(ctx: DistContext) -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        profile_runner(build_step_runner(CONFIG, ctx), [], [1, 2])


def test_train_reports_setup_errors_as_configuration_errors() -> None:
    result = CliRunner().invoke(app, [
        "--set", "kafka.bootstrap_servers=127.0.0.1:1", "--set", "trainer.device=cpu", "--set", "metrics.port=0",
        "--set", "trainer.collate=no_such_module_xyz:collate", "train", "--device-id", "d0",
    ])
    assert result.exit_code == 2, result.output
    assert "trainer.collate" in result.output and "no_such_module_xyz" in result.output


def test_train_lets_a_bug_surface_with_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamtrain.trainer import rank as trainer_rank

    def broken(*_: object) -> int:
        raise ValueError("an honest bug, not a setting")

    monkeypatch.setattr(trainer_rank, "run_rank", broken)
    result = CliRunner().invoke(app, ["--set", "trainer.device=cpu", "train", "--device-id", "d0"])
    assert result.exit_code == 1
    assert isinstance(result.exception, ValueError) and "honest bug" in str(result.exception)

