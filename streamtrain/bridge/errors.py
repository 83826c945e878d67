"""The bridge's errors: a setting that cannot work (exit 2), and a failure it cannot ride out (exit 1)."""

from __future__ import annotations

__all__ = ["BridgeFatalError", "BridgeSetupError"]


class BridgeSetupError(ValueError):
    """A setting the bridge cannot start with; the message names it."""


class BridgeFatalError(RuntimeError):
    """The bridge must stop: fenced by a newer instance with its transactional id, or a fatal producer error.

    Nothing is lost: the open transaction is aborted (by the newer instance, or by the broker's transaction
    timeout), and the records it held are bridged again from the committed offsets.
    """
