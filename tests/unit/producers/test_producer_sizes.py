"""Size models: the sizes drawn have the requested mean and DIF and never go below the floor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamtrain.config.producer import SizeConfig
from streamtrain.datasets import DatasetError, load_sizes
from streamtrain.producers.sizes import make_size_sampler, solve_truncated_normal

N = 400_000


def draw(cfg: SizeConfig, n: int = N, replay: np.ndarray | None = None) -> np.ndarray:
    return make_size_sampler(cfg, replay)(np.random.default_rng(11), n)


def test_fixed_sizes() -> None:
    sizes = draw(SizeConfig(kind="fixed", mean=45), 100)
    assert sizes.dtype == np.int64 and set(sizes.tolist()) == {45}


@pytest.mark.parametrize("dif", [1.0, 4.0, 16.0, 32.0, 40.0])
def test_normal_sizes_match_mean_and_dif(dif: float) -> None:
    sizes = draw(SizeConfig(kind="normal", mean=45, dif=dif))
    assert sizes.min() >= 1
    assert sizes.mean() == pytest.approx(45, abs=max(0.01 * 45, 4 * dif / np.sqrt(N)))
    assert sizes.std(ddof=1) == pytest.approx(dif, rel=0.02)


def test_normal_with_dif_zero_is_fixed() -> None:
    assert set(draw(SizeConfig(kind="normal", mean=45, dif=0), 1000).tolist()) == {45}


@pytest.mark.parametrize("dif", [8.0, 64.0, 200.0])
def test_lognormal_sizes_match_mean_and_dif(dif: float) -> None:
    sizes = draw(SizeConfig(kind="lognormal", mean=45, dif=dif), 2_000_000)
    assert sizes.min() >= 1
    assert sizes.mean() == pytest.approx(45, rel=0.02)
    assert sizes.std(ddof=1) == pytest.approx(dif, rel=0.1 if dif > 100 else 0.03)


def test_normal_out_of_reach_names_dif_and_suggests_lognormal() -> None:
    with pytest.raises(ValueError, match=r"size\.dif.*lognormal"):
        make_size_sampler(SizeConfig(kind="normal", mean=45, dif=64))


def test_truncated_normal_solution_has_the_moments() -> None:
    law = solve_truncated_normal(10.0, 6.0, 0.5)
    x = law.sample(np.random.default_rng(0), 1_000_000)
    assert x.min() >= 0.5
    assert x.mean() == pytest.approx(10.0, rel=0.005)
    assert x.std() == pytest.approx(6.0, rel=0.005)


def test_max_size_caps_the_tail() -> None:
    assert draw(SizeConfig(kind="lognormal", mean=45, dif=200, max_size=300)).max() <= 300


def test_replay_draws_from_the_given_sizes() -> None:
    pool = np.array([3, 3, 10, 50])
    sizes = draw(SizeConfig(kind="replay", path=Path("x")), 100_000, replay=pool)
    assert set(sizes.tolist()) == {3, 10, 50}
    assert sizes.mean() == pytest.approx(pool.mean(), rel=0.02)


def test_load_sizes_from_text_and_npy(tmp_path: Path) -> None:
    (tmp_path / "sizes.txt").write_text("# frames\n3\n7\n12\n")
    np.save(tmp_path / "sizes.npy", np.array([1, 2, 3]))
    assert load_sizes(tmp_path / "sizes.txt").tolist() == [3, 7, 12]
    assert load_sizes(tmp_path / "sizes.npy").tolist() == [1, 2, 3]


def test_load_sizes_refuses_bad_sizes(tmp_path: Path) -> None:
    (tmp_path / "bad.txt").write_text("3\n0\n")
    with pytest.raises(DatasetError, match=r"bad\.txt"):
        load_sizes(tmp_path / "bad.txt")


def test_bad_size_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="max_size"):
        SizeConfig(min_size=10, max_size=5)
    with pytest.raises(ValueError, match="needs path"):
        SizeConfig(kind="replay")
    with pytest.raises(ValueError, match="dif > 0 needs"):
        SizeConfig(kind="fixed", dif=3)
