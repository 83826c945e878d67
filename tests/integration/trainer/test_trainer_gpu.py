"""The CUDA path: NCCL for one rank per GPU, gloo with CUDA tensors for ranks sharing a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_ranks import BASE, reference_sgd, run_ranks

pytestmark = [
    pytest.mark.integration,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_one_rank_on_nccl_matches_sgd(tmp_path: Path) -> None:
    run = run_ranks(1, tmp_path, ["cuda_nccl"])["cuda_nccl"][0]
    expected, _ = reference_sgd(BASE, 1)
    assert _max_diff(run["params"], expected) < 1e-9
    assert all(r.memory_bytes > 0 for r in run["results"])


def test_two_ranks_on_gloo_with_cuda_tensors_match_sgd_on_the_union(tmp_path: Path) -> None:
    runs = run_ranks(2, tmp_path, ["cuda_gloo"])["cuda_gloo"]
    expected, _ = reference_sgd(BASE, 2)
    for run in runs:
        assert _max_diff(run["params"], expected) < 1e-9
