"""`DeviceProfile`: a trainer rank's start-up profile of its own speed, sent on the feedback topic before step 0.

A record of its own (not a `StepFeedback`) so that everything that reads steps from the feedback topic (the
coordinator's time model, the run report, the benchmarks) never mistakes it for one; the coordinator decodes it
where a `StepFeedback` does not fit (`SchemaMismatchError`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .records import _fields_of, now_ms

__all__ = ["DeviceProfile"]


@dataclass(frozen=True)
class DeviceProfile:
    """Compute seconds of a few batches of one rank's own samples, and the line `T = slope·size + intercept`."""

    SCHEMA: ClassVar[str] = "DeviceProfile"

    job: str
    device_id: str
    rank: int
    sizes: tuple[int, ...]
    """Total size of each profiled batch."""
    seconds: tuple[float, ...]
    """Compute seconds of each, an emulated slow-down included."""
    slope: float
    """a: seconds per unit of size."""
    intercept: float
    """b: fixed seconds per step."""
    mean_sample_size: float
    """Mean size of the samples the batches were made of."""
    profile_seconds: float = 0.0
    """Wall time the profile took."""
    sent_at: int = field(default_factory=now_ms)

    def problem(self) -> str | None:
        """Why a coordinator must not plan from this profile (a broken or forged record), or None."""
        numbers = (self.slope, self.intercept, self.mean_sample_size, *self.seconds)
        if not all(math.isfinite(x) and x >= 0 for x in numbers):
            return "a slope, intercept, mean sample size or time is negative or not finite"
        if self.slope <= 0 and self.intercept <= 0:
            return "slope and intercept are both 0: a device that trains any batch in no time"
        if self.mean_sample_size < 1:
            return f"mean sample size {self.mean_sample_size:g} is below 1 (every sample has size >= 1)"
        if len(self.sizes) != len(self.seconds):
            return f"{len(self.sizes)} sizes but {len(self.seconds)} times"
        return None

    def to_dict(self) -> dict[str, Any]:
        return _fields_of(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeviceProfile:
        return cls(**{**d, "sizes": tuple(d.get("sizes", ())), "seconds": tuple(d.get("seconds", ()))})
