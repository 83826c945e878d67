"""What every CLI command shares: loading the config (exit 2 on a bad one), logging, the console."""

from __future__ import annotations

import inspect
import logging
import re
import sys
from collections.abc import Mapping
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.logging import RichHandler
from typer.core import TyperGroup

from .config import ConfigError, StreamtrainConfig, load_config, parse_assignment

__all__ = ["EXIT_CONFIG", "GlobalOptions", "ProseGroup", "config_from", "console", "die", "err_console", "prose",
           "setup_logging"]

#: Exit status for a configuration that cannot be used (the service never started).
EXIT_CONFIG = 2

console = Console()
err_console = Console(stderr=True)


class GlobalOptions:
    """Options given before the subcommand (`streamtrain --config f.toml --set k=v broker start`)."""

    def __init__(self, config_file: str | None = None, sets: list[str] | None = None) -> None:
        self.config_file = config_file
        self.sets = list(sets or [])


def die(message: str, code: int = 1) -> NoReturn:
    """Print an error for a person and exit with `code`."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def config_from(ctx: typer.Context, flags: Mapping[str, Any] | None = None) -> StreamtrainConfig:
    """Load the configuration for a command: file < env < --set < the command's own flags.

    Args:
        ctx: the click context; its root holds the global `--config` and `--set` options.
        flags: the command's own flags as dotted setting → value (None means "not given").
    """
    root = ctx.find_root().obj
    opts = root if isinstance(root, GlobalOptions) else GlobalOptions()
    try:
        overrides: dict[str, Any] = dict(parse_assignment(s) for s in opts.sets)
        overrides.update({k: v for k, v in (flags or {}).items() if v is not None})
        cfg = load_config(opts.config_file, overrides=overrides)
    except ConfigError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(EXIT_CONFIG) from None
    setup_logging(cfg.log_level)
    return cfg


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at the time of each record, not the stream it was when configured:
    a CLI called in-process (tests, notebooks) swaps stderr and closes it afterwards."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def setup_logging(level: str = "INFO") -> None:
    """Configure logging once per process: rich on a terminal, plain lines otherwise."""
    root = logging.getLogger()
    if getattr(root, "_streamtrain_configured", False):
        root.setLevel(level)
        return
    handler: logging.Handler
    if sys.stderr.isatty():
        handler = RichHandler(console=err_console, show_path=False, rich_tracebacks=True)
        fmt = "%(message)s"
    else:
        handler = _StderrHandler()
        fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handler.setFormatter(logging.Formatter(fmt))
    root.handlers[:] = [handler]
    root.setLevel(level)
    root._streamtrain_configured = True  # type: ignore[attr-defined]


# A line that starts a list item, an indented block (examples) or a markup heading keeps its line break.
_KEEP_BREAK = re.compile(r"^(\s|[-*] |\d+[.)] |\[bold\])")


def prose(text: str) -> str:
    """Help text with each paragraph's hard line breaks removed, so the terminal wraps it.

    Docstrings are wrapped for the source file; the help renderer keeps single line breaks, which split
    sentences mid-line on any terminal narrower or wider than the source. Indented lines (examples),
    list items and `[bold]` headings keep their breaks.
    """
    paragraphs = []
    for para in inspect.cleandoc(text).split("\n\n"):
        lines = para.split("\n")
        merged = [lines[0]]
        for line in lines[1:]:
            if _KEEP_BREAK.match(line) or merged[-1][:1].isspace():
                merged.append(line)
            else:
                merged[-1] = f"{merged[-1].rstrip()} {line.strip()}"
        paragraphs.append("\n".join(merged))
    return "\n\n".join(paragraphs)


def _prose_tree(command: Any) -> None:
    if command.help:
        command.help = prose(command.help)
    for sub in getattr(command, "commands", {}).values():
        _prose_tree(sub)


class ProseGroup(TyperGroup):
    """The root command group: every command's help is `prose` (built once, when the CLI is assembled)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _prose_tree(self)
