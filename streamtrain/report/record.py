"""`Record`: the base of every typed JSON document the project writes (`up`'s report, the benchmarks' results).

Frozen, and strict about keys on load: a key a record does not declare is an error, so a file written by
another version reads as a clear message naming the key rather than as a silently wrong figure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict

__all__ = ["Record"]


class Record(BaseModel):
    """A typed, immutable JSON document (or a piece of one); a key it does not declare is an error on load."""

    # defer_build: the CLI lists every benchmark (and so imports its result types) at start-up; a type's
    # validator is built when it is first used.
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    def write(self, path: Path, indent: int = 1) -> Path:
        """Write as indented JSON (what `load` reads back); returns `path`."""
        # json rather than pydantic's serialiser: the committed files' number formatting, and inf stays inf.
        path.write_text(json.dumps(self.model_dump(), indent=indent) + "\n")
        return path

    @classmethod
    def load(cls, path: Path) -> Self:
        """Read a file `write` wrote (or one of the same shape).

        Raises:
            pydantic.ValidationError: naming each key that is missing, unknown or of the wrong type.
        """
        return cls.model_validate_json(path.read_text())
