"""Fixtures: a real valkey-server per test session (flushed per test), and Outbox helpers."""

from __future__ import annotations

import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest
from valkey.asyncio.cluster import ValkeyCluster

from prompt_outbox import Outbox
from prompt_outbox.embedded import EmbeddedValkey, answers_ping, free_port
from prompt_outbox.storage.client import Client
from prompt_outbox.storage.compat import valkey_server_binary
from prompt_outbox.storage.connect import connect
from tests.cluster import LocalCluster
from tests.opencode_server import fake_model, opencode  # noqa: F401  (module-scoped fixtures)
from tests.support.api import serve
from tests.support.clock import ManualClock
from tests.support.tunables import FAST


@pytest.fixture(scope="session")
def valkey_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedValkey]:
    """One real server for the whole run (started in ~40 ms); every test flushes it."""
    with EmbeddedValkey(tmp_path_factory.mktemp("valkey")) as server:
        yield server


@pytest.fixture(scope="session")
def valkey_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One real 3-master cluster for the whole run (~2 s to cluster_state:ok), started only
    if a test asks for it; every test flushes it."""
    with LocalCluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Modules marked ``cluster_too`` run every test on the standalone server and again on
    the 3-master cluster: the same tests, parametrised, never copied."""
    if "server_kind" in metafunc.fixturenames and metafunc.definition.get_closest_marker(
        "cluster_too"
    ):
        metafunc.parametrize("server_kind", ["standalone", "cluster"], indirect=True)


@pytest.fixture
def server_kind(request: pytest.FixtureRequest) -> str:
    return str(getattr(request, "param", "standalone"))


@pytest.fixture
def server_url(server_kind: str, request: pytest.FixtureRequest) -> str:
    """The URL of the server kind under test (``valkey+cluster://`` for the cluster)."""
    if server_kind == "cluster":
        cluster: LocalCluster = request.getfixturevalue("valkey_cluster")
        return cluster.url
    server: EmbeddedValkey = request.getfixturevalue("valkey_server")
    return server.url


@pytest.fixture
async def connect_client(server_url: str) -> AsyncIterator[Callable[..., Client]]:
    """Make more clients of the server under test (another replica's, a decoding one...);
    each is closed after the test."""
    made: list[Client] = []

    def make(**options: object) -> Client:
        made.append(connect(server_url, **{"socket_timeout": 5, **options}))
        return made[-1]

    yield make
    for c in made:
        await c.aclose()


@pytest.fixture
async def client(connect_client: Callable[..., Client]) -> Client:
    """A flushed client of the server kind under test (standalone unless ``cluster_too``)."""
    c = connect_client()
    if isinstance(c, ValkeyCluster):
        await c.flushall(target_nodes=ValkeyCluster.PRIMARIES)
    else:
        await c.flushall()
    return c


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def outbox(client: Client) -> Outbox:
    return Outbox(client, FAST)


@pytest.fixture
def manual_outbox(client: Client, clock: ManualClock) -> Outbox:
    return Outbox(client, FAST, clock=clock)


@pytest.fixture
async def http(outbox: Outbox) -> AsyncIterator[httpx.AsyncClient]:
    """The HTTP API over ``outbox``, served by uvicorn on a real loopback port."""
    async for client in serve(outbox):
        yield client


@pytest.fixture
def lax_server(tmp_path: Path) -> Iterator[int]:
    """A valkey-server as people often run it: no persistence, an evicting memory policy."""
    port = free_port()
    proc = subprocess.Popen(
        [str(valkey_server_binary()), "--port", str(port), "--bind", "127.0.0.1",
         "--dir", str(tmp_path), "--save", "", "--maxmemory-policy", "allkeys-lru"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while not answers_ping(port):
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        yield port
    finally:
        proc.kill()
        proc.wait()
