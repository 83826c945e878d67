"""The trainer's one error type for settings and environments that cannot work."""

from __future__ import annotations

__all__ = ["TrainerSetupError"]


class TrainerSetupError(ValueError):
    """A setting, environment variable or topic layout a rank cannot start with; the message names it.

    `streamtrain train` reports these as configuration errors (exit 2). Any other exception is a
    bug or an outage and surfaces with its traceback.
    """
