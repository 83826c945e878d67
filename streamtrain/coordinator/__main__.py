"""`python -m streamtrain.coordinator coordinate|sim ...`: the coordinator on its own, with `streamtrain`'s options."""

from streamtrain.runtime.commands import command_app

from .cli import register

app = command_app("coordinator", "The coordinator service: ETT-balanced plans from feedback and lag; its simulator.")
register(app)

if __name__ == "__main__":
    app()
