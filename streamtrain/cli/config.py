"""`streamtrain config ...`: see the configuration in force and where its settings come from."""

from __future__ import annotations

import json

import typer

from streamtrain.runtime.commands import config_from, console

app = typer.Typer(help="Inspect the configuration.", no_args_is_help=True)


@app.command("show")
def show(ctx: typer.Context) -> None:
    """Print the validated configuration in force (TOML < env < --set), secrets masked, as JSON.

    kafka.client_settings is what every Kafka client gets (security included), with passwords as ***.
    """
    cfg = config_from(ctx)
    data = cfg.model_dump(mode="json")
    data["kafka"]["client_settings"] = cfg.kafka.redacted_client()  # what every client gets, secrets masked
    console.print_json(json.dumps(data))
