"""`python -m streamtrain.producers produce ...`: the producers on their own, with the same options as `streamtrain`."""

from streamtrain.runtime.commands import command_app

from .cli import register

app = command_app("producers", "The producers service: per-device sample streams into Kafka.")
register(app)

if __name__ == "__main__":
    app()
