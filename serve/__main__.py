"""`python -m serve serve|request|export ...`: the serve service on its own, with the same options as `streamtrain`."""

from streamtrain.cli_support import command_app

from .cli import register

app = command_app("serve", "The serve service: predictions from the newest model version that passed the gate.")
register(app)

if __name__ == "__main__":
    app()
