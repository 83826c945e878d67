"""The `streamtrain` command: one entry point for the broker, the services, demos and benchmarks."""

from __future__ import annotations

from typing import Annotated

import typer

from .cli_support import GlobalOptions, ProseGroup

app = typer.Typer(
    name="streamtrain",
    cls=ProseGroup,
    help=(
        "Kafka-fed streaming online training with ETT-balanced batches.\n\n"
        "Settings come from a TOML file (--config or $STREAMTRAIN_CONFIG), then environment "
        "variables STREAMTRAIN_<SECTION>__<FIELD> (e.g. STREAMTRAIN_KAFKA__BOOTSTRAP_SERVERS), then "
        "--set SECTION.FIELD=VALUE, then each command's own flags. A bad setting exits with status 2 "
        "and names the setting. `streamtrain config show` prints what is in force."
    ),
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root(
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


bench_app = typer.Typer(
    help="Benchmarks: measured side by side in one run, written as JSON (and plots) under --out DIR.",
    no_args_is_help=True,
)


def _register_commands() -> None:
    # Each package adds its own commands; heavy imports (torch) happen inside the commands.
    from benchmarks.cli import register as register_benchmarks
    from coordinator.cli import register as register_coordinator
    from producers.cli import register as register_producers
    from stack.cli import register as register_stack
    from trainer.cli import register as register_trainer

    from .bench_kafka import register as register_kafka_bench
    from .broker.cli import app as broker_app
    from .config_cli import app as config_app
    from .demo import register as register_demo

    app.add_typer(broker_app, name="broker")
    app.add_typer(bench_app, name="bench")
    app.add_typer(config_app, name="config")
    register_demo(app)
    register_kafka_bench(bench_app)
    register_producers(app, bench_app)
    register_coordinator(app, bench_app)
    register_trainer(app, bench_app)
    register_stack(app, bench_app)
    register_benchmarks(app, bench_app)  # last: `bench all` runs whatever the others registered


_register_commands()


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
