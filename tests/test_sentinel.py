"""Valkey Sentinel: serve and a worker on a ``valkey+sentinel://`` URL follow a failover. A
primary and two replicas watched by three sentinels (tests/sentinel.py); four clients accept into
a session each, under ``--accept-durability replica``; the primary is SIGKILLed; the sentinels
promote a replica. Each accept answers 2xx or 503 within its bound (never hangs), 503s only from
the kill until the switch is over, and every acknowledged prompt is delivered, once, in its
session's order: the worker found it on the promoted replica (the dead primary cannot serve
it)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from prompt_outbox.embedded import free_port
from prompt_outbox.storage.connect import connect
from prompt_outbox.storage.sentinel import (
    SentinelURL,
    SentinelURLError,
    parse_sentinel_url,
)
from prompt_outbox.storage.shardsub import ShardSubscriber
from prompt_outbox.storage.topology import topology_of
from tests.replication import node_client
from tests.sentinel import SentinelGroup
from tests.support.failover import (
    run_failovers,
)
from tests.support.pubsub import Heard, spublish
from tests.support.serve import BIN
from tests.support.waiting import eventually, holds


def test_serve_and_worker_follow_a_sentinel_failover(tmp_path: Path) -> None:
    run = run_failovers(tmp_path, sessions=4, failovers=1, acks=5)
    print(run.line("sentinel failover (4 sessions)"))
    run.check()


def test_a_sentinel_url_says_which_sentinels_and_which_service() -> None:
    assert parse_sentinel_url(
        "valkeys+sentinel://app:s%40cret@10.0.0.1,10.0.0.2:26380,[::1]:7/orders"
        "?db=2&sentinel_password=sp"
    ) == SentinelURL(
        [("10.0.0.1", 26379), ("10.0.0.2", 26380), ("::1", 7)],
        "orders",
        tls=True,
        username="app",
        password="s@cret",
        db=2,
        sentinel_password="sp",
    )
    for bad, why in [
        ("valkey+sentinel://h:1", "service"),
        ("valkey+sentinel:///svc", "at least one sentinel"),
        ("valkey+sentinel://h:x/svc", "not host:port"),
        ("valkey+sentinel://h:1/svc?password=p", "unknown option"),
    ]:
        with pytest.raises(SentinelURLError, match=why):
            parse_sentinel_url(bad)


def test_a_bad_sentinel_url_is_one_clear_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [BIN, "stats", "--valkey-url", "valkey+sentinel://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "a sentinel URL ends with the service's name" in done.stderr
    assert "Traceback" not in done.stderr


def test_no_sentinel_answering_is_one_clear_line() -> None:
    nobody = free_port()
    done = subprocess.run(
        [BIN, "stats", "--valkey-url", f"valkey+sentinel://127.0.0.1:{nobody}/svc"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert "No master found for 'svc'" in line and f"127.0.0.1:{nobody}" in line


async def test_shard_subscriptions_follow_a_sentinel_failover(tmp_path: Path) -> None:
    """The wake-ups (sharded pub/sub, storage/shardsub.py) on a sentinel client: subscribed
    on the primary; after it is SIGKILLed and a replica promoted, subscribed again there
    (announced, so the reader looks back for what it missed), and a message published on the
    new primary is heard."""
    with SentinelGroup(tmp_path) as group:
        client = connect(group.url, socket_timeout=5, socket_connect_timeout=2)
        heard = Heard()
        sub = ShardSubscriber(topology_of(client), heard, retry_after=0.05)
        try:
            sub.add("outboxwake:{t}")
            await eventually(lambda: holds(heard.subscribed["outboxwake:{t}"] == 1))
            await spublish(client, "outboxwake:{t}", "before")
            await eventually(lambda: holds(heard.messages["outboxwake:{t}"] == ["before"]))
            old = group.kill_primary()
            new = await asyncio.to_thread(group.wait_failover, old)
            await eventually(lambda: holds(heard.subscribed["outboxwake:{t}"] >= 2), within=20)
            with node_client(new) as primary:  # straight to the promoted replica
                primary.execute_command("SPUBLISH", "outboxwake:{t}", "after")
            await eventually(lambda: holds(heard.messages["outboxwake:{t}"][-1:] == ["after"]))
        finally:
            await sub.aclose()
            await client.aclose()
