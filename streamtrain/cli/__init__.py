"""The `streamtrain` command: the broker, the services, the local stack, demos and benchmarks in one CLI.

This package sits above every other one: it only assembles the commands each package registers
(`register(app, bench)`), so the core (`streamtrain/`) and the services need not know about each other.
Each service also runs on its own (`python -m streamtrain.producers|coordinator|trainer|serve|bridge ...`) with the same
options.
"""

from __future__ import annotations

import importlib
import importlib.util

import typer

from streamtrain.runtime.commands import command_app

__all__ = ["app", "bench_app", "main"]

app = command_app(
    "streamtrain",
    "Kafka-fed streaming online training with ETT-balanced batches.\n\n"
    "Settings come from a TOML file (--config or $STREAMTRAIN_CONFIG), then environment "
    "variables STREAMTRAIN_<SECTION>__<FIELD> (e.g. STREAMTRAIN_KAFKA__BOOTSTRAP_SERVERS), then "
    "--set SECTION.FIELD=VALUE, then each command's own flags. A bad setting exits with status 2 "
    "and names the setting. `streamtrain config show` prints what is in force.",
)

bench_app = typer.Typer(
    help="Benchmarks: measured side by side in one run, written as JSON (and plots) under --out DIR.",
    no_args_is_help=True,
)


#: Each package that adds commands, by the function that registers them (`register(app, bench_app)`). Imported when
#: the command line is built; heavy imports (torch) happen inside the commands themselves.
_SERVICES = ("producers", "coordinator", "trainer", "serve", "bridge")
#: What runs the whole system and measures it: not in the production images (deploy/Dockerfile), so a package of
#: these that is not installed adds no commands, and every service command still runs.
_TOOLS = ("stack", "cluster", "benchmarks")


def _register_commands() -> None:
    from streamtrain.cli.acl import app as acl_app
    from streamtrain.cli.audit import register as register_audit
    from streamtrain.cli.broker import app as broker_app
    from streamtrain.cli.config import app as config_app
    from streamtrain.cli.demo import register as register_demo

    app.add_typer(broker_app, name="broker")
    app.add_typer(bench_app, name="bench")
    app.add_typer(config_app, name="config")
    app.add_typer(acl_app, name="acl")
    register_demo(app)
    register_audit(app)
    for name in (*_SERVICES, *_TOOLS):
        if name in _TOOLS and importlib.util.find_spec(f"streamtrain.{name}") is None:
            continue
        importlib.import_module(f"streamtrain.{name}.cli").register(app, bench_app)


_register_commands()


def main() -> None:
    """Console-script entry point."""
    app()
