"""`streamtrain train --local-ranks N`: N rank processes on this machine, as torchrun would start them.

Each child is the trainer's own entry, `python -m streamtrain.trainer train --device-id <id>`, with RANK / WORLD_SIZE /
LOCAL_RANK / MASTER_ADDR / MASTER_PORT set, and the parent's fully resolved configuration passed
as one JSON environment variable per section (STREAMTRAIN_<SECTION>), so flags, --set and the
config file given to the parent reach every rank exactly. If one rank fails the others would
block in their next collective, so the launcher stops them. The ranks are tied to the launcher
(`streamtrain.lifeline`): if it is killed, they die with it instead of training on unsupervised.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from types import FrameType

from streamtrain.config import ENV_PREFIX, StreamtrainConfig, config_environment
from streamtrain.runtime.commands import module_command
from streamtrain.runtime.lifeline import tie_to_parent

from .distributed import allocator_environment, free_port

__all__ = ["child_environment", "launch_local_ranks", "rank_command"]

logger = logging.getLogger(__name__)

#: Seconds ranks get to finish their step after a SIGTERM before they are killed.
STOP_GRACE_S = 60.0


def child_environment(config: StreamtrainConfig, rank: int, world_size: int, port: int) -> dict[str, str]:
    """The environment of local rank `rank`: torchrun's variables, the resolved configuration and, on the CPU,
    the memory allocator (`trainer.cpu_allocator`)."""
    # Drop every STREAMTRAIN_* setting: the resolved sections below already include them, and a
    # leftover STREAMTRAIN_TRAINER__LR would override what --set gave the parent.
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env.update(config_environment(config))  # secrets included: ranks authenticate as the parent does
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = "cuda" if config.trainer.device == "cuda" or (config.trainer.device == "auto" and _has_cuda()) else "cpu"
    env.update(allocator_environment(config.trainer.cpu_allocator, device))
    return env


def rank_command(device: str) -> tuple[str, ...]:
    """The command line of the rank that trains `device`: the trainer's own entry, not the whole CLI."""
    return module_command("streamtrain.trainer", "train", "--device-id", device)


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def launch_local_ranks(config: StreamtrainConfig, devices: Sequence[str]) -> int:
    """Run one rank per device as child processes until all exit; returns 0 or the first failure's status.

    SIGTERM / SIGINT to the launcher are forwarded, so every rank finishes its step, commits and
    checkpoints.
    """
    port = free_port()
    world = len(devices)
    children = [
        subprocess.Popen(tie_to_parent(rank_command(device)), env=child_environment(config, rank, world, port))
        for rank, device in enumerate(devices)
    ]
    logger.info("launched %d ranks (pids %s) on 127.0.0.1:%d", world, [c.pid for c in children], port)

    def forward(signum: int, _frame: FrameType | None) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _wait_all(children)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _wait_all(children: list[subprocess.Popen[bytes]]) -> int:
    status = 0
    stop_deadline: float | None = None
    while any(c.poll() is None for c in children):
        failed = [c for c in children if c.returncode not in (None, 0)]
        if failed and stop_deadline is None:
            status = failed[0].returncode
            logger.error("rank pid %d exited with %d; stopping the others", failed[0].pid, status)
            for child in children:
                if child.poll() is None:
                    child.terminate()
            stop_deadline = time.monotonic() + STOP_GRACE_S
        if stop_deadline is not None and time.monotonic() > stop_deadline:
            for child in children:
                if child.poll() is None:
                    child.kill()  # blocked in a collective with a dead peer: SIGTERM cannot reach Python
        time.sleep(0.2)
    if status == 0:
        status = next((c.returncode for c in children if c.returncode != 0), 0)
    return status
