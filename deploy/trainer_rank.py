#!/usr/bin/env python3
"""Entrypoint of a trainer container: find this replica's torchrun identity, then exec the command.

`docker compose` starts the trainers as N identical replicas of one service (`deploy.replicas`),
so no replica is told its rank. Every replica resolves the service name (Compose's DNS answers
with one address per running replica), waits until it sees exactly WORLD_SIZE addresses, the
same on two reads in a row, and takes the position of its own address in the sorted list as
RANK; the lowest address is MASTER_ADDR, where rank 0 hosts the rendezvous. Every replica sorts
the same list, so the ranks are consistent without any extra service.

It then sets what `streamtrain train` reads under torchrun:
  RANK, MASTER_ADDR   from the above (kept when already set, e.g. by an orchestrator)
  LOCAL_RANK=0        each container reserves one GPU, which it sees as cuda:0
  MASTER_PORT         29500 unless set
  STREAMTRAIN_METRICS__PORT
                      STREAMTRAIN_TRAINER_METRICS_PORT: a rank serves /metrics on
                      metrics.port + LOCAL_RANK, so every replica serves on this one port,
                      the one Prometheus' DNS discovery scrapes
and checks that `--devices` names WORLD_SIZE devices (rank r trains the r-th).

Settings (environment):
  WORLD_SIZE                         number of trainer replicas (required)
  STREAMTRAIN_TRAINER_SERVICE        name to resolve (default: trainer)
  STREAMTRAIN_TRAINER_ADDRESS        this replica's address (default: its host name's address)
  STREAMTRAIN_TRAINER_METRICS_PORT   the one /metrics port of every replica (optional)
  STREAMTRAIN_RENDEZVOUS_TIMEOUT_SECONDS   seconds to wait for all replicas (default 300; the old
                                           name STREAMTRAIN_RENDEZVOUS_TIMEOUT_S works until 0.2)

Only the standard library: it runs before anything else in the image.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence

DEFAULT_MASTER_PORT = 29500


class RankError(RuntimeError):
    """The replica cannot work out a consistent identity; the message says what to fix."""


def assign_rank(own: str, peers: Sequence[str], world_size: int) -> tuple[int, str]:
    """(RANK, MASTER_ADDR) of the replica at `own` among `peers` (the addresses of every replica)."""
    ordered = sorted(set(peers), key=ipaddress.ip_address)
    if len(ordered) != world_size:
        raise RankError(f"{len(ordered)} trainer replicas are running but WORLD_SIZE is {world_size}: "
                        "set DEVICES in .env to the number of trainers")
    if own not in ordered:
        raise RankError(f"this replica's address {own} is not among the trainer service's {ordered}")
    return ordered.index(own), ordered[0]


def resolve(name: str) -> list[str]:
    """IPv4 addresses `name` resolves to now (none when it does not resolve yet)."""
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    return sorted({str(info[4][0]) for info in infos}, key=ipaddress.ip_address)


def own_address() -> str:
    """This container's address on its network (Docker maps the host name to it in /etc/hosts)."""
    return socket.gethostbyname(socket.gethostname())


def wait_for_peers(service: str, world_size: int, timeout_s: float,
                   lookup: Callable[[str], list[str]] = resolve, interval_s: float = 2.0) -> list[str]:
    """The service's addresses once there are `world_size` of them, unchanged over two reads."""
    deadline = time.monotonic() + timeout_s
    previous: list[str] = []
    while True:
        current = lookup(service)
        if len(current) == world_size and current == previous:
            return current
        if time.monotonic() > deadline:
            raise RankError(f"after {timeout_s:.0f} s the service {service!r} resolves to {current}, "
                            f"not to {world_size} stable addresses (WORLD_SIZE); are all replicas up?")
        previous = current
        time.sleep(interval_s)


def identity(env: dict[str, str], argv: Sequence[str]) -> dict[str, str]:
    """The environment variables to add for this replica (see the module docstring)."""
    try:
        world_size = int(env["WORLD_SIZE"])
    except (KeyError, ValueError):
        raise RankError("WORLD_SIZE must be set to the number of trainer replicas") from None
    if world_size < 1:
        raise RankError(f"WORLD_SIZE must be at least 1, got {world_size}")
    extra: dict[str, str] = {}
    if "RANK" not in env:
        service = env.get("STREAMTRAIN_TRAINER_SERVICE", "trainer")
        own = env.get("STREAMTRAIN_TRAINER_ADDRESS") or own_address()
        timeout_s = float(_renamed_variable(env, "STREAMTRAIN_RENDEZVOUS_TIMEOUT_S",
                                            "STREAMTRAIN_RENDEZVOUS_TIMEOUT_SECONDS") or "300")
        peers = wait_for_peers(service, world_size, timeout_s)
        rank, master = assign_rank(own, peers, world_size)
        extra.update(RANK=str(rank), MASTER_ADDR=env.get("MASTER_ADDR") or master)
    rank = int(extra.get("RANK", env.get("RANK", "0")))
    extra.setdefault("LOCAL_RANK", env.get("LOCAL_RANK", "0"))
    extra.setdefault("MASTER_PORT", env.get("MASTER_PORT", str(DEFAULT_MASTER_PORT)))
    metrics_port = env.get("STREAMTRAIN_TRAINER_METRICS_PORT")
    if metrics_port:
        extra["STREAMTRAIN_METRICS__PORT"] = str(int(metrics_port))
    if "--devices" in argv:
        names = [d for d in argv[list(argv).index("--devices") + 1].split(",") if d.strip()]
        if len(names) != world_size:
            raise RankError(f"--devices names {len(names)} devices but WORLD_SIZE is {world_size}: "
                            "one trainer replica per device")
    return extra


def _renamed_variable(env: dict[str, str], old: str, new: str) -> str | None:
    """The value of `new`, or of `old` with a note saying it is renamed (accepted until release 0.2)."""
    if new not in env and old in env:
        print(f"trainer entrypoint: {old} is renamed {new}; the old name is accepted until release 0.2",
              file=sys.stderr)
        return env[old]
    return env.get(new)


def main(argv: Sequence[str]) -> int:
    if not argv:
        print("usage: trainer_rank.py COMMAND [ARGS...]  (e.g. streamtrain train --devices 0,1)", file=sys.stderr)
        return 2
    try:
        extra = identity(dict(os.environ), argv)
    except RankError as exc:
        print(f"trainer entrypoint: {exc}", file=sys.stderr)
        return 2
    os.environ.update(extra)
    print("trainer entrypoint: " + " ".join(f"{k}={v}" for k, v in sorted(extra.items())), file=sys.stderr,
          flush=True)
    os.execvp(argv[0], list(argv))
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
