"""Running and windowed metric sums: what test-then-train figures are made of, in a rank and in a report."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from .base import add_sums

__all__ = ["SumWindow"]


class SumWindow:
    """The sums of every step so far (`running`) and of the last `steps` steps that had any (`recent`).

    Args:
        steps: Steps the window covers (steps with no sums, those that trained nothing, do not count).
    """

    def __init__(self, steps: int) -> None:
        if steps < 1:
            raise ValueError(f"a window covers at least one step, got {steps}")
        self.running: dict[str, float] = {}
        self._recent: deque[Mapping[str, float]] = deque(maxlen=steps)

    def add(self, sums: Mapping[str, float]) -> None:
        """Fold one step's sums in (empty sums are ignored)."""
        if not sums:
            return
        add_sums(self.running, sums)
        self._recent.append(dict(sums))

    @property
    def recent(self) -> dict[str, float]:
        """The sums of the window's steps."""
        out: dict[str, float] = {}
        for sums in self._recent:
            add_sums(out, sums)
        return out
