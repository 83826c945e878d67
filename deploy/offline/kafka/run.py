#!/usr/bin/env python3
"""/etc/kafka/docker/run of the apache/kafka stand-in: configure from the environment, format once, run the broker.

The official image's conventions, so a compose file written for it runs unchanged:
  - every KAFKA_* variable but the JVM/launcher ones (KAFKA_HEAP_OPTS, KAFKA_OPTS, ...) is a server property:
    the prefix dropped, lower-cased, ``___`` -> ``-``, ``__`` -> ``_``, ``_`` -> ``.``
    (KAFKA_LISTENER_NAME_CLIENT_SCRAM___SHA___512_SASL_JAAS_CONFIG ->
    listener.name.client.scram-sha-512.sasl.jaas.config);
  - with no such variable, the single-node KRaft defaults below;
  - CLUSTER_ID formats the log directories on first start (kept when already formatted);
  - KAFKA_HEAP_OPTS, KAFKA_OPTS, KAFKA_JVM_PERFORMANCE_OPTS, KAFKA_LOG4J_OPTS reach the JVM.
Standard library only.
"""

from __future__ import annotations

import os
import subprocess
import sys

HOME = os.environ.get("KAFKA_HOME", "/opt/kafka")
PROPERTIES = os.path.join(HOME, "config", "server.properties")
DEFAULT_CLUSTER_ID = "5L6g3nShT-eMCtK--X86sw"
NOT_PROPERTIES = {
    "KAFKA_VERSION", "KAFKA_HOME", "KAFKA_HEAP_OPTS", "KAFKA_LOG4J_OPTS", "KAFKA_OPTS", "KAFKA_JMX_OPTS",
    "KAFKA_JVM_PERFORMANCE_OPTS", "KAFKA_GC_LOG_OPTS", "KAFKA_LOG4J_ROOT_LOGLEVEL", "KAFKA_LOG4J_LOGGERS",
    "KAFKA_TOOLS_LOG4J_LOGLEVEL", "KAFKA_JMX_HOSTNAME", "KAFKA_JMX_PORT",
}
DEFAULTS = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.quorum.voters": "1@localhost:9093",
    "listeners": "PLAINTEXT://:9092,CONTROLLER://:9093",
    "advertised.listeners": "PLAINTEXT://localhost:9092",
    "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "log.dirs": "/tmp/kraft-combined-logs",
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
}


def property_name(variable: str) -> str:
    """KAFKA_A_B___C__D -> a.b-c_d (the official image's mapping)."""
    name = variable[len("KAFKA_"):].lower()
    return name.replace("___", "\0").replace("__", "\1").replace("_", ".").replace("\0", "-").replace("\1", "_")


def server_properties(environ: dict[str, str]) -> dict[str, str]:
    """The broker's properties: the KAFKA_* environment, or the defaults when it sets none."""
    props = {property_name(k): v for k, v in environ.items() if k.startswith("KAFKA_") and k not in NOT_PROPERTIES}
    return props or dict(DEFAULTS)


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", " ")


def main() -> int:
    props = server_properties(dict(os.environ))
    with open(PROPERTIES, "w", encoding="utf-8") as out:
        out.write("# written from the environment by /etc/kafka/docker/run\n")
        out.writelines(f"{key}={escape(value)}\n" for key, value in sorted(props.items()))
    cluster_id = os.environ.get("CLUSTER_ID", DEFAULT_CLUSTER_ID)
    bin_dir = os.path.join(HOME, "bin")
    formatted = subprocess.run(
        [os.path.join(bin_dir, "kafka-storage.sh"), "format", "--cluster-id", cluster_id, "--config", PROPERTIES,
         "--ignore-formatted"], check=False)
    if formatted.returncode != 0:
        print(f"formatting the log directories with CLUSTER_ID {cluster_id} failed", file=sys.stderr)
        return formatted.returncode
    os.execv(os.path.join(bin_dir, "kafka-server-start.sh"), ["kafka-server-start.sh", PROPERTIES])
    return 1


if __name__ == "__main__":
    sys.exit(main())
