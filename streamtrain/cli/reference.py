"""The configuration and command-line references as Markdown, generated from the code so they cannot drift.

The docs site's build hook (`docs/hooks/reference.py`) puts them into `guides/configuration.md` and
`guides/cli.md`: every setting of the pydantic configuration with its type, default and docstring, and every
`streamtrain` command with its usage, help and options, exactly as `--help` prints them.
"""

from __future__ import annotations

import json
import re
import types
import typing
from collections.abc import Iterator
from enum import Enum
from pathlib import PurePath
from typing import Any

import typer
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from streamtrain.config import ENV_PREFIX, StreamtrainConfig
from streamtrain.config.renames import RENAMED_UNTIL, Renamed

__all__ = ["cli_reference", "config_reference", "escape_markdown"]

# Typer's own completion options are the same for every typer program: not worth a row in the reference.
_SKIPPED_OPTIONS = frozenset({"--install-completion", "--show-completion"})
# Outside code spans: what Markdown (or the HTML it passes through) would otherwise take as markup.
_MARKDOWN_SPECIAL = re.compile(r"([\\*|_\[\]])")
# Angle brackets are not backslash-escapable in Python-Markdown: entities keep `<id>` from reading as HTML.
_ENTITIES = {"<": "&lt;", ">": "&gt;"}
_CODE_SPAN = re.compile(r"(`[^`]*`)")
_RICH_BOLD = re.compile(r"\[bold\](.*?)\[/(?:bold)?\]")


def escape_markdown(text: str) -> str:
    """`text` as literal Markdown inline text: special characters escaped outside `code spans`, one line.

    Args:
        text: plain text, possibly with backtick code spans (kept as code).

    Returns:
        Text safe inside a paragraph or a table cell (pipes in code spans escaped too, for the table).
    """
    parts = _CODE_SPAN.split(" ".join(text.split()))
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # a code span: only a pipe would end the table cell
            out.append(part.replace("|", "\\|"))
        else:
            escaped = _MARKDOWN_SPECIAL.sub(r"\\\1", part)
            out.append("".join(_ENTITIES.get(c, c) for c in escaped))
    return "".join(out)


