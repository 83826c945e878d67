"""The synthetic task, label skew and data injection."""

from __future__ import annotations

import numpy as np
import pytest

from streamtrain.config import ProducerConfig
from streamtrain.config.producer import InjectionConfig
from streamtrain.producers.injection import InjectionPlanner, injection_counts
from streamtrain.producers.sources import SyntheticSource
from streamtrain.producers.synthetic import device_label_sets
from streamtrain.synthetic import class_prototypes, make_batch


def test_iid_devices_see_every_class() -> None:
    sets = device_label_sets(4, 10, None)
    assert all(s.tolist() == list(range(10)) for s in sets)


def test_non_iid_label_sets_are_disjoint_when_they_fit() -> None:
    sets = device_label_sets(5, 10, 2)
    assert [s.tolist() for s in sets] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


def test_non_iid_label_sets_wrap_and_cover_every_class() -> None:
    sets = device_label_sets(25, 100, 4)  # ScaDLES' CIFAR100 split: 4 labels on each of 25 devices
    assert all(len(s) == 4 for s in sets)
    assert sorted(np.concatenate(sets).tolist()) == list(range(100))
    wrapped = device_label_sets(7, 10, 3)
    assert set(np.concatenate(wrapped).tolist()) == set(range(10))


def test_synthetic_source_draws_only_each_devices_labels() -> None:
    cfg = ProducerConfig.model_validate({"devices": 3, "synthetic": {"classes": 9, "labels_per_device": 3}})
    source = SyntheticSource(cfg, 3)
    for d in range(3):
        labels = {draft.label for draft in source.take(d, 600)}
        assert labels == {3 * d, 3 * d + 1, 3 * d + 2}


def test_payload_shapes_follow_sizes_and_features() -> None:
    cfg = ProducerConfig.model_validate({"synthetic": {"features": 7}, "size": {"kind": "normal", "mean": 20,
                                                                               "dif": 5}})
    drafts = SyntheticSource(cfg, 1).take(0, 500)
    assert all(d.array.dtype == np.float32 and d.array.ndim == 2 and d.array.shape[1] == 7 for d in drafts)
    assert np.std([d.array.shape[0] for d in drafts]) == pytest.approx(5, rel=0.2)


def test_labels_are_learnable_from_the_payload() -> None:
    protos = class_prototypes(10, 16, 0.5, task_seed=0)
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 10, size=2000)
    sizes = rng.integers(10, 60, size=2000)
    payloads = make_batch(sizes, labels, protos, rng)
    means = np.stack([p.mean(axis=0) for p in payloads])
    guess = np.argmin(((means[:, None, :] - protos[None]) ** 2).sum(axis=2), axis=1)
    assert np.mean(guess == labels) > 0.9  # nearest prototype of the mean-pooled sample
    assert np.allclose(class_prototypes(10, 16, 0.5, task_seed=0), protos)  # same seed, same task


def test_injection_counts_are_exact_per_round() -> None:
    cfg = InjectionConfig(alpha=0.5, beta=0.25, round_samples=16)
    devices = 5
    planner = InjectionPlanner(cfg, devices, np.random.default_rng(0))
    m, q = injection_counts(cfg, devices)
    assert (m, q) == (4, 2)
    received = np.zeros(devices, dtype=int)
    rounds = 10
    for d in range(devices):
        sent = 0
        for _ in range(rounds * cfg.round_samples):
            targets = planner.targets(d)
            assert d not in targets
            sent += len(targets)
            received[targets] += 1
        assert sent == rounds * m * q
    assert received.sum() == devices * rounds * m * q


def test_small_fractions_still_inject_at_least_one() -> None:
    assert injection_counts(InjectionConfig(alpha=0.05, beta=0.05, round_samples=64), 4) == (3, 1)
    assert injection_counts(InjectionConfig(alpha=0.0, beta=0.5), 4) == (0, 0)
    assert injection_counts(InjectionConfig(alpha=1.0, beta=1.0, round_samples=8), 4) == (8, 3)
