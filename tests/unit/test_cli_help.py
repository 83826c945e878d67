"""`streamtrain --help` and every subcommand's --help explain themselves."""

from __future__ import annotations

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from streamtrain.cli import app
from streamtrain.runtime.commands import prose


def _commands(group: object, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name, cmd in getattr(group, "commands", {}).items():
        path = (*prefix, name)
        found.append(path)
        found.extend(_commands(cmd, path))
    return found


COMMANDS = _commands(typer.main.get_command(app))


def test_root_help_lists_the_commands() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for name in ("broker", "config", "bench", "demo"):
        assert name in result.output
    assert "STREAMTRAIN_KAFKA__BOOTSTRAP_SERVERS" in result.output


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(p) for p in COMMANDS])
def test_every_command_has_help(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    # A command's help says something beyond its usage line.
    body = result.output.split("Usage:", 1)[1]
    assert len(body.split()) > 8


def test_broker_start_documents_its_settings() -> None:
    result = CliRunner().invoke(app, ["broker", "start", "--help"], env={"COLUMNS": "200"})
    for option in ("--data-dir", "--port", "--controller-port", "--heap", "--log-file", "broker.data_dir"):
        assert option in result.output


def test_help_paragraphs_wrap_to_the_terminal_and_examples_keep_their_lines() -> None:
    """Docstrings are wrapped for the source; the help joins each paragraph's lines so the terminal wraps them."""
    wide = CliRunner().invoke(app, ["bench", "truncation", "--help"], env={"COLUMNS": "240"}).output
    assert "when ScaDLES S2 streams outrun training, and held-out accuracy. Writes" in wide  # across a line break
    up = CliRunner().invoke(app, ["up", "--help"], env={"COLUMNS": "240"}).output
    lines = [line.strip() for line in up.splitlines()]
    assert "streamtrain up --duration 60" in lines  # an example stays a line of its own


def test_prose_keeps_lists_indented_blocks_and_headings() -> None:
    text = "A sentence\nthat goes on.\n\n- one\n- two\n\n  example --flag\n  another\n\n[bold]x[/]: a\nb"
    assert prose(text) == "A sentence that goes on.\n\n- one\n- two\n\n  example --flag\n  another\n\n[bold]x[/]: a b"
