"""Settings that were renamed: the old spelling still loads, for one release, with a warning naming the new one.

A section lists its renamed settings in a `renamed_settings` class attribute (old name → `Renamed`).
`upgrade_tree` rewrites one source's settings (a TOML file, one environment variable, one `--set`) to the
current names before the sources are merged, so precedence between sources holds whichever spelling each
used, and every use of an old name says, in a `DeprecationWarning` and a log line, what to write instead.
"""

from __future__ import annotations

import logging
import types
import typing
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

__all__ = ["RENAMED_UNTIL", "Renamed", "RenamedSettingError", "milliseconds_to_seconds", "seconds_renamed",
           "upgrade_dotted", "upgrade_tree"]

logger = logging.getLogger(__name__)

#: The release from which the old spellings are refused.
RENAMED_UNTIL = "0.2"


class RenamedSettingError(ValueError):
    """One source gives a setting under both its old and its new name."""


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Renamed:
    """The current name of a renamed setting, and how an old value converts to it.

    Attributes:
        name: the setting's current name within its section.
        convert: maps a value given under the old name to the new one (a unit change); identity by default.
    """

    name: str
    convert: Callable[[Any], Any] = _same


def milliseconds_to_seconds(value: Any) -> Any:
    """An old `*_ms` value in seconds; a negative one ("forever") stays -1, text that is no number stays as is."""
    try:
        ms = float(value)
    except (TypeError, ValueError):
        return value
    return -1 if ms < 0 else ms / 1000.0


def seconds_renamed(*old: str) -> dict[str, Renamed]:
    """`renamed_settings` of durations once spelled `<name>_s`, now `<name>_seconds`."""
    return {name: Renamed(f"{name.removesuffix('_s')}_seconds") for name in old}


def upgrade_tree(data: Any, model: type[BaseModel], source: str, path: str = "") -> Any:
    """`data` (one source's settings for `model`) with every renamed setting under its current name.

    Args:
        data: settings as parsed (dicts, lists, scalars); anything that is not a dict is returned as is.
        model: the section `data` configures.
        source: where `data` came from, for the warning (e.g. "file a.toml").
        path: the dotted name of `model` within the whole configuration ("" at the root).

    Returns:
        A copy of `data` with current names; values of renamed settings converted.

    Raises:
        RenamedSettingError: the same dict names a setting both ways.
    """
    if not isinstance(data, Mapping):
        return data
    renamed: Mapping[str, Renamed] = getattr(model, "renamed_settings", {})
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in renamed:
            new = renamed[key]
            old_name, new_name = _dotted(path, key), _dotted(path, new.name)
            if new.name in data:
                raise RenamedSettingError(f"{source} sets both {old_name} and {new_name}: keep only {new_name}")
            message = (f"setting {old_name} is renamed {new_name}; the old name is accepted until release "
                       f"{RENAMED_UNTIL} ({source})")
            warnings.warn(message, DeprecationWarning, stacklevel=2)
            logger.warning("%s", message)
            key, value = new.name, new.convert(value)
        field = model.model_fields.get(key)
        out[key] = _upgrade_value(value, field.annotation, source, _dotted(path, key)) if field else value
    return out


def upgrade_dotted(dotted: str, value: Any, model: type[BaseModel], source: str) -> tuple[str, Any]:
    """One `section.field=value` setting (environment, `--set`) with current names, in the key and in the value.

    Args:
        dotted: the setting's dotted name, as given.
        value: its value (JSON values are dicts or lists, upgraded too).
        model: the whole configuration's model.
        source: where it came from, for the warning.

    Returns:
        The current dotted name and the (converted) value.
    """
    parts = dotted.split(".")
    tree: Any = value
    for part in reversed(parts):
        tree = {part: tree}
    upgraded = upgrade_tree(tree, model, source)
    names = []
    for _ in parts:
        if not isinstance(upgraded, Mapping) or len(upgraded) != 1:
            return dotted, value  # not a path of sections (the loader reports what is wrong with it)
        (name, upgraded), = upgraded.items()
        names.append(name)
    return ".".join(names), upgraded


def _upgrade_value(value: Any, annotation: Any, source: str, path: str) -> Any:
    """Upgrade `value` when its annotation is a section, an optional section, or a list of sections."""
    for model, many in _sections_in(annotation):
        if many and isinstance(value, list):
            return [upgrade_tree(item, model, source, f"{path}[{i}]") for i, item in enumerate(value)]
        if not many and isinstance(value, Mapping):
            return upgrade_tree(value, model, source, path)
    return value


def _sections_in(annotation: Any) -> list[tuple[type[BaseModel], bool]]:
    """The section models an annotation holds: (model, False) for `M` or `M | None`, (model, True) for `list[M]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, False)]
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return [found for arg in args for found in _sections_in(arg)]
    if origin in (list, tuple) and args:
        return [(model, True) for model, _many in _sections_in(args[0])]
    return []


def _dotted(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
