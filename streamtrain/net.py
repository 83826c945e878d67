"""Free TCP ports for the servers streamtrain starts on one machine (broker, metrics, rendezvous).

A port chosen now is bound later, by another process. Asking the kernel for "any free port" (bind to
port 0) hands out one from the ephemeral range, the same range every outgoing connection draws its
source port from; with a dozen processes opening Kafka and gloo connections in between, the chosen
port is sometimes taken before its server binds it ("Address already in use"). Ports here are drawn
at random from below the ephemeral range, where no outgoing connection lands, and checked by binding.
"""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Collection
from pathlib import Path

__all__ = ["free_port", "free_port_block", "free_ports", "is_free", "listening_range"]

#: Lowest port handed out (clear of the well-known and most registered service ports).
_LOWEST = 10_000
_TRIES = 2_000


def listening_range() -> range:
    """Ports to listen on: from 10000 up to just below this host's ephemeral (outgoing) port range."""
    low = 32_768  # Linux's default ip_local_port_range start
    with contextlib.suppress(OSError, ValueError, IndexError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return range(_LOWEST, max(low, _LOWEST + 1_000))


def is_free(host: str, port: int) -> bool:
    """Whether `port` can be bound on `host` now (a server may take it before anyone else does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port_block(n: int, host: str = "127.0.0.1", avoid: Collection[int] = ()) -> int:
    """The first of `n` consecutive ports free on `host` now, outside the ephemeral range.

    Raises:
        RuntimeError: when no such block is found.
    """
    ports = listening_range()
    rng = random.SystemRandom()
    for _ in range(_TRIES):
        base = rng.randrange(ports.start, ports.stop - n + 1)
        block = range(base, base + n)
        if not any(p in avoid for p in block) and all(is_free(host, p) for p in block):
            return base
    raise RuntimeError(f"no block of {n} consecutive free ports on {host} in {ports.start}-{ports.stop - 1}")


def free_ports(n: int, host: str = "127.0.0.1", avoid: Collection[int] = ()) -> list[int]:
    """`n` distinct ports free on `host` now, outside the ephemeral range."""
    chosen: list[int] = []
    for _ in range(n):
        chosen.append(free_port_block(1, host, avoid=[*avoid, *chosen]))
    return chosen


def free_port(host: str = "127.0.0.1", avoid: Collection[int] = ()) -> int:
    """One port free on `host` now, outside the ephemeral range."""
    return free_port_block(1, host, avoid)
