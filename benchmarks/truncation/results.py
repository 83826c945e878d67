"""What `bench truncation` measures, typed, and the figures that compare its policies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ..common import Record, slope
from .setup import TruncationSetup

__all__ = ["PAPER_RATIO_RANGE", "PolicySeries", "TraceSample", "TruncationCell", "TruncationResult",
           "TruncationRunSetup", "compare_to_persist", "second_half_slope"]

#: ScaDLES Table IV: buffer size under persistence over truncation, after their runs.
PAPER_RATIO_RANGE = (848, 9429)


class TraceSample(NamedTuple):
    """What the benchmark reads from Kafka at one moment of a policy's run."""

    t: float
    """Seconds since the producers started."""
    step: int
    """Steps since the first that trained a streamed sample."""
    retained: int
    produced: int
    depth: int
    loss: float | None
    """Mean of the ranks' latest training losses."""


class PolicySeries(Record):
    """One policy's samples over the run, every `sample_every_s` seconds."""

    t: list[float]
    step: list[int]
    retained_records: list[int]
    """Records the device topics retain on the broker (high watermark - log start offset)."""
    produced_records: list[int]
    buffer_depth: list[int]
    """Samples the trainers buffer (all ranks)."""
    loss: list[float | None]

    @classmethod
    def of(cls, trace: Sequence[TraceSample]) -> PolicySeries:
        return cls(t=[x.t for x in trace], step=[x.step for x in trace], retained_records=[x.retained for x in trace],
                   produced_records=[x.produced for x in trace], buffer_depth=[x.depth for x in trace],
                   loss=[x.loss for x in trace])


class TruncationCell(Record):
    """One truncation policy's figures after its N steps."""

    policy: str
    retained_records_final: int
    retained_records_per_device: dict[str, int]
    produced_records: int
    deleted_records: int
    buffer_depth_final: int
    truncated: int
    trained_samples: int
    final_loss: float | None
    accuracy: float | None
    """Held-out accuracy of the final checkpoint (None without one)."""
    heldout_loss: float | None
    seconds: float
    retained_records_max: int
    retained_ratio_to_persist: float | None = None
    retained_slope_per_step_second_half: float | None = None
    flat: bool | None = None
    """Its retained records grow, over the second half, at under 5% of persistence's rate (None for persist)."""


class TruncationRunSetup(TruncationSetup):
    """The setup as `truncation.json` stores it: with the rates drawn and where the broker was."""

    rates: list[float]
    embedded_broker: bool


class TruncationResult(Record):
    """What `truncation.json` holds."""

    steps: int
    cells: list[TruncationCell]
    series: dict[str, PolicySeries]
    setup: TruncationRunSetup
    paper_ratio_range: tuple[int, int] = PAPER_RATIO_RANGE
    seconds: float

    def cell(self, policy: str) -> TruncationCell | None:
        return next((c for c in self.cells if c.policy == policy), None)


def second_half_slope(series: PolicySeries) -> float | None:
    """Least-squares slope of the records retained over steps, over the second half of the steps."""
    pts = list(zip(series.step, series.retained_records, strict=True))
    last = pts[-1][0] if pts else 0
    half = [(s, r) for s, r in pts if s >= last / 2]
    value = slope([float(s) for s, _ in half], [float(r) for _, r in half])
    return None if value is None else round(value, 2)


def compare_to_persist(cells: Sequence[TruncationCell], series: dict[str, PolicySeries]) -> list[TruncationCell]:
    """Each cell with its ratio of records retained to persistence's, its second-half growth, and whether that
    growth is flat next to persistence's (which keeps every record: it grows at the whole input rate)."""
    persist = next((c for c in cells if c.policy == "persist"), None)
    base = persist.retained_records_final if persist else None
    growth = second_half_slope(series["persist"]) if persist else None
    out = []
    for cell in cells:
        own = second_half_slope(series[cell.policy])
        out.append(cell.model_copy(update={
            "retained_ratio_to_persist": round(base / cell.retained_records_final, 1)
            if base and cell.retained_records_final else None,
            "retained_slope_per_step_second_half": own,
            # Flat: over the second half the retained records grow at under 5% of persistence's rate.
            "flat": None if own is None or not growth or cell.policy == "persist" else bool(own <= 0.05 * growth),
        }))
    return out
