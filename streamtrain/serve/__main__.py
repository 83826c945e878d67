"""`python -m streamtrain.serve serve|request|export ...`: serve on its own, with `streamtrain`'s options."""

from streamtrain.runtime.commands import command_app

from .cli import register

app = command_app("serve", "The serve service: predictions from the newest model version that passed the gate.")
register(app)

if __name__ == "__main__":
    app()
