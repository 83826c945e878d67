"""Commands of the trainer service, added to the `streamtrain` CLI by `register`."""

from __future__ import annotations

import typer

__all__ = ["register"]


def register(app: typer.Typer, bench: typer.Typer) -> None:
    """Add this service's commands to the root CLI and its benchmarks to `streamtrain bench` (none yet)."""
    del app, bench
