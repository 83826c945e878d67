"""The setup the live benchmarks (`truncation`, `soak`) share: device streams at a ScaDLES rate preset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import Field

from .common import Record

__all__ = ["StreamsSetup", "preset_rates"]


def preset_rates(preset: str, devices: int, seed: int) -> list[float]:
    """Each device's rate in samples/s, drawn once from a ScaDLES rate preset (S1, S2, ...) with `seed`."""
    from producers.rates import sample_base_rates
    from streamtrain.config.producer import RateConfig

    cfg = RateConfig.model_validate({"preset": preset})
    return [round(float(r), 1) for r in sample_base_rates(cfg, devices, np.random.default_rng(seed))]


class StreamsSetup(Record):
    """Device streams at rates drawn from a preset, a coordinator planning them, the benchmark's sampling."""

    devices: int = 4
    seed: int = 0
    """Seed of the stream rates, the data and the model."""
    rate_preset: str = "S2"
    planner: str = "scadles"
    """coordinator.policy: what plans the batches."""
    b_max: int = 12
    """coordinator.b_max: most samples per device per step."""
    max_lag_samples: int = 512
    """bounded: coordinator.max_lag_samples."""
    size_mean: float = 45.0
    size_dif: float = 15.0
    features: int = 16
    classes: int = 10
    sample_every_s: float = 0.5
    """Seconds between the benchmark's readings of Kafka."""
    start_timeout_s: float = 240.0
    work_dir: Path | None = Field(default=None, exclude=True)
    """Service logs and checkpoints (default: a directory under --out)."""

    def device_ids(self) -> list[str]:
        return [str(i) for i in range(self.devices)]

    def stream_rates(self) -> list[float]:
        """Each device's rate in samples/s, drawn once from the preset with `seed` (identical in every run)."""
        return preset_rates(self.rate_preset, self.devices, self.seed)
