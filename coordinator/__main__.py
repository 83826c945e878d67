"""`python -m coordinator coordinate|sim ...`: the coordinator on its own, with the same options as `streamtrain`."""

from streamtrain.cli_support import command_app

from .cli import register

app = command_app("coordinator", "The coordinator service: ETT-balanced plans from feedback and lag; its simulator.")
register(app)

if __name__ == "__main__":
    app()
