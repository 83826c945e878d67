"""Hosts as Linux network namespaces on a bridge: addresses, links, their processes, and the clean-up.

One test bed run owns a bridge `stc<run>br` in the machine's own namespace, holding the gateway
address `.1` of a private /24, and one namespace `stc<run>-<host>` per host, joined to the bridge by a
veth pair (`stc<run>v<n>` on the bridge, `eth0` inside). A namespace has no route beyond its /24, so
its processes reach only each other and the machine's own address on the bridge; nothing else on any
network sees their traffic. Pulling a host's cable is setting its bridge-side veth down. Where the
machine filters bridged traffic through iptables (Docker's engine loads br_netfilter and sets the FORWARD
chain's policy to DROP), the run also puts one ACCEPT rule for traffic within its bridge at the head of
FORWARD, and takes it out with the bridge.

A run is registered under `/run/streamtrain-cluster/<run>.json` with its owner (the process whose
end should end it: a test session) before anything is created, and unregistered after everything
is gone. `sweep` removes every run whose owner has died (a test run killed with SIGKILL) and every
`stc*` namespace or link that no run claims: the processes inside the namespaces, the namespaces,
the veths and the bridge. A run made by `streamtrain cluster up` has no owner process; it lives
until `streamtrain cluster down`, or until its state directory is deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "HostNet",
    "Network",
    "NetworkError",
    "RunRecord",
    "kill_namespace",
    "namespace_pids",
    "netns_unavailable",
    "new_run_id",
    "process_start_time",
    "sweep",
]

logger = logging.getLogger(__name__)

PREFIX = "stc"
RUNS_DIR = Path("/run/streamtrain-cluster")
#: The /16 test beds take their /24s from: private (RFC 1918), and clear of what Docker and most VPNs pick.
SUPERNET = ipaddress.IPv4Network("10.213.0.0/16")
_RUN_NAME = re.compile(rf"^{PREFIX}([0-9a-f]{{5}})(?:-|br$|v\d+$)")
_CAP_NET_ADMIN = 12


class NetworkError(RuntimeError):
    """A namespace, link or address could not be made or removed; the message has `ip`'s answer."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def _forward_within(bridge: str, allow: bool) -> None:
    """Insert (or delete, every copy) the FORWARD rule that accepts traffic between the ports of `bridge`.

    With br_netfilter loaded and `net.bridge.bridge-nf-call-iptables` set, frames between two ports of a Linux
    bridge pass the FORWARD chain, whose policy Docker's engine sets to DROP: the hosts of a run could not reach
    each other. Without an `iptables` command there is nothing to open.
    """
    if shutil.which("iptables") is None:
        return
    rule = ["FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]
    if allow:
        done = subprocess.run(["iptables", "-w", "-I", *rule], capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            logger.warning("could not open forwarding within %s (%s): hosts may not reach each other where the "
                           "FORWARD chain drops bridged traffic", bridge, done.stderr.strip())
        return
    for _ in range(16):  # a rule inserted twice is deleted twice
        done = subprocess.run(["iptables", "-w", "-D", *rule], capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            return


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be made here (no `ip`, no root / CAP_NET_ADMIN, refused), or None."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed: apt-get install iproute2"
    try:
        caps = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("CapEff:"))
        has_cap = bool(int(caps.split()[1], 16) >> _CAP_NET_ADMIN & 1)
    except (OSError, StopIteration, ValueError):
        has_cap = os.geteuid() == 0
    if not has_cap:
        return "making network namespaces needs root or CAP_NET_ADMIN"
    probe = f"{PREFIX}probe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` was refused: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def new_run_id() -> str:
    """Five hex digits naming one run's namespaces and links (interface names have 15 characters at most)."""
    return secrets.token_hex(3)[:5]


@dataclass(frozen=True)
class HostNet:
    """One host: its namespace, its address, and the bridge end of its cable."""

    name: str
    namespace: str
    address: str
    veth: str


@dataclass(frozen=True)
class RunRecord:
    """What the registry knows about one run."""

    run_id: str
    owner_pid: int | None
    owner_start: int | None
    state_dir: str

    def owner_alive(self) -> bool:
        """The owner still runs (the same process, not a recycled pid); a run without owner: its state dir exists."""
        if self.owner_pid is None:
            return Path(self.state_dir).is_dir()
        started = process_start_time(self.owner_pid)
        return started is not None and started == self.owner_start


def process_start_time(pid: int) -> int | None:
    """The start time of `pid` in clock ticks since boot (None when it is gone or a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[19])


@contextlib.contextmanager
def _registry_lock() -> Iterator[None]:
    RUNS_DIR.mkdir(parents=True, exist_ok=True)
    with (RUNS_DIR / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two runs starting together must not pick the same /24
        yield


def _records() -> dict[str, RunRecord]:
    found = {}
    for path in RUNS_DIR.glob("*.json") if RUNS_DIR.is_dir() else ():
        try:
            found[path.stem] = RunRecord(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            logger.warning("unreadable test bed record %s: its run counts as stale", path)
    return found


def _subnets_in_use() -> list[ipaddress.IPv4Network]:
    out = _ip("-4", "-o", "addr", "show").stdout + _ip("-4", "route", "show").stdout
    nets = []
    for word in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)\b", out):
        with contextlib.suppress(ValueError):
            nets.append(ipaddress.IPv4Network(word, strict=False))
    return nets


class Network:
    """The bridge and host namespaces of one run.

    Args:
        run_id: the run's id (`new_run_id`).
        subnet: its /24; None picks a free one in 10.213.0.0/16 when `create` runs.
    """

    def __init__(self, run_id: str, subnet: str | None = None) -> None:
        self.run_id = run_id
        self.subnet = ipaddress.IPv4Network(subnet) if subnet else None
        self.bridge = f"{PREFIX}{run_id}br"
        self.hosts: dict[str, HostNet] = {}

    @property
    def gateway(self) -> str:
        """The machine's own address on the bridge (where tests and `cluster status` reach the hosts from)."""
        assert self.subnet is not None
        return str(self.subnet.network_address + 1)

    def namespace(self, host: str) -> str:
        """The name of `host`'s namespace in this run."""
        return f"{PREFIX}{self.run_id}-{host}"

    def create(self, hosts: Mapping[str, int], owner_pid: int | None, state_dir: Path) -> dict[str, HostNet]:
        """Register the run, then make the bridge and one namespace per host (name -> last octet of its address).

        Raises:
            NetworkError: something could not be made; what was made is removed again.
        """
        with _registry_lock():
            if self.subnet is None:
                self.subnet = self._free_subnet()
            record = RunRecord(self.run_id, owner_pid, process_start_time(owner_pid) if owner_pid else None,
                               str(state_dir.resolve()))
            (RUNS_DIR / f"{self.run_id}.json").write_text(json.dumps(record.__dict__))
            try:
                _ip("link", "add", self.bridge, "type", "bridge")
                _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
                _ip("link", "set", self.bridge, "up")
                _forward_within(self.bridge, allow=True)
                for index, (name, octet) in enumerate(hosts.items()):
                    self.hosts[name] = self._add_host(name, index, str(self.subnet.network_address + octet))
            except (NetworkError, subprocess.TimeoutExpired):
                self.destroy()
                raise
        logger.info("test bed %s: bridge %s on %s, hosts %s", self.run_id, self.bridge, self.subnet,
                    ", ".join(f"{h.name}={h.address}" for h in self.hosts.values()))
        return self.hosts

    def _free_subnet(self) -> ipaddress.IPv4Network:
        used = _subnets_in_use()
        start = int(self.run_id, 16) % 256  # spread runs over the /16, then take the first free /24 from there
        candidates = list(SUPERNET.subnets(new_prefix=24))
        for i in range(len(candidates)):
            net = candidates[(start + i) % len(candidates)]
            if not any(net.overlaps(u) for u in used):
                return net
        raise NetworkError(f"no free /24 left in {SUPERNET} for a test bed")

    def _add_host(self, name: str, index: int, address: str) -> HostNet:
        assert self.subnet is not None
        ns, veth = self.namespace(name), f"{PREFIX}{self.run_id}v{index}"
        _ip("netns", "add", ns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", veth, "master", self.bridge)
        _ip("link", "set", veth, "up")
        _ip("-n", ns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")  # services also talk to themselves (torchrun's store, JMX)
        return HostNet(name, ns, address, veth)

    def set_link(self, host: str, up: bool) -> None:
        """Plug a host's cable in or pull it out (its bridge-side veth up or down)."""
        _ip("link", "set", self.hosts[host].veth, "up" if up else "down")

    def link_up(self, host: str) -> bool:
        """Whether a host's cable is plugged in."""
        out = _ip("-o", "link", "show", self.hosts[host].veth, check=False).stdout
        flags = out.partition("<")[2].partition(">")[0]
        return "UP" in flags.split(",")

    def pids(self, host: str) -> list[int]:
        """Every process running in a host's namespace."""
        return namespace_pids(self.hosts[host].namespace)

    def destroy(self) -> None:
        """Kill every process in the run's namespaces, remove them, the veths, the bridge and the registry entry."""
        destroy_run(self.run_id)


def namespace_pids(namespace: str) -> list[int]:
    """The processes in `namespace` (none when it does not exist)."""
    out = _ip("netns", "pids", namespace, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def kill_namespace(namespace: str, timeout: float = 10.0) -> int:
    """SIGKILL every process in `namespace` and wait until they are gone; returns how many there were."""
    victims = namespace_pids(namespace)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(process_start_time(p) is not None for p in victims) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(victims)


def _resources() -> dict[str, tuple[list[str], list[str]]]:
    """Namespaces and links named like a run's, by run id."""
    found: dict[str, tuple[list[str], list[str]]] = {}
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if m := _RUN_NAME.match(name):
            found.setdefault(m.group(1), ([], []))[0].append(name)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        name = parts[1].strip().split("@")[0] if len(parts) > 1 else ""
        if m := _RUN_NAME.match(name):
            found.setdefault(m.group(1), ([], []))[1].append(name)
    return found


def destroy_run(run_id: str) -> None:
    """Remove everything of run `run_id`: processes in its namespaces, namespaces, veths, bridge, registry entry."""
    namespaces, links = _resources().get(run_id, ([], []))
    for ns in namespaces:
        kill_namespace(ns)
        _ip("netns", "del", ns, check=False)
    # A namespace goes away lazily; its veth end with it. Deleting the bridge-side ends now does not wait.
    for link in sorted(links, key=lambda name: name.endswith("br")):  # the bridge last
        _ip("link", "del", link, check=False)
    _forward_within(f"{PREFIX}{run_id}br", allow=False)
    with contextlib.suppress(FileNotFoundError):
        (RUNS_DIR / f"{run_id}.json").unlink()


def sweep() -> list[str]:
    """Remove every run whose owner is gone and every `stc*` namespace or link no run claims; returns the run ids."""
    records = _records()
    stale = {r for r, rec in records.items() if not rec.owner_alive()}
    stale |= set(_resources()) - set(records)
    for run_id in sorted(stale):
        logger.warning("removing stale test bed %s (its owner is gone)", run_id)
        destroy_run(run_id)
    return sorted(stale)
