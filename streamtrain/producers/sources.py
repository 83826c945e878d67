"""Where each device's samples come from: the synthetic task, or a sharded real dataset.

A source hands out `Draft`s (payload, label, metadata) per device; the service stamps them with
the device id, its next seq and the production time. Each device draws from its own generator
(seeded by the run seed and the device index), so a run is reproducible whatever the pacing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from streamtrain.config.producer import ProducerConfig
from streamtrain.config.trainer import TrainerConfig
from streamtrain.datasets import (
    Dataset,
    SeriesTooShort,
    is_one_series,
    load_dataset,
    load_sizes,
    packaged_file,
    split_series,
)
from streamtrain.synthetic import make_batch

from .sharding import ShardPlan, shard
from .sizes import SizeSampler, make_size_sampler
from .synthetic import device_label_sets, draw_labels, task_from_config

__all__ = ["DatasetSource", "Draft", "SampleSource", "SyntheticSource", "build_source"]

logger = logging.getLogger(__name__)

# Samples generated per device at a time: per-call numpy overhead would otherwise dominate at
# high rates with a few samples due per device per tick.
_CHUNK = 256


@dataclass(frozen=True)
class Draft:
    """A sample before it is stamped with its device, seq and time."""

    array: np.ndarray
    label: int | None
    metadata: dict[str, str] = field(default_factory=dict)
    target: np.ndarray | None = None
    """The float target (regression values, multi-label tags), when the dataset carries one."""


class SampleSource(Protocol):
    """Per-device supply of samples."""

    def take(self, device: int, n: int) -> list[Draft]:
        """Up to `n` next samples of `device` (fewer only when its stream has ended)."""
        ...

    def exhausted(self, device: int) -> bool:
        """Whether `device`'s stream has ended (a dataset replayed once)."""
        ...


def device_rng(seed: int, device: int, purpose: int) -> np.random.Generator:
    """The generator of one device for one purpose (0 sizes/payloads, 1 sharding, 2 injection, ...)."""
    return np.random.default_rng([seed, device, purpose])


class SyntheticSource:
    """The synthetic task (see `producers.synthetic`) with sizes from a size model.

    Args:
        cfg: the producer settings (synthetic task, size model, seed).
        devices: number of devices.
        sizes: the size sampler (built from `cfg.size` when not given).
    """

    def __init__(self, cfg: ProducerConfig, devices: int, sizes: SizeSampler | None = None) -> None:
        self.prototypes = task_from_config(cfg.synthetic)
        self.label_sets = device_label_sets(devices, cfg.synthetic.classes, cfg.synthetic.labels_per_device)
        self.sizes = sizes if sizes is not None else make_size_sampler(cfg.size, _replay_sizes(cfg))
        self._rngs = [device_rng(cfg.seed, d, 0) for d in range(devices)]
        self._buffers: list[list[Draft]] = [[] for _ in range(devices)]

    def _refill(self, device: int, n: int) -> None:
        rng = self._rngs[device]
        sizes = self.sizes(rng, n)
        labels = draw_labels(self.label_sets[device], n, rng)
        arrays = make_batch(sizes, labels, self.prototypes, rng)
        # Reversed so that pop() from the end hands samples out in generation order.
        self._buffers[device] = [Draft(a, int(y)) for a, y in zip(arrays, labels, strict=True)][::-1]

    def take(self, device: int, n: int) -> list[Draft]:
        """The next `n` samples of `device`."""
        out: list[Draft] = []
        buf = self._buffers[device]
        while len(out) < n:
            if not buf:
                self._refill(device, max(_CHUNK, n - len(out)))
                buf = self._buffers[device]
            out.append(buf.pop())
        return out

    def exhausted(self, device: int) -> bool:
        """Never: the synthetic stream is endless."""
        return False