# --- the configuration ------------------------------------------------------------------------------------------


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds when it is a section of its own (not a list or an optional of models)."""
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _nested_models(annotation: Any) -> Iterator[type[BaseModel]]:
    """Models named inside a field's type (`list[RateChange]`, `BurstConfig | None`), documented below it."""
    for arg in typing.get_args(annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            yield arg
        else:
            yield from _nested_models(arg)


def _type_name(annotation: Any) -> str:
    """A reader's name for a field type: `int`, `float or None`, `one of: a, b`, `list of float`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return "one of: " + ", ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        named = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(named) + (" or None" if type(None) in args else "")
    if origin in (list, tuple):
        items = [a for a in args if a is not Ellipsis]
        return "list of " + (_type_name(items[0]) if items else "any")
    if origin is dict:
        return f"table of {_type_name(args[0])} to {_type_name(args[1])}" if args else "table"
    if annotation is SecretStr:
        return "secret"
    if isinstance(annotation, type) and issubclass(annotation, PurePath):
        return "path"
    return getattr(annotation, "__name__", str(annotation))


def _default_text(info: FieldInfo) -> str:
    """The default as a user would write it in TOML-ish JSON, `-` when the field is required."""
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "section"
    if value is None:
        return "unset"
    if isinstance(value, SecretStr):
        return "(secret)"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, PurePath):
        value = str(value)
    if isinstance(value, tuple):
        value = list(value)
    return f"`{json.dumps(value, default=str)}`"


def _field_rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, info in model.model_fields.items():
        if _section_model(info.annotation) is not None:
            continue
        description = escape_markdown(info.description or "")
        rows.append(f"| `{prefix}{name}` | {escape_markdown(_type_name(info.annotation))} | "
                    f"{_default_text(info)} | {description} |")
    return rows


def _renamed_lines(model: type[BaseModel], prefix: str) -> list[str]:
    renamed: dict[str, Renamed] = getattr(model, "renamed_settings", {})
    return [f"- `{prefix}{old}` is now `{prefix}{new.name}` (the old name loads, with a warning, until release "
            f"{RENAMED_UNTIL})" for old, new in sorted(renamed.items())]


def _model_block(model: type[BaseModel], dotted: str, level: int) -> list[str]:
    """One section: its heading, docstring, environment prefix, table, renamed settings, then its sub-sections."""
    prefix = f"{dotted}." if dotted else ""
    title = dotted or "Top-level settings"
    lines = [f"{'#' * level} {title}", ""]
    if model.__doc__:
        lines += [escape_markdown(model.__doc__.strip().split("\n\n")[0]), ""]
    env = f"{ENV_PREFIX}{dotted.upper().replace('.', '__')}__<FIELD>" if dotted else f"{ENV_PREFIX}<FIELD>"
    lines += [f"In a TOML file under `[{dotted}]`; in the environment `{env}`." if dotted else
              f"In a TOML file at the top; in the environment `{env}`.", ""]
    rows = _field_rows(model, prefix)
    if rows:
        lines += ["| setting | type | default | what it does |", "|---|---|---|---|", *rows, ""]
    renamed = _renamed_lines(model, prefix)
    if renamed:
        lines += ["Renamed settings:", "", *renamed, ""]
    for name, info in model.model_fields.items():
        for item in _nested_models(info.annotation):
            lines += _item_block(item, f"{prefix}{name}", level + 1)
    for name, info in model.model_fields.items():
        section = _section_model(info.annotation)
        if section is not None:
            lines += _model_block(section, f"{prefix}{name}", level + 1 if dotted else level)
    return lines


def _item_block(model: type[BaseModel], owner: str, level: int) -> list[str]:
    """The fields of each item of a list (or optional) setting such as `producer.rate.schedule`."""
    lines = [f"{'#' * level} {owner} items", ""]
    if model.__doc__:
        lines += [escape_markdown(model.__doc__.strip().split("\n\n")[0]), ""]
    lines += ["| field | type | default | what it does |", "|---|---|---|---|", *_field_rows(model, ""), ""]
    renamed = _renamed_lines(model, "")
    if renamed:
        lines += ["Renamed fields:", "", *renamed, ""]
    return lines


def config_reference(model: type[BaseModel] = StreamtrainConfig, level: int = 2) -> str:
    """Every section and setting of the configuration, with type, default and docstring, as Markdown.

    Args:
        model: the root configuration model (sections are its model-typed fields, recursively).
        level: the heading level of the top-level sections (`kafka`, `trainer`, ...); nested ones go deeper.

    Returns:
        Markdown with one heading per section (its dotted name) and a table of its settings.
    """
    return "\n".join(_model_block(model, "", level)).rstrip() + "\n"


# --- the command line -------------------------------------------------------------------------------------------


def _plain_help(text: str) -> str:
    """Help text with its one kind of rich markup, `[bold]x[/]`, marked for bold (NUL, escaped past Markdown).

    Nothing else is treated as markup: `[default: 4]` and `list[str]` are text, as `--help` shows them, and a
    bracket escaped from rich (`\\[bridge]`) is a bracket, as `--help` shows it.
    """
    return _RICH_BOLD.sub(lambda m: f"\x00{m.group(1)}\x00", text).replace("\\[", "[")


def _help_markdown(text: str) -> list[str]:
    """A command's help as Markdown: prose paragraphs escaped, indented example lines as a console block."""
    lines: list[str] = []
    examples: list[str] = []  # consecutive example paragraphs share one block
    for paragraph in _plain_help(text).split("\n\n"):
        rows = [row for row in paragraph.split("\n") if row.strip()]
        if rows and all(row.startswith("  ") for row in rows):
            examples += [f"$ {row.strip()}" for row in rows]
            continue
        if examples:
            lines += ["```console", *examples, "```", ""]
            examples = []
        lines += [escape_markdown(paragraph).replace("\x00", "**"), ""]
    if examples:
        lines += ["```console", *examples, "```", ""]
    return lines


def _param_rows(command: Any, ctx: typer.Context) -> list[str]:
    rows = []
    for param in command.params:
        if _SKIPPED_OPTIONS.intersection(param.opts):
            continue
        record = param.get_help_record(ctx)
        if record is None:  # hidden
            continue
        declaration, help_text = record
        text = escape_markdown(_plain_help(help_text)).replace("\x00", "**")
        rows.append(f"| `{declaration.replace('|', '/')}` | {text} |")
    return rows


def _command_block(command: Any, path: list[str], parent: typer.Context | None, top: int) -> list[str]:
    """A command's heading (at `top` for a command of the root, one deeper per level), usage, help, options."""
    ctx = typer.Context(command, info_name=path[-1], parent=parent)
    level = min(top + len(path) - 2, 6)
    usage = " ".join([*path, *command.collect_usage_pieces(ctx)])
    lines = [f"{'#' * level} {' '.join(path)}", ""] if len(path) > 1 else []
    lines += ["```text", usage, "```", ""]
    if command.help:
        lines += _help_markdown(command.help)
    rows = _param_rows(command, ctx)
    if rows:
        lines += ["| option | what it does |", "|---|---|", *rows, ""]
    subcommands = getattr(command, "commands", {})
    if subcommands:
        lines += ["Commands: " + ", ".join(f"`{name}`" for name in subcommands), ""]
    for name, sub in subcommands.items():
        lines += _command_block(sub, [*path, name], ctx, top)
    return lines


def cli_reference(app: typer.Typer | None = None, name: str = "streamtrain", level: int = 2) -> str:
    """Every command and sub-command of a typer application with its usage, help and options, as Markdown.

    Args:
        app: the application (default: the `streamtrain` command itself).
        name: the program name its usage lines start with.
        level: the heading level of the root's commands (`## streamtrain up` at 2); sub-commands go deeper.

    Returns:
        Markdown: the root's usage and options, then one heading per command (`streamtrain up`,
        `streamtrain broker start`, ...), in the order `--help` lists them.
    """
    if app is None:
        from . import app as streamtrain_app

        app = streamtrain_app
    return "\n".join(_command_block(typer.main.get_command(app), [name], None, level)).rstrip() + "\n"
