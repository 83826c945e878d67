"""Helpers of the production acceptance (`make compose`): the compose stack on Docker Engine, checked from the host.

`make compose` starts the engine (deploy/offline/engine.sh) and builds every image offline (deploy/offline/build.sh);
these tests then bring the repository's docker-compose.yml up, unchanged, with the two overrides a host without an
image registry or a GPU needs (docker-compose.cpu.yml, docker-compose.offline.yml), as their own Compose project
with their own passwords and host ports, and take it down (volumes too) at the end, also when a test fails.

Everything is real: Docker, Kafka (the stand-in image of the pinned release), the streamtrain images. The host
reaches the stack the way a user's machine does: the published ports (Kafka's external listener, Prometheus, the
coordinator), logged in as the roles' users. Figures measured go to reports/compose/figures.json.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = ("docker-compose.yml", "docker-compose.cpu.yml", "docker-compose.offline.yml")
PROJECT = os.environ.get("STREAMTRAIN_COMPOSE_PROJECT", "streamtrain-acceptance")
FIGURES = ROOT / "reports" / "compose" / "figures.json"
#: Trainer replicas (= devices = ranks) of the acceptance run: two CPU cores run them beside Kafka and the services.
DEVICES = int(os.environ.get("STREAMTRAIN_COMPOSE_DEVICES", "2"))
#: The bridge test's source topic, on a cluster outside the stack, and the bridge's user there.
BRIDGE_TOPIC, BRIDGE_USER = "sensors", "streamtrain-reader"
ROLES = ("KAFKA_BROKER", "KAFKA_ADMIN", "COORDINATOR_KAFKA", "TRAINER_KAFKA", "PRODUCER_KAFKA", "BRIDGE_KAFKA",
         "SERVE_KAFKA", "CLIENT_KAFKA")


def compose_tool() -> list[str]:
    """Compose v2 (the Docker CLI plugin) when installed, else a standalone docker-compose (v2 or Debian's 1.29)."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    standalone = shutil.which("docker-compose")
    if standalone is None:
        pytest.fail("no Compose: `make compose` installs it (deploy/offline/engine.sh)")
    return [standalone]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Stack:
    """The acceptance run's Compose project and how the host reaches it."""

    env: dict[str, str]
    passwords: dict[str, str]
    devices: list[str]
    kafka_port: int
    prometheus_port: int
    coordinator_port: int
    external_host: str
    """What the external listener advertises: the machine's address on the device namespace's bridge."""
    ca: Path
    """The trial CA that signed the external listener's certificate (deploy/tls/make-certs.sh)."""
    device_namespace: str
    """The network namespace of the remote device host."""
    figures: dict[str, Any] = field(default_factory=dict)

    def compose(self, *args: str, check: bool = True, timeout: float = 600,
                files: Sequence[str] = FILES) -> subprocess.CompletedProcess[str]:
        cmd = [*compose_tool(), "--project-directory", str(ROOT), "-p", PROJECT]
        for f in files:
            cmd += ["-f", str(ROOT / f)]
        result = subprocess.run([*cmd, *args], capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: exit {result.returncode}\n{result.stdout[-3000:]}\n"
                                 f"{result.stderr[-3000:]}")
        return result

    def containers(self, service: str, all_states: bool = True) -> list[str]:
        """Container ids of a service (stopped ones too), by the labels Compose puts on them."""
        out = docker("ps", *(["-a"] if all_states else []), "-q", "--filter",
                     f"label=com.docker.compose.project={PROJECT}",
                     "--filter", f"label=com.docker.compose.service={service}").stdout.split()
        return sorted(out)

    def inspect(self, container: str) -> dict[str, Any]:
        return dict(json.loads(docker("inspect", container).stdout)[0])

    def logs(self, container: str) -> str:
        result = docker("logs", container, check=False)
        return result.stdout + result.stderr

    def kafka_overrides(self, user: str = "streamtrain-admin", password_of: str = "KAFKA_ADMIN") -> dict[str, Any]:
        """Settings of a host client on the external listener, logged in as `user`."""
        return {"kafka.bootstrap_servers": f"{self.external_host}:{self.kafka_port}",
                "kafka.security_protocol": "SASL_SSL", "kafka.ssl_ca_location": str(self.ca),
                "kafka.sasl_mechanism": "SCRAM-SHA-512", "kafka.sasl_username": user,
                "kafka.sasl_password": self.passwords[password_of], "kafka.topic_prefix": "streamtrain",
                "job": "streamtrain", "coordinator.devices": list(self.devices), "kafka.replication_factor": 1}

    def host_config(self, user: str = "streamtrain-admin", password_of: str = "KAFKA_ADMIN") -> Any:
        from streamtrain.config import load_config

        return load_config(env={}, overrides=self.kafka_overrides(user, password_of))

    def record(self, name: str, value: Any) -> None:
        self.figures[name] = value
        FIGURES.parent.mkdir(parents=True, exist_ok=True)
        FIGURES.write_text(json.dumps(self.figures, indent=2) + "\n")


def docker(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: exit {result.returncode}: {result.stderr[-2000:]}")
    return result


def wait_for(what: str, check: Any, timeout: float, interval: float = 2.0) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")
