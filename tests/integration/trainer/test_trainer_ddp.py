"""Multi-rank DDP on gloo: weighted aggregation is exact, plain averaging is biased, Top-k agrees.

One spawn of three ranks runs every scenario (see `trainer_ranks.py`), because starting ranks is
the expensive part; each test then checks one scenario against a single-process reference.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from trainer_ranks import (
    BASE,
    COUNTS,
    HELD_OUT,
    NAN_MODEL,
    OBJECTIVES,
    RIDGE,
    backlog,
    reference_sgd,
    reference_size_weighted_grads,
    run_ranks,
    step_samples,
    write_held_out,
)

from streamtrain.datasets import load_dataset
from streamtrain.models import build_collate
from streamtrain.models.batching import collate_packed
from streamtrain.models.plugins import build_model
from streamtrain.models.ridge import RidgeHead
from streamtrain.models.whole import HOLDOUT_SHARE, whole_series_features
from streamtrain.objectives import build_objective
from streamtrain.trainer.compression import topk
from streamtrain.wire import Sample

pytestmark = pytest.mark.integration

WORLD = 3


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    out: Path = tmp_path_factory.mktemp("ranks")
    return run_ranks(WORLD, out)


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _ranks_agree(per_rank: list[dict[str, Any]]) -> None:
    for other in per_rank[1:]:
        assert _max_diff(per_rank[0]["params"], other["params"]) == 0.0


def test_weighted_hook_equals_sgd_on_the_union(observed: dict[str, list[dict[str, Any]]]) -> None:
    runs = observed["weighted"]
    _ranks_agree(runs)
    expected, _ = reference_sgd(BASE, WORLD)
    assert _max_diff(runs[0]["params"], expected) < 1e-9


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_weighted_hook_equals_sgd_on_the_union_for_every_objective(observed: dict[str, list[dict[str, Any]]],
                                                                   name: str) -> None:
    runs = observed[f"weighted_{name}"]
    _ranks_agree(runs)
    scores: list[dict[str, float]] = []
    expected, _ = reference_sgd(OBJECTIVES[name], WORLD, scores=scores)
    assert _max_diff(runs[0]["params"], expected) < 1e-9
    # Test-then-train from each rank's own forward pass adds up to the union's score under the pre-step model (the
    # baseline's sums aside: each rank's baseline has seen its own device's targets).
    busy = [step for step, counts in enumerate(COUNTS) if sum(counts)]
    for step, union in zip(busy, scores, strict=True):
        fleet: dict[str, float] = {}
        for run in runs:
            for key, value in run["results"][step].prequential.items():
                fleet[key] = fleet.get(key, 0.0) + value
        assert fleet.keys() == union.keys()
        for key in (k for k in union if not k.startswith("baseline_")):
            assert fleet[key] == pytest.approx(union[key], rel=1e-9, abs=1e-12), (step, key)


def test_classification_scores_test_then_train_exactly(observed: dict[str, list[dict[str, Any]]]) -> None:
    scores: list[dict[str, float]] = []
    reference_sgd(BASE, WORLD, scores=scores)
    busy = [step for step, counts in enumerate(COUNTS) if sum(counts)]
    for step, union in zip(busy, scores, strict=True):
        fleet = {k: sum(run["results"][step].prequential.get(k, 0.0) for run in observed["weighted"])
                 for k in ("count", "loss_sum", "correct")}
        assert fleet == pytest.approx({k: union[k] for k in fleet}, rel=1e-9)
    for rank, run in enumerate(observed["weighted"]):
        for step, result in enumerate(run["results"]):
            assert (result.prequential.get("count") or 0) == COUNTS[step][rank]


def test_idle_ranks_report_no_loss_and_weight_zero(observed: dict[str, list[dict[str, Any]]]) -> None:
    for rank, run in enumerate(observed["weighted"]):
        for step, result in enumerate(run["results"]):
            own = COUNTS[step][rank]
            assert result.samples == own and result.weight == own
            assert (result.loss is None) == (own == 0)
            assert result.global_samples == sum(COUNTS[step]) == result.global_weight
            assert result.stepped == (sum(COUNTS[step]) > 0)
            assert result.group_backlog == sum(backlog(step, r) for r in range(WORLD))
            assert result.comm_seconds >= 0 and result.compute_seconds >= 0 and result.memory_bytes > 0


def test_plain_average_is_biased(observed: dict[str, list[dict[str, Any]]]) -> None:
    runs = observed["mean"]
    _ranks_agree(runs)
    expected, _ = reference_sgd(BASE, WORLD)
    assert _max_diff(runs[0]["params"], expected) > 1e-3


def test_learning_rate_scales_linearly_with_the_global_batch(observed: dict[str, list[dict[str, Any]]]) -> None:
    _, lrs = reference_sgd(BASE, WORLD)
    for run in observed["weighted"]:
        got = [r.lr for r in run["results"]]
        assert got == pytest.approx([BASE.lr * sum(c) / BASE.base_batch for c in COUNTS])
        assert got == pytest.approx(lrs)
    unscaled = BASE.model_copy(update={"lr_scaling": False})
    expected, _ = reference_sgd(unscaled, WORLD)
    runs = observed["no_lr_scaling"]
    assert all(r.lr == BASE.lr for r in runs[0]["results"])
    assert _max_diff(runs[0]["params"], expected) < 1e-9


def test_topk_with_large_delta_compresses_every_bucket(observed: dict[str, list[dict[str, Any]]]) -> None:
    runs = observed["topk_always"]
    _ranks_agree(runs)
    buckets, compressed = runs[0]["decisions"]
    assert buckets > len(COUNTS) and compressed == buckets
    assert runs[0]["compressed_step_ratio"] == 1.0
    dense, _ = reference_sgd(BASE, WORLD)
    assert _max_diff(runs[0]["params"], dense) > 1e-6  # sparsified updates really differ


def test_topk_with_zero_delta_stays_dense_and_exact(observed: dict[str, list[dict[str, Any]]]) -> None:
    runs = observed["topk_never"]
    _ranks_agree(runs)
    # delta = 0 sends sparse only what Top-k keeps losslessly: here just the all-idle step's zeros.
    for run in runs:
        for step, result in enumerate(run["results"]):
            idle = sum(COUNTS[step]) == 0
            assert result.compressed_buckets == (result.buckets if idle else 0)
    idle_steps = sum(1 for c in COUNTS if sum(c) == 0)
    assert runs[0]["compressed_step_ratio"] == pytest.approx(idle_steps / len(COUNTS))
    expected, _ = reference_sgd(BASE, WORLD)
    assert _max_diff(runs[0]["params"], expected) < 1e-9


def test_sparse_reduction_sums_each_ranks_topk(observed: dict[str, list[dict[str, Any]]]) -> None:
    per_rank = observed["compressor_votes"]
    k = math.ceil(0.1 * 200)
    expected = torch.zeros(200, dtype=torch.float64)
    for run in per_rank:
        index, values = topk(run["input"], k)
        expected.index_add_(0, index, values)
    for run in per_rank:
        torch.testing.assert_close(run["sparse"], expected, rtol=0, atol=1e-12)


def test_ranks_agree_on_dense_when_any_rank_would_lose_energy(observed: dict[str, list[dict[str, Any]]]) -> None:
    per_rank = observed["compressor_votes"]
    dense_sum = sum(run["mixed_input"] for run in per_rank)
    for run in per_rank:
        assert run["mixed_decisions"] == [False]
        torch.testing.assert_close(run["mixed"], dense_sum, rtol=0, atol=1e-12)


def test_size_weighting_uses_each_ranks_total_size(observed: dict[str, list[dict[str, Any]]]) -> None:
    expected = reference_size_weighted_grads(WORLD)
    sizes = [sum(s.size for s in step_samples(0, rank)) for rank in range(WORLD)]
    for rank, run in enumerate(observed["size_weighted"]):
        assert run["result"].weight == sizes[rank] and run["result"].global_weight == sum(sizes)
        assert _max_diff(run["grads"], expected) < 1e-12


@pytest.mark.parametrize("scenario", ["non_finite", "non_finite_topk"])
def test_a_non_finite_loss_on_one_rank_skips_the_step_on_every_rank(
    observed: dict[str, list[dict[str, Any]]], scenario: str
) -> None:
    runs = observed[scenario]
    _ranks_agree(runs)
    for rank, run in enumerate(runs):
        verdicts = [(r.skipped, r.stepped) for r in run["results"]]
        # Step 1 skipped everywhere (rank 1's loss is NaN); step 2 is the empty one; 0 and 3 train.
        assert verdicts == [(False, True), (True, False), (False, False), (False, True)], (rank, verdicts)
        assert run["results"][1].grad_norm is not None and math.isnan(run["results"][1].grad_norm)
        assert (rank == 1) == (run["results"][1].loss is not None and math.isnan(run["results"][1].loss))
    if scenario == "non_finite":  # dense: exactly SGD on the union of the steps that were not skipped
        expected, _ = reference_sgd(NAN_MODEL, WORLD, skipped=(1,))
        assert _max_diff(runs[0]["params"], expected) < 1e-9
    assert all(torch.isfinite(v).all() for v in runs[0]["params"].values())


def test_seqflats_ridge_head_fits_every_ranks_samples_as_one_process_would(
        observed: dict[str, list[dict[str, Any]]]) -> None:
    """Through the trainer's once-a-step hook, with idle ranks: each rank's ridge line is the one a single process
    fits to the union of the samples trained on (rank 0's held-out ones left out, as the model holds them out)."""
    per_rank = [r["ridge"] for r in observed["ridge"]]
    for other in observed["ridge"][1:]:
        assert all(torch.equal(per_rank[0][k], other["ridge"][k]) for k in per_rank[0])
        assert all(torch.equal(a, b) for a, b in zip(observed["ridge"][0]["sums"], other["sums"], strict=True))
    config, reference = RIDGE, RidgeHead(
        2 * RIDGE.num_features * (RIDGE.series_points + 1), RIDGE.target_width).double()
    objective, collate = build_objective(config), build_collate(config)
    for step in range(len(COUNTS)):
        for rank in range(WORLD):
            samples = step_samples(step, rank, config)
            if not samples:
                continue
            batch = collate(samples, config)
            held = batch.draws < min(0.5, HOLDOUT_SHARE * WORLD) if rank == 0 else None
            reference.observe(whole_series_features(batch, config.series_points), objective.fitting_target(batch),
                              None if held is None else ~held, batch.draws)
    reference.refit()
    kept = sum(len(step_samples(step, rank, config)) for step in range(len(COUNTS)) for rank in range(WORLD))
    assert 0 < float(per_rank[0]["fitted"]) == float(reference.fitted) < kept  # rank 0 held some out
    for summed, alone in zip(observed["ridge"][0]["sums"], reference._sums, strict=True):
        torch.testing.assert_close(summed, alone, rtol=1e-12, atol=1e-12)
    # The same penalty; the lines agree as far as the fewer samples than features leave them determined.
    assert float(per_rank[0]["penalty"]) == float(reference.penalty)
    torch.testing.assert_close(per_rank[0]["weight"], reference.weight, rtol=1e-3, atol=1e-6)


def test_four_ranks_with_idle_ones_match_sgd_on_the_union(tmp_path: Path) -> None:
    runs = run_ranks(4, tmp_path, ["weighted"])["weighted"]
    _ranks_agree(runs)
    expected, _ = reference_sgd(BASE, 4)
    assert _max_diff(runs[0]["params"], expected) < 1e-9


def test_held_out_evaluation_sharded_over_ranks_equals_one_process(observed: dict[str, list[dict[str, Any]]],
                                                                   tmp_path: Path) -> None:
    runs = observed["heldout"]
    results = [replace(run["result"], seconds=0.0) for run in runs]
    assert results == [results[0]] * WORLD  # one all-reduce: every rank holds the same result
    assert sum(run["own_samples"] for run in runs) == results[0].samples == HELD_OUT  # disjoint slices, all of it
    sizes = [run["own_size"] for run in runs]
    assert max(sizes) - min(sizes) <= 30  # dealt by size: no rank holds much more than another
    # The reference: one process, the whole set, the same initial weights.
    data = load_dataset(write_held_out(tmp_path / "held.npz"))
    samples = [Sample.from_array("r", i, x, label=int(y)) for i, (x, y) in enumerate(zip(data.samples, data.labels,
                                                                                          strict=True))]
    batch = collate_packed(samples, BASE)
    with torch.no_grad():
        logits = build_model(BASE)(batch)
    assert math.isclose(results[0].loss, float(F.cross_entropy(logits, batch.labels)), rel_tol=1e-9)
    assert math.isclose(results[0].accuracy, float((logits.argmax(1) == batch.labels).double().mean()), rel_tol=1e-12)
    # Later evaluations add the sums up in one all-reduce of the names the first gathered; a rank that gives a name
    # the others do not know sends every rank back to a gather, once, and its sum is counted.
    assert [run["gathers"] for run in runs] == [[1, 0, 1, 0]] * WORLD
    for run in runs:
        again = [replace(r, seconds=0.0, step=0) for r in run["results"]]
        assert again == [again[0]] * 4 and again[0] == results[0]
        first, _, third, fourth = run["sums"]
        assert third.pop("rank_1_only") == fourth.pop("rank_1_only") == 2.0 * runs[1]["batches"]
        assert first == third == fourth
