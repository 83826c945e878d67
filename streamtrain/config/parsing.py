"""Reading a setting given as one string (an environment variable, `--set`) the way its type needs it."""

from __future__ import annotations

__all__ = ["numbers_as_tuple", "split_list", "text_as_tuple"]


def split_list(text: str) -> list[str]:
    """`a,b` or `[a, b]` (quotes allowed) as its items: list settings given as one string (environment, --set)."""
    return [p.strip().strip("'\"") for p in text.strip().strip("[]").split(",") if p.strip()]


def text_as_tuple(value: object) -> object:
    """A list setting's value before validation: one string (`split_list`) as its items, anything else as it is.
    Used as `field_validator(name, mode="before")(text_as_tuple)`."""
    return tuple(split_list(value)) if isinstance(value, str) else value


def numbers_as_tuple(value: object) -> object:
    """A list of numbers given as one string (`1,2.5`, `[1, 2.5]`) as its numbers, anything else as it is.

    Raises:
        ValueError: an item is not a number (named).
    """
    if not isinstance(value, str):
        return value
    out = []
    for item in split_list(value):
        try:
            out.append(float(item))
        except ValueError:
            raise ValueError(f"{item!r} in {value!r} is not a number") from None
    return tuple(out)
