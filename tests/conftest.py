"""Fixtures: a real valkey-server per test session (flushed per test), and Outbox helpers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import httpx
import pytest
import valkey.asyncio as valkey_async

from prompt_outbox import Outbox, Tunables
from prompt_outbox.embedded import EmbeddedValkey

T = TypeVar("T")

# Small timings, so the seed's behaviour shows in seconds rather than minutes.
FAST = Tunables(
    max_attempts=3,
    cap=25,
    dedupe_ttl=60.0,
    delivery_timeout=2.0,
    retry_backoff=0.05,
    max_backoff=0.2,
    verify_delay=0.05,
    verify_backoff=0.05,
    max_verify_backoff=0.2,
    max_verify_attempts=3,
    max_transient_failures=3,
    parked_sweep_interval=0.3,
    lease_ttl=1.0,
    bookkeeping_timeout=2.0,
)


class ManualClock:
    """A clock the test moves: due times and backoff become exact, not slept for."""

    def __init__(self) -> None:
        self.now = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture(scope="session")
def valkey_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedValkey]:
    """One real server for the whole run (started in ~40 ms); every test flushes it."""
    with EmbeddedValkey(tmp_path_factory.mktemp("valkey")) as server:
        yield server


@pytest.fixture
async def client(valkey_server: EmbeddedValkey) -> AsyncIterator[valkey_async.Valkey]:
    c = valkey_async.Valkey.from_url(valkey_server.url, socket_timeout=5)
    await c.flushall()
    yield c
    await c.aclose()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def outbox(client: valkey_async.Valkey) -> Outbox:
    return Outbox(client, FAST)


@pytest.fixture
def manual_outbox(client: valkey_async.Valkey, clock: ManualClock) -> Outbox:
    return Outbox(client, FAST, clock=clock)


@pytest.fixture
async def http(outbox: Outbox) -> AsyncIterator[httpx.AsyncClient]:
    """The HTTP API over ``outbox``, served by uvicorn on a real loopback port."""
    from tests.test_api import serve  # lazily: test_api imports this module

    async for client in serve(outbox):
        yield client


async def holds(value: bool) -> bool:
    """Wrap a plain condition for ``eventually``: ``eventually(lambda: holds(x == y))``."""
    return value


async def eventually(
    predicate: Callable[[], Awaitable[T]], within: float = 5.0, interval: float = 0.01
) -> T:
    """Poll an async predicate until it is truthy (returns its value); fail after ``within``."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        value = await predicate()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {within}s (last value {value!r})")
        await asyncio.sleep(interval)
