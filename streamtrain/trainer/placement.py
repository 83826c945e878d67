"""Which device a trainer rank trains, from torchrun's environment.

Two ways to name them:

- `--devices a,b,c,d`: the group's devices, one per global rank; rank r trains the r-th. Right when
  the world never changes (one node, or one container per rank as in docker-compose.yml).
- `--node-devices a,b`: this node's devices, one per local rank; local rank r trains the r-th. Right
  for torchrun across nodes with `--nnodes MIN:MAX`: when a node leaves or rejoins, the elastic agent
  restarts the group and global ranks are dealt out again, but a node's local ranks, and so the
  devices its ranks train (the topics its host can reach, the GPUs it owns), stay the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .errors import TrainerSetupError

__all__ = ["device_for_rank", "env_int"]


def env_int(env: Mapping[str, str], name: str) -> int | None:
    """The integer in `env[name]`, None when unset or empty.

    Raises:
        TrainerSetupError: the variable is not an integer (the message names it).
    """
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise TrainerSetupError(f"environment variable {name}={raw!r} is not an integer") from None


def device_for_rank(devices: Sequence[str], node_devices: Sequence[str], env: Mapping[str, str]) -> str:
    """The device of the rank whose torchrun environment is `env`.

    Args:
        devices: `--devices`, one per global rank (RANK picks).
        node_devices: `--node-devices`, one per local rank of this node (LOCAL_RANK picks).
        env: The process environment (RANK, LOCAL_RANK, LOCAL_WORLD_SIZE).

    Returns:
        The device id.

    Raises:
        TrainerSetupError: both lists or neither given, or the rank has no device in its list.
    """
    if devices and node_devices:
        raise TrainerSetupError("give --devices (one per global rank) or --node-devices (one per local rank of "
                                "this node), not both")
    rank = env_int(env, "RANK") or 0
    if devices:
        if rank >= len(devices):
            raise TrainerSetupError(f"RANK {rank} has no device in --devices ({len(devices)} named)")
        return devices[rank]
    if not node_devices:
        raise TrainerSetupError("say which device this rank trains: --device-id ID, --devices with RANK set, or "
                                "--node-devices with LOCAL_RANK set")
    local_rank = env_int(env, "LOCAL_RANK")
    local_rank = rank if local_rank is None else local_rank
    local_world = env_int(env, "LOCAL_WORLD_SIZE")
    if local_world is not None and local_world != len(node_devices):
        # Fewer names than local ranks would leave a rank without a device; more would leave a device untrained.
        raise TrainerSetupError(f"--node-devices names {len(node_devices)} devices but this node runs "
                                f"{local_world} ranks (LOCAL_WORLD_SIZE, torchrun --nproc-per-node): one per rank")
    if local_rank >= len(node_devices):
        raise TrainerSetupError(f"LOCAL_RANK {local_rank} has no device in --node-devices ({len(node_devices)} named)")
    return node_devices[local_rank]
