"""The production compose files, checked by a real Compose parser (no Docker engine needed).

`docker compose config` (Compose v2) or `docker-compose config` (Debian's docker-compose, installed by
`make compose-tool`) validates each file against the Compose schema, interpolates `.env` and merges
the multi-broker override exactly as `docker compose up` would; the tests then check the resolved
model: every streamtrain command parses as a real `streamtrain` subcommand with real flags, one GPU
per trainer replica, health-gated start-up order, the pinned Kafka, and paths that exist in the repo.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
import xml.etree.ElementTree as ET
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml
from typer.testing import CliRunner

from streamtrain.cli import app
from streamtrain.config import load_config

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "docker-compose.yml"
MULTI = ROOT / "docker-compose.multi-broker.yml"
STREAMTRAIN_SERVICES = ("producers", "coordinator", "trainer", "serve", "bridge")
#: One-shot services: they run to completion before the others start (no health check, not restarted once done).
SETUP_SERVICES = ("kafka-setup",)


def _compose_tool() -> list[str]:
    """The Compose CLI to parse with: the Docker CLI plugin, else a standalone docker-compose."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    standalone = shutil.which("docker-compose")
    if standalone:
        return [standalone]
    pytest.fail("no Compose parser: run `make compose-tool` (installs Debian's docker-compose)")


def _run_compose(files: list[Path], *args: str, project_dir: Path = ROOT) -> subprocess.CompletedProcess[str]:
    # Only the repo's .env may set the knobs: a DEVICES=... in the caller's shell must not change the test.
    # Every profile on (the bridge's): Compose v2 leaves a service of an inactive profile out of `config`.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"),
           "COMPOSE_PROFILES": "bridge"}
    cmd = [*_compose_tool(), "--project-directory", str(project_dir)]
    for f in files:
        cmd += ["-f", str(f)]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, env=env, timeout=120)


@cache
def resolved(*files: Path) -> dict[str, Any]:
    """The model `docker compose config` resolves from `files` (with the repo's .env)."""
    result = _run_compose(list(files), "config")
    assert result.returncode == 0, f"compose config failed:\n{result.stderr}"
    model = yaml.safe_load(result.stdout)
    assert isinstance(model, dict)
    return model


def dotenv() -> dict[str, str]:
    values = {}
    for line in (ROOT / ".env").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def _bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """target -> host source of a service's bind mounts (short syntax from v1, long syntax from v2)."""
    mounts = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
            if source.startswith(("/", ".")):
                mounts[target] = Path(source)
        elif volume.get("type") == "bind":
            mounts[volume["target"]] = Path(volume["source"])
    return mounts


def _volume_targets(service: dict[str, Any]) -> set[str]:
    """Where a service mounts its volumes and binds."""
    return {v.split(":")[1] if isinstance(v, str) else v["target"] for v in service.get("volumes", [])}