class DatasetSource:
    """A real dataset sharded across devices and replayed shard by shard.

    Args:
        dataset: the loaded samples.
        plan: which samples each device replays.
        seed: run seed (shuffling each pass).
        loop: start a shard again when it is exhausted.
        shuffle: shuffle each pass of a shard.
    """

    def __init__(self, dataset: Dataset, plan: ShardPlan, seed: int, loop: bool = True, shuffle: bool = True) -> None:
        self.dataset = dataset
        self.plan = plan
        self.loop = loop
        self.shuffle = shuffle
        self._rngs = [device_rng(seed, d, 3) for d in range(len(plan.shards))]
        self._order = [self._pass(d) for d in range(len(plan.shards))]
        self._pos = [0] * len(plan.shards)
        self._passes = [0] * len(plan.shards)

    def _pass(self, device: int) -> np.ndarray:
        idx = self.plan.shards[device]
        return self._rngs[device].permutation(idx) if self.shuffle else idx

    def exhausted(self, device: int) -> bool:
        """Whether the device has replayed its shard and does not loop (or its shard is empty)."""
        order = self._order[device]
        return len(order) == 0 or (not self.loop and self._pos[device] >= len(order))

    def take(self, device: int, n: int) -> list[Draft]:
        """Up to `n` next samples of the device's shard."""
        out: list[Draft] = []
        while len(out) < n and not self.exhausted(device):
            order = self._order[device]
            if self._pos[device] >= len(order):
                self._order[device] = self._pass(device)
                self._pos[device] = 0
                self._passes[device] += 1
                continue
            i = int(order[self._pos[device]])
            self._pos[device] += 1
            label = int(self.dataset.labels[i])
            target = self.dataset.targets[i] if self.dataset.targets is not None else None
            out.append(Draft(self.dataset.samples[i], label if label >= 0 else None,
                             {"source": Path(self.dataset.sources[i]).name}, target))
        return out


def _replay_sizes(cfg: ProducerConfig) -> np.ndarray | None:
    if cfg.size.kind != "replay" or cfg.size.path is None:
        return None
    return load_sizes(cfg.size.path)


def _training_windows(dataset: Dataset, cfg: ProducerConfig, path: Path) -> Dataset:
    """One series over time (a CSV with no label, sample or target column) as the windows `up --dataset` trains on
    (`streamtrain.datasets.split_series`: `producer.dataset.window`, `stride`, `held_out_share`), its held-out tail
    not produced; an unset window is the default for the default `trainer.horizon`.

    Raises:
        ValueError: the series is too short for one window and the tail (the message says what to set).
    """
    ds = cfg.dataset
    horizon = TrainerConfig.model_fields["horizon"].default
    try:
        cut = split_series(dataset.samples[0], horizon, ds.window, ds.stride, ds.held_out_share, where=str(path))
    except SeriesTooShort as exc:
        raise ValueError(str(exc)) from None
    logger.info("one series over time: %s; the held-out tail is not produced", cut.describe())
    return Dataset(cut.train, np.full(len(cut.train), -1, dtype=np.int64), [str(path)] * len(cut.train),
                   skipped=dataset.skipped)


def build_source(cfg: ProducerConfig) -> tuple[SampleSource, Dataset | None]:
    """The source `cfg` asks for: a sharded dataset when `dataset.path` or `dataset.packaged` is set, else the
    synthetic task.

    Raises:
        DatasetError: when the dataset cannot be used at all.
        ValueError: when a size model's parameters cannot be met.
    """
    devices = cfg.devices
    ds_cfg = cfg.dataset
    if ds_cfg.packaged is not None:
        path = packaged_file(ds_cfg.packaged, "train")
    elif ds_cfg.path is not None:
        path = ds_cfg.path
    else:
        return SyntheticSource(cfg, devices), None
    dataset = load_dataset(path, ds_cfg.label_column, ds_cfg.sample_column, ds_cfg.class_names,
                           ds_cfg.target_columns)
    if is_one_series(dataset):
        dataset = _training_windows(dataset, cfg, path)
    if ds_cfg.sharding in ("stratified",) and not dataset.labelled:
        raise ValueError(f"dataset.sharding: stratified sharding needs labels; {path} has unlabelled samples")
    if cfg.size.kind != "fixed" or cfg.size.dif:
        logger.warning("size settings are ignored: a replayed dataset publishes its samples' own sizes")
    plan = shard(ds_cfg.sharding, dataset.samples, dataset.labels, devices,
                 device_rng(cfg.seed, 0, 1), ds_cfg.neighbourhoods, ds_cfg.pca_components)
    logger.info("dataset %s: %d samples (%d files skipped), %s sharding over %d devices: %s samples each",
                path, len(dataset), len(dataset.skipped), ds_cfg.sharding, devices,
                "/".join(str(len(s)) for s in plan.shards[:8]) + ("/..." if devices > 8 else ""))
    return DatasetSource(dataset, plan, cfg.seed, ds_cfg.loop, ds_cfg.shuffle), dataset
