"""The one error of reading or writing a model version."""

from __future__ import annotations

__all__ = ["VersionError"]


class VersionError(ValueError):
    """A model version that cannot be read, rebuilt or written; the message names the file and the field."""
