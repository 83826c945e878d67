"""What every CLI command shares: loading the config (exit 2 on a bad one), logging, the console."""

from __future__ import annotations

import inspect
import json
import logging
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, NoReturn, Protocol

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from typer.core import TyperGroup

from streamtrain.config import ConfigError, StreamtrainConfig, load_config, parse_assignment

__all__ = ["CLI_MODULE", "EXIT_CONFIG", "GlobalOptions", "ProseGroup", "command_app", "config_from", "console", "die",
           "err_console", "module_command", "prose", "run_service", "set_args", "setup_logging"]

#: Exit status for a configuration that cannot be used (the service never started).
EXIT_CONFIG = 2

#: The package `python -m` runs for the whole `streamtrain` command line (the console script's own package).
#: Named here, not imported: it sits above every other package.
CLI_MODULE = "streamtrain.cli"

console = Console()
err_console = Console(stderr=True)


class GlobalOptions:
    """Options given before the subcommand (`streamtrain --config f.toml --set k=v broker start`)."""

    def __init__(self, config_file: str | None = None, sets: list[str] | None = None) -> None:
        self.config_file = config_file
        self.sets = list(sets or [])


def _global_options(
    ctx: typer.Context,
    config: Annotated[
        str | None, typer.Option("--config", "-c", help="TOML configuration file.", metavar="FILE")
    ] = None,
    sets: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override one setting, e.g. --set kafka.partitions=2 (repeatable).",
                     metavar="KEY=VALUE"),
    ] = None,
) -> None:
    ctx.obj = GlobalOptions(config, sets)


def command_app(name: str, help_text: str) -> typer.Typer:
    """A command group that takes the global `--config FILE` and `--set KEY=VALUE` before its subcommand.

    The whole `streamtrain` command and each service's own entry (`python -m streamtrain.trainer train ...`) are built
    with it, so one command line works with any of them.

    Args:
        name: the program name shown in usage lines.
        help_text: the group's help (made `prose` with every command's help once the group is built).

    Returns:
        The group; commands are added to it, then it is called.
    """
    app = typer.Typer(
        name=name,
        cls=ProseGroup,
        help=help_text,
        no_args_is_help=True,
        rich_markup_mode="rich",
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.callback()(_global_options)
    return app


def module_command(module: str, *command: str, global_args: Sequence[str] = (),
                   sets: Mapping[str, object] | None = None) -> tuple[str, ...]:
    """The command line `python -m <module> <global args> --set k=v ... <command>` for this interpreter.

    Every runnable entry (`CLI_MODULE` for the whole command line, `producers`, `coordinator` and `trainer`
    for one service) takes the same options before its subcommand, so this one builder serves all of them.

    Args:
        module: the package to run.
        command: the subcommand and its arguments.
        global_args: options before the subcommand (`--config FILE`, `--set k=v`), passed on as they are.
        sets: settings passed as `--set key=value` after `global_args`, so they win over them; lists,
            tuples and dicts as JSON.

    Returns:
        The argument vector, for `subprocess`.
    """
    return (sys.executable, "-m", module, *global_args, *set_args(sets or {}), *command)


def set_args(sets: Mapping[str, object]) -> list[str]:
    """`--set key=value` for each setting, lists, tuples and dicts as JSON (how `--set` reads them back)."""
    flags: list[str] = []
    for key, value in sets.items():
        text = json.dumps(value) if isinstance(value, list | tuple | dict) else str(value)
        flags += ["--set", f"{key}={text}"]
    return flags


def die(message: str, code: int = 1) -> NoReturn:
    """Print an error for a person and exit with `code` (the message is plain text, not rich markup)."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


class Service(Protocol):
    """A long-running service as `run_service` drives it."""

    def start(self) -> None: ...
    def run(self) -> None: ...
    def stop(self) -> None: ...
    def close(self) -> None: ...


def run_service(service: Service, cfg: StreamtrainConfig, banner: Callable[[], str]) -> None:
    """Run `service` in the foreground: SIGINT / SIGTERM stop it (it finishes what it holds and returns), `banner()`
    is printed once it has started, and a Kafka error or time-out closes it and exits 1 naming the broker."""
    import signal

    from confluent_kafka import KafkaException

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda _sig, _frame: service.stop())
    try:
        service.start()
        console.print(banner(), highlight=False)
        service.run()
    except (KafkaException, TimeoutError) as exc:
        service.close()
        die(f"Kafka at {cfg.kafka.bootstrap_servers}: {exc}")


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
        die(str(exc), EXIT_CONFIG)
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
