"""What every truncation policy of `bench truncation` runs on: the same seeds, streams, model and window."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamtrain.config import ProducerConfig
from streamtrain.config.trainer import TrainerConfig

from ..streams import StreamsSetup

__all__ = ["POLICIES", "TruncationSetup"]

#: The truncation policies, in the order they run.
POLICIES: tuple[str, ...] = ("persist", "truncate", "bounded")


class TruncationSetup(StreamsSetup):
    """What every policy of the truncation benchmark runs on (same seeds, same data); service logs and
    checkpoints go to work_dir/<policy> (default <out>/truncation-runs). `b_max` is what makes the streams
    outrun training."""

    steps: int = 400
    """Steps per policy, counted from the first step that trains a streamed sample."""
    signal: float = 0.1
    hidden_size: int = 64
    num_layers: int = 2
    checkpoint_every: int = 2
    run_timeout_s: float = 300.0
    heldout: int = 2000
    policies: tuple[str, ...] = POLICIES
    quick: bool = False
    """Whether `--quick` chose the devices and steps (a note for the reader of the JSON)."""

    def producer_sets(self) -> dict[str, object]:
        return {
            "producer.devices": self.devices, "producer.device_ids": self.device_ids(),
            "producer.rate.rates": self.stream_rates(), "producer.seed": self.seed,
            "producer.size.kind": "normal" if self.size_dif > 0 else "fixed", "producer.size.mean": self.size_mean,
            "producer.size.dif": self.size_dif, "producer.synthetic.features": self.features,
            "producer.synthetic.classes": self.classes, "producer.synthetic.signal": self.signal,
            "producer.duration_seconds": 0, "producer.tick_seconds": 0.01, "producer.metrics": False,
        }

    def trainer_config(self, checkpoint_dir: Path | None = None) -> TrainerConfig:
        return TrainerConfig(
            device="cpu", backend="gloo", torch_threads=1, num_features=self.features, num_classes=self.classes,
            hidden_size=self.hidden_size, num_layers=self.num_layers, seed=self.seed, plan_wait_seconds=1.0,
            data_wait_seconds=0.5, checkpoint_dir=checkpoint_dir, checkpoint_every=self.checkpoint_every, log_every=10,
            metrics=False)

    def trainer_sets(self, checkpoint_dir: Path) -> dict[str, object]:
        cfg = self.trainer_config(checkpoint_dir)
        keys = ("device", "backend", "torch_threads", "num_features", "num_classes", "hidden_size", "num_layers",
                "seed", "plan_wait_seconds", "data_wait_seconds", "checkpoint_every", "log_every", "metrics")
        return {f"trainer.{k}": getattr(cfg, k) for k in keys}

    def coordinator_sets(self, policy: str) -> dict[str, object]:
        sets: dict[str, object] = {
            "coordinator.devices": self.device_ids(), "coordinator.policy": self.planner,
            "coordinator.truncation": policy, "coordinator.delete_records": policy != "persist",
            "coordinator.delete_trained": policy != "persist",
            "coordinator.b_max": self.b_max, "coordinator.poll_interval_seconds": 0.5,
            "coordinator.feedback_wait_seconds": 0.5, "coordinator.seed": self.seed,
        }
        if policy == "bounded":
            sets["coordinator.max_lag_samples"] = self.max_lag_samples
        return sets

    def heldout_samples(self) -> list[Any]:
        """Held-out samples of the same task and devices (another seed of the same streams)."""
        from producers.sources import SyntheticSource
        from streamtrain.wire import Sample

        sets = {k.removeprefix("producer."): v for k, v in self.producer_sets().items()}
        nested: dict[str, Any] = {}
        for key, value in sets.items():
            head, _, tail = key.partition(".")
            if tail:
                nested.setdefault(head, {})[tail] = value
            else:
                nested[key] = value
        nested["seed"] = self.seed + 10_007
        cfg = ProducerConfig.model_validate(nested)
        source = SyntheticSource(cfg, self.devices)
        per = max(1, self.heldout // self.devices)
        return [Sample.from_array(f"heldout-{d}", i, s.array, label=s.label)
                for d in range(self.devices) for i, s in enumerate(source.take(d, per))]
