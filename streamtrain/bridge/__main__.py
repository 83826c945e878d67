"""`python -m streamtrain.bridge bridge ...`: the bridge on its own, with the same options as `streamtrain`."""

from streamtrain.runtime.commands import command_app

from .cli import register

app = command_app("bridge", "The bridge service: existing topics into device topics as Samples, exactly once.")
register(app)

if __name__ == "__main__":
    app()
