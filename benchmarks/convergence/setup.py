"""The convergence experiment's setup: the stream, how it is split over ranks, the model and the target."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import model_validator

from streamtrain.config import ProducerConfig
from streamtrain.config.trainer import TrainerConfig
from streamtrain.wire import Sample

from ..common import Record

__all__ = ["AGGREGATIONS", "ConvergenceSetup"]

#: The cells, in the order they run and are reported.
AGGREGATIONS = ("sgd", "weighted", "plain")


class ConvergenceSetup(Record):
    """One convergence experiment: the stream, how it is split over ranks, the model and the target."""

    world: int = 4
    """gloo ranks (devices) of the weighted and plain cells."""
    steps: int = 200
    """Steps every cell trains (all cells see exactly the same samples)."""
    shares: tuple[float, ...] = (0.7, 0.2, 0.08, 0.02)
    """Expected share of each device in a step's global batch (uneven on purpose)."""
    idle_probability: float = 0.2
    """Chance that a device contributes nothing to a step (its stream stalled)."""
    batch_min: int = 16
    """Smallest global batch drawn for a step (before idle devices drop out)."""
    batch_max: int = 96
    """Largest global batch drawn for a step."""
    classes: int = 8
    features: int = 16
    labels_per_device: int = 2
    """Non-IID: classes each device sees (device i: classes 2i, 2i+1)."""
    size_mean: float = 12.0
    size_dif: float = 8.0
    """Std of sample sizes (CHRONICA's DIF)."""
    signal: float = 0.25
    """Prototype strength of the synthetic task (lower is harder)."""
    heldout: int = 2000
    """Held-out samples, drawn from the device streams in proportion to `shares`."""
    target_accuracy: float = 0.85
    """Held-out accuracy to reach (judged on the trailing mean of `smooth_steps` steps)."""
    smooth_steps: int = 5
    hidden_size: int = 32
    num_layers: int = 1
    kernel_size: int = 3
    lr: float = 0.05
    momentum: float = 0.9
    base_batch: int = 64
    seed: int = 0
    quick: bool = False
    """Whether `--quick` chose the steps and the held-out set (a note for the reader of the JSON)."""

    @model_validator(mode="before")
    @classmethod
    def _lift_notes(cls, data: Any) -> Any:
        # Files written before the setup was typed kept `quick` in a free-form `extra` dict.
        if isinstance(data, dict) and isinstance(data.get("extra"), dict):
            data = {**{k: v for k, v in data.items() if k != "extra"}, **data["extra"]}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ConvergenceSetup:
        if len(self.shares) != self.world:
            raise ValueError(f"shares has {len(self.shares)} entries for a world of {self.world}")
        if self.world * self.labels_per_device > self.classes:
            raise ValueError("world * labels_per_device must not exceed classes (disjoint device label sets)")
        if not 0 < self.target_accuracy < 1:
            raise ValueError(f"target_accuracy must be in (0, 1), got {self.target_accuracy}")
        if self.steps < 1 or self.batch_min < 1 or self.batch_max < self.batch_min:
            raise ValueError("steps >= 1 and 1 <= batch_min <= batch_max are required")
        return self

    def trainer_config(self, aggregation: str) -> TrainerConfig:
        """The trainer settings of a cell (`plain` is the trainer's `mean` aggregation)."""
        return TrainerConfig(
            num_features=self.features, num_classes=self.classes, hidden_size=self.hidden_size,
            num_layers=self.num_layers, kernel_size=self.kernel_size, precision="float32", device="cpu",
            backend="gloo", torch_threads=1, optimizer="sgd", lr=self.lr, momentum=self.momentum,
            aggregation="mean" if aggregation == "plain" else "weighted", weight_by="samples",
            lr_scaling=True, base_batch=self.base_batch, seed=self.seed, metrics=False,
        )

    def _producer_config(self, seed: int) -> ProducerConfig:
        return ProducerConfig.model_validate({
            "devices": self.world, "seed": seed, "metrics": False,
            "size": {"kind": "normal", "mean": self.size_mean, "dif": self.size_dif},
            "synthetic": {"features": self.features, "classes": self.classes,
                          "labels_per_device": self.labels_per_device, "signal": self.signal,
                          "task_seed": self.seed},
        })

    def counts(self) -> np.ndarray:
        """(steps, world) samples each device contributes to each step (zeros included)."""
        rng = np.random.default_rng([self.seed, 0xC0])
        shares = np.asarray(self.shares, dtype=np.float64)
        shares = shares / shares.sum()
        out = np.zeros((self.steps, self.world), dtype=np.int64)
        for step in range(self.steps):
            batch = int(rng.integers(self.batch_min, self.batch_max + 1))
            counts = rng.multinomial(batch, shares)
            counts[rng.random(self.world) < self.idle_probability] = 0
            out[step] = counts
        return out

    def schedule(self) -> list[list[list[Sample]]]:
        """`[step][device]` → that device's samples of the step, in stream order (deterministic)."""
        from producers.sources import SyntheticSource

        source = SyntheticSource(self._producer_config(self.seed), self.world)
        seq = [0] * self.world
        out: list[list[list[Sample]]] = []
        for row in self.counts():
            step: list[list[Sample]] = []
            for device, n in enumerate(row.tolist()):
                drafts = source.take(device, n) if n else []
                step.append([Sample.from_array(str(device), seq[device] + i, d.array, label=d.label)
                             for i, d in enumerate(drafts)])
                seq[device] += n
            out.append(step)
        return out

    def heldout_samples(self) -> list[Sample]:
        """Held-out samples from the same device streams (another seed), in proportion to `shares`."""
        from producers.sources import SyntheticSource

        source = SyntheticSource(self._producer_config(self.seed + 10_007), self.world)
        shares = np.asarray(self.shares, dtype=np.float64) / sum(self.shares)
        out: list[Sample] = []
        for device, share in enumerate(shares):
            n = max(1, round(self.heldout * share))
            out += [Sample.from_array(f"heldout-{device}", i, d.array, label=d.label)
                    for i, d in enumerate(source.take(device, n))]
        return out
