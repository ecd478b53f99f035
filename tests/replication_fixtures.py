"""Fixtures for replicated-durability tests: a primary + replica pair, and a 3-master cluster
with one replica per master. Not in conftest.py: a module that wants them declares

    pytest_plugins = ["tests.replication_fixtures"]

(or imports the fixture functions it uses)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import LocalCluster
from tests.replication import ReplicatedPair, node_client

# Short enough that a SIGKILLed master's replica takes over in ~2-4 s; long enough that a
# busy 2-core machine does not fail a healthy node over by mistake.
NODE_TIMEOUT_MS = 2000


@pytest.fixture
def replicated_pair(tmp_path: Path) -> Iterator[ReplicatedPair]:
    """A fresh primary + replica (both ``appendfsync everysec``) per test: ~0.2 s to start,
    so a test may freeze, kill or promote at will."""
    with ReplicatedPair(tmp_path / "pair") as pair:
        yield pair


@pytest.fixture(scope="session")
def replicated_cluster_session(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LocalCluster]:
    """One 3-master cluster, one replica per master (replicas ``appendfsync everysec``,
    masters ``always``), ``cluster-node-timeout`` 2 s, for the whole run (~2 s to start)."""
    with LocalCluster(
        tmp_path_factory.mktemp("replicated-cluster"),
        replicas=1,
        node_timeout_ms=NODE_TIMEOUT_MS,
    ) as cluster:
        yield cluster


@pytest.fixture
def replicated_cluster(replicated_cluster_session: LocalCluster) -> Iterator[LocalCluster]:
    """The session's replicated cluster, flushed before the test and healed after it (frozen
    nodes thawed, killed nodes restarted, every primary with its replica online again). The
    roles may differ from test to test: ask ``primaries()`` / ``replica_of()``, not ``ports``."""
    cluster = replicated_cluster_session
    for port in cluster.primaries():
        with node_client(port) as node:
            node.flushall()
    yield cluster
    cluster.heal()
