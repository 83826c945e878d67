"""Reading a setting given as one string (an environment variable, `--set`) the way its type needs it."""

from __future__ import annotations

__all__ = ["split_list"]


def split_list(text: str) -> list[str]:
    """`a,b` or `[a, b]` (quotes allowed) as its items: list settings given as one string (environment, --set)."""
    return [p.strip().strip("'\"") for p in text.strip().strip("[]").split(",") if p.strip()]
