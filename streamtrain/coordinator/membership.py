"""Which devices are present: the ones the coordinator plans for and waits for.

A trainer node can go away (host lost, cut off) while the others go on: under torchrun's elastic
agent the surviving nodes restart without it and train their own devices. Planning for the absent
devices would make every step wait `plan_wait_seconds` for feedback that is not coming, and hand
out batches nobody trains. So a device is *absent* once both hold:

- no feedback from it for `absent_after` seconds, and
- since its last feedback, a plan went out without its feedback (the others carried on).

The second condition keeps a whole group that paused together (a broker outage, a restart of every
rank) from being declared absent when it comes back: no plan went out while it was silent. An
absent device is present again with its next feedback. Pure bookkeeping: the caller says when.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

__all__ = ["Membership"]

logger = logging.getLogger(__name__)


class Membership:
    """Presence of devices from their feedback and the plans that went out without it.

    Args:
        absent_after: seconds of silence (with a plan gone out without the device) after which it is
            absent; 0 never declares a device absent.
    """

    def __init__(self, absent_after: float) -> None:
        if absent_after < 0:
            raise ValueError(f"absent_after {absent_after} must be >= 0")
        self.absent_after = absent_after
        self.absent: set[str] = set()
        """Devices left out of plans until they report again."""
        self._heard: dict[str, float] = {}
        self._passed_over: set[str] = set()
        self._since: float | None = None  # the fleet's first feedback: a device never heard is silent since then

    def heard(self, device: str, at: float) -> bool:
        """Feedback from `device` arrived at `at` (monotonic seconds); True when it was absent until now."""
        self._heard[device] = max(at, self._heard.get(device, at))
        if self._since is None:
            self._since = at
        self._passed_over.discard(device)
        if device in self.absent:
            self.absent.discard(device)
            logger.info("device %s is back: plans include it again", device)
            return True
        return False

    def passed_over(self, devices: Iterable[str]) -> None:
        """A plan went out without feedback from `devices` (the bounded wait for them ran out)."""
        self._passed_over.update(devices)

    def update(self, devices: Iterable[str], now: float) -> list[str]:
        """Re-evaluate `devices` at `now` (monotonic seconds); returns those that became absent."""
        if self.absent_after <= 0 or self._since is None:
            return []
        left = []
        for device in devices:
            if device in self.absent or device not in self._passed_over:
                continue
            silent = now - self._heard.get(device, self._since)
            if silent >= self.absent_after:
                self.absent.add(device)
                left.append(device)
                logger.warning("device %s is absent: no feedback for %.0f s while plans went on without it; "
                               "plans leave it out until it reports again (its stream waits in Kafka)",
                               device, silent)
        return left

    def silent_seconds(self, device: str, now: float) -> float | None:
        """Seconds since `device`'s last feedback (None before any feedback of the fleet)."""
        if self._since is None:
            return None
        return now - self._heard.get(device, self._since)
