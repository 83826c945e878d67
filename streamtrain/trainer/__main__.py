"""`python -m streamtrain.trainer train ...`: the trainer on its own, with the same options as `streamtrain`.

The ranks `train --local-ranks N` starts run this entry, and so can torchrun:

    torchrun --nproc-per-node 2 -m trainer train --devices cam0,cam1
"""

from streamtrain.runtime.commands import command_app

from .cli import register

app = command_app("trainer", "The trainer service: one DDP rank per device on its Kafka stream.")
register(app)

if __name__ == "__main__":
    app()
