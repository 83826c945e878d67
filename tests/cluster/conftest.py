"""The multi-host test bed for the cluster tests: one per session, its three Kafka nodes shared by the tests.

Each test runs its own job (coordinator, two trainer nodes, producer) on the bed and leaves the three
Kafka nodes up, in the cluster and in sync, for the next; a test that broke them is checked for that
afterwards. The bed is removed at the end of the session, also after a failure; a session killed
outright leaves it to the sweep at the start of the next (`cluster.netns.sweep`). Without root or
CAP_NET_ADMIN every test here is skipped, saying why.

Figures each test reports (samples lost, duplicates, seconds until training resumed) are written to
the test's directory as figures.json, appended to $STREAMTRAIN_CLUSTER_FIGURES (JSON lines) when set,
and listed at the end of the run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from streamtrain.cluster.bed import ClusterBed
from streamtrain.cluster.netns import netns_unavailable
from streamtrain.cluster.topology import HOSTS, KAFKA_HOSTS, ClusterSpec
from streamtrain.config import StreamtrainConfig

_FIGURES: list[dict[str, Any]] = []
_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here is a cluster test (run by `make cluster`), slow, and allowed 15 minutes."""
    for item in items:
        if _HERE in Path(str(item.fspath)).resolve().parents:
            for mark in (pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(900)):
                item.add_marker(mark)


@pytest.fixture(scope="session")
def cluster_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterBed]:
    """The bed with its three Kafka nodes up (a cluster of three, every replica in sync)."""
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(f"the multi-host test bed needs network namespaces: {reason}")
    bed = ClusterBed.create(tmp_path_factory.mktemp("cluster"), ClusterSpec(), StreamtrainConfig(job="bed"),
                            owner_pid=os.getpid())
    try:
        for host in KAFKA_HOSTS:
            bed.start(host)
        bed.wait_brokers(300)
        yield bed
    finally:
        bed.down()


@pytest.fixture
def bed(cluster_bed: ClusterBed) -> Iterator[ClusterBed]:
    """The session's bed, healthy at the start of the test; the test's job stopped at its end."""
    for host in HOSTS:
        cluster_bed.restore(host)
    for host in KAFKA_HOSTS:
        if not cluster_bed.alive(host):
            cluster_bed.start(host)
    cluster_bed.wait_brokers(300)
    try:
        yield cluster_bed
    finally:
        for host in HOSTS:
            cluster_bed.restore(host)
        cluster_bed.stop_job(timeout=30)


@pytest.fixture
def report_figures(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[dict[str, Any]], None]:
    """Record this test's figures (see the module docstring)."""

    def report(figures: dict[str, Any]) -> None:
        entry = {"test": request.node.name, **figures}
        (tmp_path / "figures.json").write_text(json.dumps(entry, indent=2) + "\n")
        _FIGURES.append(entry)
        out = os.environ.get("STREAMTRAIN_CLUSTER_FIGURES")
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            with Path(out).open("a") as fh:
                fh.write(json.dumps(entry) + "\n")

    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FIGURES:
        return
    terminalreporter.section("cluster fault figures (measured on this machine, as it was loaded)")
    for entry in _FIGURES:
        terminalreporter.write_line(json.dumps(entry))
