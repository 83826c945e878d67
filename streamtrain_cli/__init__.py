"""The `streamtrain` command: the broker, the services, the local stack, demos and benchmarks in one CLI.

This package sits above every other one: it only assembles the commands each package registers
(`register(app, bench)`), so the core (`streamtrain/`) and the services need not know about each other.
Each service also runs on its own (`python -m producers|coordinator|trainer|serve|bridge ...`) with the same
options.
"""

from __future__ import annotations

import typer

from streamtrain.cli_support import command_app

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


def _register_commands() -> None:
    # Each package adds its own commands; heavy imports (torch) happen inside the commands.
    from benchmarks.cli import register as register_benchmarks
    from bridge.cli import register as register_bridge
    from cluster.cli import register as register_cluster
    from coordinator.cli import register as register_coordinator
    from producers.cli import register as register_producers
    from serve.cli import register as register_serve
    from stack.cli import register as register_stack
    from streamtrain.acl_cli import app as acl_app
    from streamtrain.broker.cli import app as broker_app
    from streamtrain.config_cli import app as config_app
    from streamtrain.round_trip import register as register_demo
    from trainer.cli import register as register_trainer

    app.add_typer(broker_app, name="broker")
    app.add_typer(bench_app, name="bench")
    app.add_typer(config_app, name="config")
    app.add_typer(acl_app, name="acl")
    register_demo(app)
    register_producers(app, bench_app)
    register_coordinator(app, bench_app)
    register_trainer(app, bench_app)
    register_serve(app, bench_app)
    register_bridge(app, bench_app)
    register_stack(app, bench_app)
    register_cluster(app, bench_app)
    register_benchmarks(app, bench_app)


_register_commands()


def main() -> None:
    """Console-script entry point."""
    app()
