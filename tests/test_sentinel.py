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

import httpx
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
from tests.replication import node_client, wait_until
from tests.sentinel import SERVICE, SentinelGroup
from tests.support.failover import (
    run_failovers,
)
from tests.support.logs import logged_service
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
    assert (
        f"no primary for service 'svc' from sentinels 127.0.0.1:{nobody} (1 did not answer: "
        in line
    )
    assert "check the service name and that the sentinels run" in line
    assert "valkey.asyncio" not in line  # valkey-py's repr of each sentinel client


def test_no_primary_is_one_short_line_without_credentials(tmp_path: Path) -> None:
    """Real sentinels: a wrong service name is one line from the CLI (exit 1) naming the
    service, the sentinels and what to check; serve, once the sentinels lose the primary
    (every data node killed, one sentinel too), answers 503 and logs that line, one line,
    without the URL's passwords."""
    secrets = ("data-s3cret", "sentinel-s3cret")
    with SentinelGroup(tmp_path) as group:
        hosts = ", ".join(f"127.0.0.1:{port}" for port in group.sentinel_ports)
        # The nodes have no password: AUTH default <anything> passes, the URL still carries it.
        creds = f"?sentinel_username=default&sentinel_password={secrets[1]}"
        url = group.url.replace("://", f"://default:{secrets[0]}@") + creds
        done = subprocess.run(
            [BIN, "stats", "--valkey-url", url.replace(f"/{SERVICE}?", "/nope?")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1
        assert done.stderr.strip().splitlines() == [
            f"Error: Valkey unusable (MasterNotFoundError: no primary for service 'nope' from "
            f"sentinels {hosts} (none knows the service): check the service name and that "
            "the sentinels run); check --valkey-url (PROMPT_OUTBOX_VALKEY_URL)"
        ]
        log = tmp_path / "serve.log"
        with logged_service(["--valkey-url", url], log) as port:
            ready = f"http://127.0.0.1:{port}/readyz"
            assert httpx.get(ready, timeout=10).status_code == 200
            gone = group.sentinel_ports[2]
            for proc in [*(group.procs[p] for p in group.data_ports), group.procs[gone]]:
                proc.kill()
                proc.wait()
            line = (
                f"Valkey is unreachable: no primary for service '{SERVICE}' from sentinels "
                f"{hosts} (2 see its primary down; 1 did not answer: Error 111 connecting to "
                f"127.0.0.1:{gone}"
            )

            def logged() -> bool:
                answer = httpx.get(ready, timeout=30)
                assert answer.status_code == 503, answer.text
                assert answer.json() == {
                    "error": "storage_unavailable",
                    "detail": "Valkey is unreachable: retry shortly",
                }
                return line in log.read_text()

            wait_until(logged, 30, "serve logs the sentinels' answer", step=0.2)
        text = log.read_text()
        assert "Traceback" not in text and not any(s in text for s in secrets), text
        _no_auth_warning, *records = text.splitlines()
        assert all(record.startswith("20") for record in records), text  # no dump's lines


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
