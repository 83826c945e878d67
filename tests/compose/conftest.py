"""The session's compose stack (`stack`): brought up by the tests, taken down with its volumes at the end, also when a
test fails. See compose_stack.py for what it is and how the host reaches it."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator

import pytest
from compose_stack import DEVICES, PROJECT, ROLES, ROOT, Stack, free_port


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.fail("no Docker Engine answers: `make compose` starts one (deploy/offline/engine.sh start)")
    passwords = {role: secrets.token_hex(16) for role in ROLES}
    devices = [str(i) for i in range(DEVICES)]
    ports = {"KAFKA_EXTERNAL_PORT": free_port(), "PROMETHEUS_PORT": free_port(), "COORDINATOR_PORT": free_port()}
    env = {**os.environ, "COMPOSE_PROJECT_NAME": PROJECT, "DEVICES": str(DEVICES), "DEVICE_IDS": ",".join(devices),
           "PUBLISH_EVERY_SECONDS": "5", "PRODUCER_RATE": "40", "PRODUCER_RATE_STD": "10",
           **{f"{role}_PASSWORD": pw for role, pw in passwords.items()}, **{k: str(v) for k, v in ports.items()}}
    env.pop("COMPOSE_FILE", None)
    st = Stack(env, passwords, devices, ports["KAFKA_EXTERNAL_PORT"], ports["PROMETHEUS_PORT"],
               ports["COORDINATOR_PORT"])
    st.compose("down", "-v", "--remove-orphans", check=False)  # what an interrupted run left
    try:
        yield st
    finally:
        for service in ("kafka", "kafka-setup", "coordinator", "trainer", "serve"):
            for cid in st.containers(service):
                (ROOT / "reports" / "compose").mkdir(parents=True, exist_ok=True)
                (ROOT / "reports" / "compose" / f"{service}-{cid[:12]}.log").write_text(st.logs(cid))
        st.compose("down", "-v", "--remove-orphans", check=False)
        if st.figures:
            print("\ncompose acceptance figures: " + json.dumps(st.figures))
