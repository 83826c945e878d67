"""The one error type for model, collate and objective settings that cannot work."""

from __future__ import annotations

__all__ = ["SetupError"]


class SetupError(ValueError):
    """A setting, environment variable or topic layout a service cannot start with; the message names it.

    `streamtrain train` and `streamtrain serve` report these as configuration errors (exit 2). Any other
    exception is a bug or an outage and surfaces with its traceback.
    """