def _named_volumes(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """target -> (volume name, read only) of a service's named volumes (short syntax from v1, long from v2)."""
    mounts = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target, *mode = volume.split(":")
            if not source.startswith(("/", ".")):
                mounts[target] = (source, mode == ["ro"])
        elif volume.get("type") == "volume":
            mounts[volume["target"]] = (volume["source"], bool(volume.get("read_only")))
    return mounts


def _split_subcommand(args: list[str]) -> tuple[list[str], list[str]]:
    """(["produce"], [flags...]): the subcommand path of `streamtrain ARGS`, then the arguments after it."""
    group: object = typer.main.get_command(app)
    path = []
    while args and not args[0].startswith("-") and args[0] in getattr(group, "commands", {}):
        group = group.commands[args[0]]  # type: ignore[attr-defined]
        path.append(args[0])
        args = args[1:]
    return path, args


# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("files", [(BASE,), (BASE, MULTI)], ids=["single-broker", "multi-broker"])
def test_compose_files_pass_the_compose_parser(files: tuple[Path, ...]) -> None:
    model = resolved(*files)
    assert {"kafka", "producers", "coordinator", "trainer", "prometheus", "grafana"} <= set(model["services"])


def test_the_parser_rejects_what_compose_up_would_reject(tmp_path: Path) -> None:
    # The same parser must fail on a misspelt key, or passing it would prove nothing.
    broken = BASE.read_text().replace("condition: service_healthy", "condtion: service_healthy", 1)
    (tmp_path / "docker-compose.yml").write_text(broken)
    (tmp_path / ".env").write_text((ROOT / ".env").read_text())
    result = _run_compose([tmp_path / "docker-compose.yml"], "config", project_dir=tmp_path)
    assert result.returncode != 0
    # Debian's docker-compose names the misspelt key; Compose v2 the key it then misses.
    assert "condtion" in result.stderr or "condition is required" in result.stderr


@pytest.mark.parametrize("service", STREAMTRAIN_SERVICES + SETUP_SERVICES)
def test_every_service_command_parses_as_a_streamtrain_subcommand(service: str) -> None:
    spec = resolved(BASE)["services"][service]
    command = spec["command"]
    assert isinstance(command, list) and command[0] == "streamtrain", command
    path, args = _split_subcommand(command[1:])
    assert path, f"{service}: `{' '.join(command)}` names no streamtrain subcommand"
    # With --help, click still parses every argument first: an unknown flag fails (exit 2) before help.
    result = CliRunner().invoke(app, [*path, *args, "--help"])
    assert result.exit_code == 0, f"{service}: `{' '.join(command)}`:\n{result.output}"
    assert "Usage: " in result.output and " ".join(path) in result.output
    bogus = CliRunner().invoke(app, [*path, *args, "--no-such-flag", "--help"])
    assert bogus.exit_code == 2, bogus.output


def test_streamtrain_settings_in_the_environment_are_real_settings() -> None:
    for service in STREAMTRAIN_SERVICES + SETUP_SERVICES:
        env = {k: str(v) for k, v in resolved(BASE, MULTI)["services"][service]["environment"].items()}
        config = load_config(env=env)  # raises ConfigError naming any unknown or bad STREAMTRAIN_* value
        assert config.metrics.bind_address == "0.0.0.0"
        port = 9091 if service in SETUP_SERVICES else 9092  # the set-up logs in on the brokers' own listener
        assert config.kafka.bootstrap_servers == f"kafka:{port},kafka-2:{port},kafka-3:{port}"
        assert config.kafka.replication_factor == 3


def test_trainers_are_one_replica_per_device_each_with_one_gpu() -> None:
    knobs = dotenv()
    devices = int(knobs["DEVICES"])
    assert knobs["DEVICE_IDS"].split(",") == [str(i) for i in range(devices)]  # the producers' ids
    trainer = resolved(BASE)["services"]["trainer"]
    assert int(trainer["deploy"]["replicas"]) == devices
    assert int(trainer["environment"]["WORLD_SIZE"]) == devices
    (gpu,) = trainer["deploy"]["resources"]["reservations"]["devices"]
    assert gpu["driver"] == "nvidia" and int(gpu["count"]) == 1 and "gpu" in gpu["capabilities"]
    assert trainer["command"][trainer["command"].index("--devices") + 1] == knobs["DEVICE_IDS"]
    # The image's entrypoint gives each replica its rank (deploy/trainer_rank.py).
    assert trainer["entrypoint"] == ["streamtrain-trainer-entrypoint"]
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "COPY deploy/trainer_rank.py /usr/local/bin/streamtrain-trainer-entrypoint" in dockerfile
    assert trainer["build"]["target"] == "trainer"
    assert re.search(r"^FROM \S+ AS trainer$", dockerfile, re.M)
    producers = resolved(BASE)["services"]["producers"]["command"]
    assert producers[producers.index("--devices") + 1] == str(devices)


@pytest.mark.parametrize("files", [(BASE,), (BASE, MULTI)], ids=["single-broker", "multi-broker"])
def test_start_up_waits_for_healthy_dependencies(files: tuple[Path, ...]) -> None:
    services = resolved(*files)["services"]
    for name, spec in services.items():
        if name not in SETUP_SERVICES:
            assert spec.get("healthcheck", {}).get("test"), f"{name} has no health check"
    brokers = {n for n, spec in services.items() if spec["image"].startswith("apache/kafka:")}
    for name in (*STREAMTRAIN_SERVICES, *SETUP_SERVICES):
        depends = services[name]["depends_on"]
        assert brokers <= set(depends), f"{name} starts before every broker is healthy"
        assert all(depends[b]["condition"] == "service_healthy" for b in brokers), name
        if name in STREAMTRAIN_SERVICES:  # and only once the users, ACLs and topics are in place
            assert depends["kafka-setup"]["condition"] == "service_completed_successfully", name
            assert all(d["condition"] == "service_healthy" for n, d in depends.items() if n != "kafka-setup"), name
    for name in SETUP_SERVICES:
        assert services[name]["restart"] == "on-failure"  # retried until it succeeds, then done
    assert "coordinator" in services["trainer"]["depends_on"]
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"


def test_kafka_is_the_official_image_of_the_pinned_version_in_kraft_mode() -> None:
    pom = ET.parse(ROOT / "kafka" / "pom.xml").getroot()
    version = pom.find("{*}properties/{*}kafka.version")
    assert version is not None and version.text
    kafka = resolved(BASE)["services"]["kafka"]
    assert kafka["image"] == f"apache/kafka:{version.text}"
    env = kafka["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_LOG_DIRS"] in _volume_targets(kafka)
    assert env["CLUSTER_ID"] == dotenv()["KAFKA_CLUSTER_ID"]


def test_multi_broker_variant_is_three_voters_with_replication_three() -> None:
    services = resolved(BASE, MULTI)["services"]
    brokers = {n: s["environment"] for n, s in services.items() if s["image"].startswith("apache/kafka:")}
    assert sorted(brokers) == ["kafka", "kafka-2", "kafka-3"]
    assert sorted(int(e["KAFKA_NODE_ID"]) for e in brokers.values()) == [1, 2, 3]
    voters = {e["KAFKA_CONTROLLER_QUORUM_VOTERS"] for e in brokers.values()}
    assert voters == {"1@kafka:9093,2@kafka-2:9093,3@kafka-3:9093"}
    for env in brokers.values():
        assert env["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
    assert len({e["KAFKA_ADVERTISED_LISTENERS"] for e in brokers.values()}) == 3
    # Each broker has its own data volume.
    # Short syntax (Compose v1: `source:target:mode`) or long (v2); not the shared TLS keystore.
    mounts = [v.split(":")[:2] if isinstance(v, str) else [v["source"], v["target"]]
              for n in brokers for v in services[n]["volumes"]]
    assert len({source for source, target in mounts if target.endswith("/data")}) == 3


def test_provisioning_mounts_point_at_the_repo_files() -> None:
    services = resolved(BASE)["services"]
    prom = _bind_mounts(services["prometheus"])
    assert prom["/etc/prometheus/prometheus.yml"].resolve() == ROOT / "deploy/prometheus/prometheus.yml"
    assert "/etc/prometheus/prometheus.yml" in " ".join(services["prometheus"]["command"])
    grafana = _bind_mounts(services["grafana"])
    assert grafana["/etc/grafana/provisioning"].resolve() == ROOT / "deploy/grafana/provisioning"
    providers = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/streamtrain.yml").read_text())
    (provider,) = providers["providers"]
    dashboards_path = provider["options"]["path"]
    assert grafana[dashboards_path].resolve() == ROOT / "deploy/grafana/dashboards"
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (ROOT / "deploy/grafana/dashboards" / Path(home).relative_to(dashboards_path)).is_file()


def test_prometheus_scrapes_each_service_on_the_port_it_serves() -> None:
    services = resolved(BASE)["services"]
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    targets: set[str] = set()
    for job in config["scrape_configs"]:
        for static in job.get("static_configs", []):
            targets.update(static["targets"])
        for dns in job.get("dns_sd_configs", []):
            targets.update(f"{name}:{dns['port']}" for name in dns["names"])
    producers = services["producers"]["environment"]["STREAMTRAIN_PRODUCER__METRICS_PORT"]
    coordinator = services["coordinator"]["command"]
    trainer = services["trainer"]["environment"]["STREAMTRAIN_TRAINER_METRICS_PORT"]
    assert f"producers:{producers}" in targets
    assert f"coordinator:{coordinator[coordinator.index('--port') + 1]}" in targets
    assert f"trainer:{trainer}" in targets
    serve = services["serve"]["command"]
    assert f"serve:{serve[serve.index('--port') + 1]}" in targets
    bridge = services["bridge"]["command"]
    assert f"bridge:{bridge[bridge.index('--port') + 1]}" in targets
    promtool = shutil.which("promtool")
    if promtool:  # the real Prometheus config parser, when the Prometheus package is installed
        check = subprocess.run([promtool, "check", "config", str(ROOT / "deploy/prometheus/prometheus.yml")],
                               capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr


def test_serve_reads_the_model_versions_the_trainers_write() -> None:
    services = resolved(BASE)["services"]
    trainer, serve = (load_config(env={k: str(v) for k, v in services[n]["environment"].items()})
                      for n in ("trainer", "serve"))
    assert trainer.versions.dir is not None and trainer.versions.dir == serve.versions.dir
    mounts = {n: _named_volumes(services[n]) for n in ("trainer", "serve")}
    where = str(trainer.versions.dir)
    assert mounts["trainer"][where][0] == mounts["serve"][where][0]  # one volume, both see it
    assert mounts["serve"][where][1] and not mounts["trainer"][where][1]  # only the trainers write versions


def test_the_trainer_image_target_and_the_service_image_exist_in_the_dockerfile() -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", dockerfile, re.M))
    for name, spec in resolved(BASE)["services"].items():
        if "build" in spec:
            assert spec["build"]["target"] in stages, name
            assert Path(spec["build"].get("dockerfile", "Dockerfile")).name == "Dockerfile"
    # What the Dockerfile copies is in the repo and not excluded from the build context.
    ignored = (ROOT / ".dockerignore").read_text().split()
    for source in re.findall(r"^COPY (?!--from)(\S+)", dockerfile, re.M):
        assert (ROOT / source).exists(), source
        assert source not in ignored, source
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    for pattern in packages["include"]:
        assert f"COPY {pattern.rstrip('*')} " in dockerfile, f"the image lacks package {pattern}"


def _kafka_properties(env: dict[str, object]) -> dict[str, str]:
    """server.properties as the apache/kafka image writes it from its KAFKA_* environment (KAFKA_A_B..C_D___E
    becomes a.b_c.d-e: `_` is `.`, `__` is `_`, `___` is `-`)."""
    props = {}
    for key, value in env.items():
        if key.startswith("KAFKA_") and key not in ("KAFKA_HEAP_OPTS", "KAFKA_OPTS"):
            name = key.removeprefix("KAFKA_").lower().replace("_", ".").replace("...", "-").replace("..", "_")
            props[name] = str(value)
    return props


@pytest.mark.parametrize("files", [(BASE,), (BASE, MULTI)], ids=["single-broker", "multi-broker"])
def test_every_broker_authenticates_every_listener_and_authorizes_every_request(files: tuple[Path, ...]) -> None:
    services = resolved(*files)["services"]
    brokers = {n: _kafka_properties(s["environment"]) for n, s in services.items()
               if s["image"].startswith("apache/kafka:")}
    assert len(brokers) == (3 if MULTI in files else 1)
    for name, props in brokers.items():
        assert props["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer", name
        assert props["super.users"] == "User:kafka-broker" and props["allow.everyone.if.no.acl.found"] == "false"
        protocols = dict(p.split(":") for p in props["listener.security.protocol.map"].split(","))
        listeners = [entry.split("://")[0] for entry in props["listeners"].split(",")]
        assert set(listeners) == set(protocols) == {"BROKER", "CLIENT", "CONTROLLER", "EXTERNAL"}
        assert set(protocols.values()) <= {"SASL_PLAINTEXT", "SASL_SSL"}, f"{name}: a listener without authentication"
        # Outside the compose network, passwords only over TLS, with the keystore KAFKA_TLS_DIR holds.
        assert protocols["EXTERNAL"] == "SASL_SSL", name
        assert props["listener.name.external.ssl.keystore.location"] == "/etc/kafka/tls/external.p12", name
        for listener in listeners:
            for mechanism in props[f"listener.name.{listener.lower()}.sasl.enabled.mechanisms"].split(","):
                jaas = props[f"listener.name.{listener.lower()}.{mechanism.lower()}.sasl.jaas.config"]
                assert jaas.endswith(";") and "LoginModule required" in jaas, (name, listener)
        for listener in ("broker", "controller"):  # the brokers' own user, who alone is a super user
            jaas = props[f"listener.name.{listener}.plain.sasl.jaas.config"]
            secret = dotenv()["KAFKA_BROKER_PASSWORD"]
            assert f'username="kafka-broker" password="{secret}" user_kafka-broker="{secret}"' in jaas
        assert props["sasl.mechanism.inter.broker.protocol"] == props["sasl.mechanism.controller.protocol"] == "PLAIN"
        assert props["inter.broker.listener.name"] == "BROKER" and props["controller.listener.names"] == "CONTROLLER"
    assert len({tuple(sorted((k, v) for k, v in p.items() if "sasl" in k or "authoriz" in k or "super" in k))
                for p in brokers.values()}) == 1  # the three brokers are configured alike


def test_each_service_is_its_own_role_and_the_setup_grants_exactly_those_roles() -> None:
    from streamtrain.acl import role_acls, role_principals

    services = resolved(BASE)["services"]
    knobs = dotenv()
    devices = knobs["DEVICE_IDS"].split(",")
    configs = {n: load_config(env={k: str(v) for k, v in services[n]["environment"].items()})
               for n in (*STREAMTRAIN_SERVICES, *SETUP_SERVICES)}
    users = {n: configs[n].kafka.sasl_username for n in STREAMTRAIN_SERVICES}
    assert len(set(users.values())) == len(users)  # no two services share a principal
    setup = configs["kafka-setup"]
    roles = role_principals(setup, devices)
    assert roles[users["producers"]] == "producer" and roles[users["coordinator"]] == "coordinator"
    assert roles[users["trainer"]] == "trainer" and roles[users["serve"]] == "serve"
    passwords = {name: pw.get_secret_value() for name, pw in setup.acl.passwords.items()}
    for service, user in users.items():  # the set-up creates each service's user with the password it logs in with
        password = configs[service].kafka.sasl_password
        assert password is not None and passwords[user] == password.get_secret_value()
        assert configs[service].kafka.security_protocol == "SASL_PLAINTEXT"
        assert configs[service].kafka.sasl_mechanism == "SCRAM-SHA-512"
    # Beside the services' users: the admin (set-up, audit) and the client (applications asking serve from outside).
    assert set(passwords) == {*users.values(), setup.acl.admin, setup.acl.client}
    assert setup.kafka.sasl_username == "kafka-broker"  # the super user, on the brokers' listener
    acls = role_acls(setup, devices)
    writes = {a.resource for a in acls if a.principal == f"User:{users['producers']}"}
    assert writes == {setup.kafka.topics.device(d) for d in devices}
    # The bridge's principal gets rights only once BRIDGE_SOURCES names its topics (the same value reaches both).
    assert configs["bridge"].bridge.sources == setup.bridge.sources == ()
    assert users["bridge"] not in role_principals(setup, devices)
    sources = '[{"topic": "sensors", "decoder": "json"}]'
    bridged = load_config(env={**{k: str(v) for k, v in services["kafka-setup"]["environment"].items()},
                               "STREAMTRAIN_BRIDGE__SOURCES": sources})
    assert role_principals(bridged, devices)[users["bridge"]] == "bridge"
    # Every rank knows the truncation policy the coordinator runs, so it can check each plan against it.
    coordinator = services["coordinator"]["command"]
    truncation = coordinator[coordinator.index("--truncation") + 1]
    assert configs["trainer"].coordinator.truncation == truncation == configs["coordinator"].coordinator.truncation
    assert configs["trainer"].coordinator.max_lag_samples == configs["coordinator"].coordinator.max_lag_samples


def test_the_bridge_reads_a_cluster_of_your_own_when_env_names_it_and_the_setup_grants_its_twins(
        tmp_path: Path) -> None:
    from streamtrain.acl import role_acls

    services = resolved(BASE)["services"]
    env = {n: {k: str(v) for k, v in services[n]["environment"].items()} for n in ("bridge", "kafka-setup")}
    assert load_config(env=env["bridge"]).bridge.source_cluster is None  # .env leaves it empty: the stack's own
    ca = tmp_path / "source-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    values = {"BOOTSTRAP_SERVERS": "kafka.example.com:9093", "SECURITY_PROTOCOL": "SASL_SSL",
              "SASL_MECHANISM": "SCRAM-SHA-512", "SASL_USERNAME": "bridge-reader", "SASL_PASSWORD": "s3cret",
              "SSL_CA_LOCATION": str(ca)}
    named = {k for k in env["bridge"] if k.startswith("STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__")}
    assert named == {f"STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__{k}" for k in values}  # none misspelt (empty is unset)
    sources = {"STREAMTRAIN_BRIDGE__SOURCES": '[{"topic": "sensors", "decoder": "json"}]'}
    bridge = load_config(env={**env["bridge"], **sources, **{k: values[k.rsplit("__", 1)[1]] for k in named}})
    source = bridge.bridge.source_cluster
    assert source is not None and source.bootstrap_servers == "kafka.example.com:9093"
    assert source.sasl_username == "bridge-reader" and source.ssl_ca_location == ca
    setup = load_config(env={**env["kafka-setup"], **sources,
                             "STREAMTRAIN_BRIDGE__SOURCE_CLUSTER__BOOTSTRAP_SERVERS": "kafka.example.com:9093"})
    twin = setup.kafka.topics.bridge_offsets("sensors")
    granted = {(a.operation, a.resource) for a in role_acls(setup, ["0"]) if a.principal == "User:streamtrain-bridge"}
    assert {("READ", twin), ("CREATE", twin), ("ALTER", twin)} <= granted and ("READ", "sensors") not in granted


def test_no_password_is_written_into_the_compose_files_and_the_placeholders_are_refused() -> None:
    from streamtrain.acl import apply_users
    from streamtrain.kafka import make_admin

    # Every password in the files is a reference to .env (or, escaped, to the container's own environment).
    literal = re.compile(r'password="([^"]*)"|user_[\w-]+="([^"]*)"|"streamtrain-[\w-]+": "([^"]*)"|_PASSWORD: (\S+)')
    for path in (BASE, MULTI):
        found = [v for match in literal.finditer(path.read_text()) for v in match.groups() if v]
        assert found and all(v.startswith(("${", "$$")) for v in found), (path.name, found)
    setup = load_config(env={k: str(v) for k, v in resolved(BASE)["services"]["kafka-setup"]["environment"].items()})
    with pytest.raises(ValueError, match="change-me placeholder"):  # .env ships placeholders: set real ones first
        apply_users(make_admin(setup.kafka), setup, dotenv()["DEVICE_IDS"].split(","))
