"""ScaDLES data injection (alpha, beta): devices share part of their stream with other devices.

Each device's own stream is cut into rounds of `round_samples` samples (one training step's worth).
At the start of a round the device picks `m = round(beta * round_samples)` of the round's samples and
`q = round(alpha * (devices - 1))` other devices (each at least 1 when its fraction is > 0); each
picked sample is also published to each picked device's topic. So every full round of a device
injects exactly m * q copies, which is what makes non-IID device streams more representative.
"""

from __future__ import annotations

import numpy as np

from streamtrain.config.producer import InjectionConfig

__all__ = ["InjectionPlanner", "injection_counts"]

_NONE = np.empty(0, dtype=np.int64)


def injection_counts(cfg: InjectionConfig, devices: int) -> tuple[int, int]:
    """(samples shared per round, recipients per shared sample) for `devices` devices."""
    if not cfg.enabled or devices < 2:
        return 0, 0
    m = max(1, round(cfg.beta * cfg.round_samples))
    q = max(1, round(cfg.alpha * (devices - 1)))
    return min(m, cfg.round_samples), min(q, devices - 1)


class InjectionPlanner:
    """Decides, sample by sample, which other devices also receive a device's sample.

    Args:
        cfg: the injection settings.
        devices: number of devices.
        rng: source of the random picks.
    """

    def __init__(self, cfg: InjectionConfig, devices: int, rng: np.random.Generator) -> None:
        self.round_samples = cfg.round_samples
        self.devices = devices
        self.rng = rng
        self.shared, self.recipients = injection_counts(cfg, devices)
        self._position = np.zeros(devices, dtype=np.int64)
        self._picked: list[np.ndarray] = [_NONE] * devices
        self._to: list[np.ndarray] = [_NONE] * devices

    @property
    def enabled(self) -> bool:
        """Whether any sample is ever injected."""
        return self.shared > 0

    def targets(self, device: int) -> np.ndarray:
        """The devices that also receive `device`'s next own sample (usually none); advances its round."""
        if not self.enabled:
            return _NONE
        pos = int(self._position[device] % self.round_samples)
        if pos == 0:
            self._picked[device] = self.rng.choice(self.round_samples, size=self.shared, replace=False)
            others = np.delete(np.arange(self.devices), device)
            self._to[device] = np.sort(self.rng.choice(others, size=self.recipients, replace=False))
        self._position[device] += 1
        return self._to[device] if pos in self._picked[device] else _NONE
