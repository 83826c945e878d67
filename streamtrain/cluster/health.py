"""Is the bed healthy? Kafka's view (brokers in the cluster, replicas in sync, who leads) and HTTP endpoints.

Everything is asked from the machine's own namespace over the bridge, as an operator would ask.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import ClusterMetadata

from streamtrain.config import KafkaConfig
from streamtrain.kafka import make_admin

__all__ = ["brokers_in_cluster", "http_json", "metadata", "partition_leaders", "under_replicated", "wait_until"]

logger = logging.getLogger(__name__)


def metadata(bootstrap: str, timeout: float = 5.0) -> ClusterMetadata | None:
    """The cluster's metadata through `bootstrap`, or None when no broker answers in time."""
    admin = make_admin(KafkaConfig(bootstrap_servers=bootstrap))
    try:
        return admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        logger.debug("no metadata from %s: %s", bootstrap, exc)
        return None


def brokers_in_cluster(bootstrap: str, timeout: float = 5.0) -> set[int]:
    """Node ids of the brokers the cluster's metadata lists (registered and not fenced)."""
    meta = metadata(bootstrap, timeout)
    return set(meta.brokers) if meta is not None else set()


def under_replicated(bootstrap: str, timeout: float = 5.0) -> list[str] | None:
    """`topic[partition]` of every partition with fewer in-sync replicas than replicas (internal topics too).

    Returns None when no broker answers: not known, not healthy.
    """
    meta = metadata(bootstrap, timeout)
    if meta is None:
        return None
    short = []
    for name, topic in meta.topics.items():
        if topic.error is not None:
            short.append(f"{name} ({topic.error.str()})")
            continue
        short += [f"{name}[{pid}]" for pid, p in topic.partitions.items() if len(p.isrs) < len(p.replicas)]
    return sorted(short)


def partition_leaders(bootstrap: str, topics: Iterable[str], timeout: float = 5.0) -> dict[str, int]:
    """The node id leading partition 0 of each of `topics` (those without a leader left out)."""
    meta = metadata(bootstrap, timeout)
    if meta is None:
        return {}
    leaders = {}
    for name in topics:
        topic = meta.topics.get(name)
        if topic is not None and 0 in topic.partitions and topic.partitions[0].leader >= 0:
            leaders[name] = topic.partitions[0].leader
    return leaders


def http_json(url: str, timeout: float = 3.0) -> Any:
    """The JSON a GET of `url` returns, or None when it does not answer (or not with JSON)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read().decode())
    except (OSError, urllib.error.URLError, ValueError):
        return None


def wait_until(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.5) -> float:
    """Poll `check` until it holds; returns the seconds it took.

    Raises:
        TimeoutError: naming `what`, when it does not hold within `timeout` seconds.
    """
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"{what}: not after {timeout:.0f} s")
        time.sleep(interval)
    return time.monotonic() - began
