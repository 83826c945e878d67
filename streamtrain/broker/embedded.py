"""A real Apache Kafka broker (KRaft, broker + controller in one JVM) on local Java.

The jars come from Maven Central through `kafka/pom.xml` (`make kafka`). Everything about one
broker lives in its data directory: `server.properties` (regenerated at each start), `kraft/`
(the log and metadata), `broker.json` (pid, ports, cluster id) and `broker.log`. Starting again on
the same directory keeps the data and, when they are free, the same ports, so clients reconnect.

By default the broker is a cluster of its own. With `broker.quorum_voters`, `broker.node_id` and a
shared `broker.cluster_id` it is one node of a multi-node cluster (each node its own data directory
and address), replicated as docker-compose.multi-broker.yml replicates: internal topics on
min(3, nodes) replicas, a minimum of min(2, nodes) in-sync replicas.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import asdict
from importlib import resources
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from streamtrain import scram
from streamtrain.runtime.lifeline import tie_to_parent

from ..config import BrokerConfig, KafkaConfig
from ..net import free_port
from .properties import (
    BrokerError,
    BrokerState,
    BrokerStatus,
    find_kafka_libs,
    kafka_version,
    new_cluster_id,
    replication_properties,
    server_properties,
)

__all__ = [
    "BrokerError",
    "BrokerState",
    "BrokerStatus",
    "EmbeddedBroker",
    "find_kafka_libs",
    "kafka_version",
    "new_cluster_id",
    "replication_properties",
]

logger = logging.getLogger(__name__)

def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As the JVM's listener does: connections left in TIME_WAIT by a killed broker do not hold its port,
        # so a restart keeps its address (only a live listener makes the port busy).
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def _pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited; only its parent's wait is missing


class EmbeddedBroker:
    """One single-node KRaft broker living in `cfg.data_dir`.

    Args:
        cfg: broker settings (data directory, ports, heap, timeouts, extra properties).
        die_with_parent: the JVM `start` launches is killed when this process dies (`streamtrain.lifeline`):
            for a broker that belongs to one run (`streamtrain up`), not one started to outlive its command.
    """

    def __init__(self, cfg: BrokerConfig, *, die_with_parent: bool = False) -> None:
        self.cfg = cfg
        self.die_with_parent = die_with_parent
        self.data_dir = cfg.data_dir.resolve()
        self.state_path = self.data_dir / "broker.json"
        self.properties_path = self.data_dir / "server.properties"
        self.log_path = (cfg.log_file or self.data_dir / "broker.log").resolve()
        self.log_dir = self.data_dir / "kraft"
        self._proc: subprocess.Popen[bytes] | None = None
        self._formatted_now = False

    @property
    def sasl(self) -> bool:
        """Whether the client listener needs SCRAM."""
        return self.cfg.security_protocol == "SASL_PLAINTEXT"

    def admin_settings(self) -> dict[str, str]:
        """librdkafka settings for the broker's own health checks (its inter-broker user on a SASL listener)."""
        if not self.sasl:
            return {}
        secret = scram.broker_secret(self.data_dir, create=False)
        if secret is None:
            raise BrokerError(f"{self.data_dir} has no broker-secret; start the broker once with "
                              "broker.security_protocol=SASL_PLAINTEXT")
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": self.cfg.inter_broker_mechanism,
                "sasl.username": scram.BROKER_USER, "sasl.password": secret}

    def own_identity(self, base: KafkaConfig) -> KafkaConfig:
        """`base` pointed at this broker and logged in as the broker's own user (a super user under ACLs).

        Only for setting up a broker this process owns (the first users and ACLs: nobody else may grant
        them); services get their role's principal.
        """
        secret = scram.broker_secret(self.data_dir, create=False)
        try:
            sasl = "SASL_PLAINTEXT://" in self.properties_path.read_text()  # as it was last started
        except OSError:
            sasl = False
        if secret is None or not sasl:
            return base.model_copy(update={"bootstrap_servers": self.bootstrap})
        return KafkaConfig.model_validate({
            **base.model_dump(exclude={"sasl_password"}), "bootstrap_servers": self.bootstrap,
            "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": self.cfg.inter_broker_mechanism,
            "sasl_username": scram.BROKER_USER, "sasl_password": secret})

    # ---- state -----------------------------------------------------------------------------
    def read_state(self) -> BrokerState | None:
        """The recorded state, or None when this directory never held a broker."""
        try:
            return BrokerState(**json.loads(self.state_path.read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError) as exc:
            raise BrokerError(f"{self.state_path} is unreadable ({exc}); remove it to start afresh") from exc

    def _write_state(self, state: BrokerState) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state), indent=2))
        tmp.replace(self.state_path)

    @property
    def bootstrap(self) -> str:
        """host:port of the broker (after it was started at least once)."""
        state = self.read_state()
        if state is None:
            raise BrokerError(f"no broker has been started in {self.data_dir}")
        return state.bootstrap

    def pid(self) -> int | None:
        """Pid of this directory's running broker, or None."""
        state = self.read_state()
        if state is None or state.pid is None or not _pid_alive(state.pid):
            return None
        try:
            cmdline = Path(f"/proc/{state.pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        # A recycled pid is some other process: only ours runs kafka.Kafka on our properties file.
        if b"kafka.Kafka" in cmdline and str(self.properties_path).encode() in cmdline:
            return state.pid
        return None

    # ---- start -----------------------------------------------------------------------------
    def prepare(self) -> tuple[BrokerState, list[str]]:
        """Choose ports, write server.properties, format storage on first use; return the java command."""
        libs = find_kafka_libs(self.cfg.libs_dir)
        java = self._java()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        previous = self.read_state()
        host = self.cfg.host
        port = self._choose_port(self.cfg.port, previous.port if previous else None, host)
        # In a quorum of several nodes the controller port is the one the others were told (quorum_voters).
        fixed_cport = self.cfg.voters[self.cfg.node_id][1] if self.cfg.quorum_voters else self.cfg.controller_port
        cport = self._choose_port(fixed_cport, previous.controller_port if previous else None, host, avoid={port})
        if previous and self.cfg.cluster_id and previous.cluster_id != self.cfg.cluster_id:
            raise BrokerError(f"{self.data_dir} belongs to cluster {previous.cluster_id}, not broker.cluster_id "
                              f"{self.cfg.cluster_id}; use a fresh broker.data_dir to join that cluster")
        cluster_id = previous.cluster_id if previous else (self.cfg.cluster_id or new_cluster_id())
        state = BrokerState(host, port, cport, cluster_id, version=kafka_version(libs))
        formatted = (self.log_dir / "meta.properties").exists()
        if self.sasl and formatted and scram.broker_secret(self.data_dir, create=False) is None:
            raise BrokerError(f"{self.data_dir} was formatted without SCRAM, so the broker has no user of its own "
                              "for broker.security_protocol=SASL_PLAINTEXT; use a fresh broker.data_dir")
        secret = scram.broker_secret(self.data_dir, create=True) if self.sasl else None
        # server.properties holds the broker's own SCRAM password: readable by its owner only.
        fd = os.open(self.properties_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.server_properties(state, secret))
        log4j = resources.files("streamtrain.broker").joinpath("log4j2.properties")
        base = [java, f"-Xmx{self.cfg.heap}", "-Xms128m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={log4j}", "-cp", f"{libs}/*"]
        self._formatted_now = not formatted
        if not formatted:
            self._format(base, state, secret)
        return state, [*base, "kafka.Kafka", str(self.properties_path)]

    def start(self) -> str:
        """Start the broker in the background and return its bootstrap address once it answers.

        Raises:
            BrokerError: when it is already running elsewhere, dies, or does not answer in time.
        """
        if (pid := self.pid()) is not None:
            logger.info("broker already running in %s (pid %d)", self.data_dir, pid)
            return self.bootstrap
        state, command = self.prepare()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n=== streamtrain: starting broker at {time.ctime()} ===\n".encode())
            log.flush()
            # A new session: Ctrl-C in the terminal that started it must not take the broker down.
            argv = tie_to_parent(command) if self.die_with_parent else command
            self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True, cwd=self.data_dir)
        state.pid, state.started_at = self._proc.pid, time.time()
        self._write_state(state)
        self._wait_ready(state)
        if self.sasl and not self._formatted_now:
            self._upsert_users(state)  # users added to broker.scram_users since the format, or new passwords
        return state.bootstrap

    def _upsert_users(self, state: BrokerState) -> None:
        users = {name: pw.get_secret_value() for name, pw in self.cfg.scram_users.items()}
        admin = AdminClient({"bootstrap.servers": state.bootstrap, "log_level": 0, **self.admin_settings()})
        try:
            scram.upsert_users(admin, users, timeout=self.cfg.start_timeout_seconds)
        except KafkaException as exc:
            self.stop()
            raise BrokerError(f"could not update the SCRAM users of broker.scram_users: {exc.args[0].str()}") from None

    def exec_foreground(self) -> None:
        """Replace this process by the broker (for containers and supervisors); does not return."""
        state, command = self.prepare()
        state.pid, state.started_at = os.getpid(), time.time()
        self._write_state(state)
        os.execv(command[0], command)

    def _wait_ready(self, state: BrokerState) -> None:
        deadline = time.monotonic() + self.cfg.start_timeout_seconds
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise BrokerError(f"broker exited with status {self._proc.returncode} while starting; "
                                  f"last lines of {self.log_path}:\n{self.log_tail()}")
            if self.answers(state.bootstrap, timeout=2.0, settings=self.admin_settings()):
                return
            time.sleep(0.25)
        raise BrokerError(f"broker did not answer on {state.bootstrap} within {self.cfg.start_timeout_seconds:.0f} s "
                          f"(broker.start_timeout_seconds); last lines of {self.log_path}:\n{self.log_tail()}")

    @staticmethod
    def answers(bootstrap: str, timeout: float = 2.0, settings: dict[str, str] | None = None) -> bool:
        """Whether a broker at `bootstrap` answers a metadata request (`settings`: SASL credentials, ...)."""
        host, _, port = bootstrap.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                pass
        except OSError:
            return False
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, **(settings or {})})
        try:
            admin.list_topics(timeout=timeout)
        except KafkaException:
            return False
        return True

    # ---- stop ------------------------------------------------------------------------------
    def stop(self, timeout: float | None = None) -> bool:
        """Shut the broker down cleanly (SIGTERM: controlled shutdown, logs flushed).

        Returns:
            True when it stopped by itself within the timeout (or was not running), False when it
            had to be killed after `broker.stop_timeout_seconds`.
        """
        pid = self.pid()
        if pid is None:
            return True
        os.kill(pid, signal.SIGTERM)
        clean = self._wait_exit(pid, self.cfg.stop_timeout_seconds if timeout is None else timeout)
        if not clean:
            logger.warning("broker pid %d ignored SIGTERM for %.0f s; killing it", pid, self.cfg.stop_timeout_seconds)
            os.kill(pid, signal.SIGKILL)
            self._wait_exit(pid, 10.0)
        self._forget_pid()
        return clean

    def kill(self) -> None:
        """SIGKILL the broker, as a crash would (for fault tests)."""
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            self._wait_exit(pid, 10.0)
            self._forget_pid()

    def _wait_exit(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.pid == pid:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=0.1)
                if self._proc.returncode is not None:
                    return True
            elif not _pid_alive(pid):
                return True
            else:
                time.sleep(0.1)
        return False

    def _forget_pid(self) -> None:
        state = self.read_state()
        if state is not None:
            state.pid = None
            self._write_state(state)

    # ---- status ----------------------------------------------------------------------------
    def status(self) -> BrokerStatus:
        """Running? Answering? Version, uptime and topic count."""
        state = self.read_state()
        pid = self.pid()
        if state is None or pid is None:
            detail = "no broker was ever started here" if state is None else "not running"
            return BrokerStatus(str(self.data_dir), False, False, None, state.bootstrap if state else None,
                                state.version if state else None, None, None, detail)
        topics: int | None = None
        try:
            admin = AdminClient({"bootstrap.servers": state.bootstrap, "log_level": 0, **self.admin_settings()})
            meta = admin.list_topics(timeout=5)
            topics = len([t for t in meta.topics if not t.startswith("__")])
            healthy, detail = True, "answering"
        except KafkaException as exc:
            healthy, detail = False, f"process is up but does not answer: {exc}"
        uptime = time.time() - state.started_at if state.started_at else None
        return BrokerStatus(str(self.data_dir), True, healthy, pid, state.bootstrap, state.version, uptime,
                            topics, detail)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the broker log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # ---- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _java() -> str:
        home = os.environ.get("JAVA_HOME")
        java = str(Path(home) / "bin" / "java") if home and (Path(home) / "bin" / "java").exists() else None
        java = java or shutil.which("java")
        if java is None:
            raise BrokerError("Java not found: install a Java 17+ runtime (apt-get install openjdk-17-jre-headless)")
        return java

    @staticmethod
    def _choose_port(configured: int, previous: int | None, host: str, avoid: set[int] | None = None) -> int:
        if configured:
            if not _port_free(host, configured):
                raise BrokerError(f"port {configured} on {host} is in use (broker.port / broker.controller_port)")
            return configured
        if previous and previous not in (avoid or set()) and _port_free(host, previous):
            return previous  # same address as last time, so clients of the old run reconnect
        return free_port(host, avoid or ())

    def server_properties(self, state: BrokerState, secret: str | None = None) -> str:
        """This broker's server.properties at the addresses of `state` (`properties.server_properties`)."""
        return server_properties(self.cfg, state, self.log_dir, secret if self.sasl else None)

    def _format(self, base: list[str], state: BrokerState, secret: str | None) -> None:
        cmd = [*base, "kafka.tools.StorageTool", "format", "-t", state.cluster_id, "-c", str(self.properties_path),
               "--ignore-formatted"]
        if self.sasl and secret is not None:
            cmd += scram.add_scram_args({scram.BROKER_USER: secret}, (self.cfg.inter_broker_mechanism,))
            cmd += scram.add_scram_args({n: pw.get_secret_value() for n, pw in self.cfg.scram_users.items()})
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise BrokerError(f"formatting {self.log_dir} failed:\n{(done.stdout + done.stderr)[-2000:]}")
        users = f"; SCRAM users {', '.join(sorted(self.cfg.scram_users))}" if self.sasl else ""
        logger.info("formatted KRaft storage in %s (cluster %s%s)", self.log_dir, state.cluster_id, users)


