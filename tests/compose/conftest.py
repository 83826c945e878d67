"""The session's compose stack (`stack`): brought up by the tests, taken down with its volumes at the end, also when a
test fails. See compose_stack.py for what it is and how the host reaches it."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from compose_stack import BRIDGE_TOPIC, BRIDGE_USER, DEVICES, PROJECT, ROLES, ROOT, Stack, free_port

#: A device's own system for kcat: Debian trixie's kcat 1.7.1 on librdkafka 2.8. Bookworm's (the machine's own) is on
#: librdkafka 2.0.2, which fails every SCRAM login to Kafka 4.3 (SHA-256 and SHA-512 alike; measured here).
KCAT_ROOT = ROOT / ".streamtrain" / "offline" / "kcat-trixie"


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.fail("no Docker Engine answers: `make compose` starts one (deploy/offline/engine.sh start)")
    from streamtrain.cluster.netns import Network, netns_unavailable, new_run_id

    if (why := netns_unavailable()) is not None:
        pytest.fail(f"the remote device needs a network namespace: {why}")
    # A device host outside the compose network: a network namespace on a bridge of its own. The machine's address
    # on that bridge is the external listener's advertised host, and the name its certificate carries.
    network = Network(new_run_id())
    net_hosts = network.create({"device": 2}, os.getpid(), tmp_path_factory.mktemp("netns"))
    certs = tmp_path_factory.mktemp("tls")
    certs.chmod(0o755)  # the broker runs as its image's user: it reads the (encrypted) keystore through this mount
    passwords = {role: secrets.token_hex(16) for role in ROLES}
    keystore_password = secrets.token_hex(16)
    made = subprocess.run([str(ROOT / "deploy" / "tls" / "make-certs.sh"), network.gateway, str(certs)],
                          capture_output=True, text=True, env={**os.environ,
                                                               "KAFKA_TLS_KEYSTORE_PASSWORD": keystore_password})
    assert made.returncode == 0, made.stderr
    devices = [str(i) for i in range(DEVICES)]
    ports = {"KAFKA_EXTERNAL_PORT": free_port(), "PROMETHEUS_PORT": free_port(), "COORDINATOR_PORT": free_port()}
    # The bridge's source: a cluster of the user's own outside the stack (the bridge test starts it on this address,
    # the machine's on the device bridge), with its own SCRAM login; set from the start, as .env would be.
    bridge = {"BRIDGE_SOURCES": json.dumps([{"topic": BRIDGE_TOPIC, "decoder": "json", "mapping": {
                  "data": "values", "shape": [-1, 16], "label": "label"}}]),
              "BRIDGE_SOURCE_BOOTSTRAP_SERVERS": f"{network.gateway}:{free_port()}",
              "BRIDGE_SOURCE_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "BRIDGE_SOURCE_SASL_MECHANISM": "SCRAM-SHA-512",
              "BRIDGE_SOURCE_USERNAME": BRIDGE_USER, "BRIDGE_SOURCE_PASSWORD": secrets.token_hex(16)}
    env = {**os.environ, "COMPOSE_PROJECT_NAME": PROJECT, "DEVICES": str(DEVICES), "DEVICE_IDS": ",".join(devices),
           "PUBLISH_EVERY_SECONDS": "5", "PRODUCER_RATE": "40", "PRODUCER_RATE_STD": "10",
           "KAFKA_EXTERNAL_HOST": network.gateway, "KAFKA_TLS_DIR": str(certs),
           "KAFKA_TLS_KEYSTORE_PASSWORD": keystore_password,
           **{f"{role}_PASSWORD": pw for role, pw in passwords.items()}, **{k: str(v) for k, v in ports.items()},
           **bridge}
    env.pop("COMPOSE_FILE", None)
    st = Stack(env, passwords, devices, ports["KAFKA_EXTERNAL_PORT"], ports["PROMETHEUS_PORT"],
               ports["COORDINATOR_PORT"], external_host=network.gateway, ca=certs / "ca.crt",
               device_namespace=net_hosts["device"].namespace)
    st.compose("down", "-v", "--remove-orphans", check=False)  # what an interrupted run left
    try:
        yield st
    finally:
        for service in ("kafka", "kafka-setup", "coordinator", "trainer", "serve", "bridge"):
            for cid in st.containers(service):
                (ROOT / "reports" / "compose").mkdir(parents=True, exist_ok=True)
                (ROOT / "reports" / "compose" / f"{service}-{cid[:12]}.log").write_text(st.logs(cid))
        st.compose("down", "-v", "--remove-orphans", check=False)
        network.destroy()
        if st.figures:
            print("\ncompose acceptance figures: " + json.dumps(st.figures))


@pytest.fixture(scope="session")
def kcat_root() -> Path:
    """A root file system with a current kcat (debootstrap --variant=minbase trixie, about 45 s the first time; kept
    for later runs): the kcat test runs it with chroot inside the device's network namespace."""
    if not (KCAT_ROOT / "usr" / "bin" / "kcat").exists():
        partial = KCAT_ROOT.with_name(KCAT_ROOT.name + ".partial")
        subprocess.run(["rm", "-rf", str(partial)], check=True)
        made = subprocess.run(["debootstrap", "--variant=minbase", "--include=kcat", "trixie", str(partial),
                               os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")],
                              capture_output=True, text=True, timeout=900)
        assert made.returncode == 0, f"debootstrap of kcat's root failed:\n{made.stdout[-3000:]}{made.stderr[-2000:]}"
        partial.rename(KCAT_ROOT)
    return KCAT_ROOT
