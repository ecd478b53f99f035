"""Accept levels: what an acknowledged accept promises, decided at start on the real server, and
an accept the server cannot confirm in time (NotDurable: written, not confirmed)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import valkey.asyncio as valkey_async
from valkey.asyncio.cluster import ValkeyCluster

from prompt_outbox import Duplicate, NotDurable, Outbox, Tunables
from prompt_outbox.durability import DurabilityError
from prompt_outbox.embedded import EmbeddedValkey
from prompt_outbox.storage.connect import connect
from tests.cluster import LocalCluster, key_served_by
from tests.replication import ReplicatedPair
from tests.support.api import ALICE, serve
from tests.support.serve import BIN
from tests.support.tunables import FAST

pytest_plugins = ["tests.replication_fixtures"]

QUICK = 0.2  # durability_timeout where a wait is expected to run out
NEVER_HANGS = 10.0  # seconds past durability_timeout that no answer may take (not a speed test)


async def _keys(client: valkey_async.Valkey, ws: str) -> list[bytes]:
    return [k async for k in client.scan_iter(match=f"*{{{ws}}}*")]


async def test_the_default_is_fsync_and_the_embedded_server_honours_it(
    valkey_server: EmbeddedValkey,
) -> None:
    client = valkey_async.Valkey.from_url(valkey_server.url)
    try:
        outbox = Outbox(client, FAST)
        report = await outbox.check_durability()
        assert (report.asked, report.chosen, report.level) == ("fsync", False, "fsync")
        assert report.problems == [] and report.notes == []
        assert "fsynced to the primary's AOF" in report.summary()
        entry = await outbox.accept("dur-default", "s", "u", "m1", "hello")
        with pytest.raises(Duplicate) as dup:
            await outbox.accept("dur-default", "s", "u", "m1", "hello")
        assert dup.value.accepted_id == entry.id
        assert await client.exists("outboxprobe:{0}") == 0  # the probe cleans up after itself
    finally:
        await client.aclose()


async def test_a_chosen_level_the_server_cannot_honour_refuses_and_writes_nothing(
    valkey_server: EmbeddedValkey,
) -> None:
    client = valkey_async.Valkey.from_url(valkey_server.url)
    try:
        chosen = Tunables(accept_durability="replica", durability_timeout=QUICK)
        with pytest.raises(DurabilityError, match=r"'replica' cannot be honoured.*no replica"):
            await Outbox(client, chosen).check_durability()
        # Nobody checked first: the first accept checks, and refuses before writing anything.
        with pytest.raises(DurabilityError, match="no replica"):
            await Outbox(client, chosen).accept("dur-refused", "s", "u", "m1", "hello")
        assert await _keys(client, "dur-refused") == []
    finally:
        await client.aclose()


async def test_the_default_steps_down_on_a_server_without_aof_and_says_so(
    lax_server: int,
) -> None:
    client = valkey_async.Valkey.from_url(f"valkey://127.0.0.1:{lax_server}")
    try:
        report = await Outbox(client, FAST).check_durability()
        assert (report.asked, report.chosen, report.level) == ("fsync", False, "none")
        assert any("'fsync' is not available" in n and "appendonly" in n for n in report.notes)
        # The server's own words ("WAITAOF cannot be used when numlocal is set...") say no
        # fix: the note ends with it.
        fix = "set appendonly yes (and appendfsync always) on the server, or choose "
        assert any(
            n.endswith(fix + "accept_durability none (serve: --accept-durability none)")
            for n in report.notes
        )
        assert any("no persistence" in p for p in report.problems)
        assert any("allkeys-lru" in p for p in report.problems)
        assert "stepped down from fsync" in report.summary()
        assert "in Valkey's memory" in report.summary()
        outbox = Outbox(client, FAST)
        await outbox.accept("dur-lax", "s", "u", "m1", "hello")  # acknowledged, at level none
        with pytest.raises(DurabilityError, match="'fsync' cannot be honoured") as refused:
            await Outbox(client, Tunables(accept_durability="fsync")).check_durability()
        assert str(refused.value).endswith(
            fix + "accept_durability none (serve: --accept-durability none)"
        )
    finally:
        await client.aclose()


async def test_an_accept_the_server_cannot_confirm_is_written_and_not_durable(
    tmp_path: Path,
) -> None:
    """AOF turned off after the start: the accept is written, WAITAOF cannot confirm it. The
    retry with the same clientMessageID waits again (a duplicate is confirmed too), and once
    the server can, it answers with the same entry."""
    with EmbeddedValkey(tmp_path) as server:
        client = valkey_async.Valkey.from_url(server.url)
        try:
            outbox = Outbox(client, FAST)
            assert (await outbox.check_durability()).level == "fsync"
            await client.config_set("appendonly", "no")
            with pytest.raises(NotDurable) as first:
                await outbox.accept("acme", "dur-off", "u", "m1", "hello")
            assert first.value.level == "fsync" and "appendonly" in first.value.detail
            [entry] = await outbox.list("acme", "dur-off")
            assert entry.id == first.value.entry_id  # written, just not confirmed
            with pytest.raises(NotDurable) as again:
                await outbox.accept("acme", "dur-off", "u", "m1", "hello")
            assert again.value.entry_id == entry.id
            assert outbox.metrics.not_durable._value.get() == 2

            async for http in serve(outbox):
                r = await http.post(
                    "/v1/workspaces/acme/sessions/dur-off/prompts",
                    json={"clientMessageID": "m1", "text": "hello"},
                    headers=ALICE,
                )
                assert r.status_code == 503 and r.headers["Retry-After"] == "1"
                assert r.json()["error"] == "not_durable" and r.json()["id"] == entry.id
                await client.config_set("appendonly", "yes")
                r = await http.post(
                    "/v1/workspaces/acme/sessions/dur-off/prompts",
                    json={"clientMessageID": "m1", "text": "hello"},
                    headers=ALICE,
                )
                assert r.status_code == 200 and r.json() == {"id": entry.id, "duplicate": True}
            assert [e.id for e in await outbox.list("acme", "dur-off")] == [entry.id]
        finally:
            await client.aclose()


async def test_a_cluster_is_probed_on_every_primary(valkey_cluster: LocalCluster) -> None:
    client = connect(valkey_cluster.url, socket_timeout=5)
    assert isinstance(client, ValkeyCluster)
    try:
        report = await Outbox(client, FAST).check_durability()
        assert report.level == "fsync" and report.problems == []
        chosen = Tunables(accept_durability="replica", durability_timeout=QUICK)
        with pytest.raises(DurabilityError) as refused:
            await Outbox(client, chosen).check_durability()
        for port in valkey_cluster.ports:  # each primary is named: none has a replica
            assert f":{port}: no replica" in str(refused.value)
    finally:
        await client.aclose()


def test_serve_refuses_a_chosen_level_it_cannot_honour(tmp_path: Path) -> None:
    r = subprocess.run(
        [BIN, "serve", "--no-auth", "--data-dir", str(tmp_path),
         "--accept-durability", "replica", "--durability-timeout", "0.2"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert "accept_durability 'replica' cannot be honoured" in r.stderr


def test_the_durability_options_are_checked(tmp_path: Path) -> None:
    for command in ("serve", "worker"):
        for bad in (["--accept-durability", "always"], ["--durability-timeout", "0"]):
            r = subprocess.run(
                [BIN, command, "--data-dir", str(tmp_path), *bad],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert r.returncode == 2 and bad[0] in r.stderr, r.stderr


def test_a_worker_names_the_level_in_force(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [BIN, "worker", "--data-dir", str(tmp_path), "--webhook-url", "http://127.0.0.1:9/x",
         "--accept-durability", "none"],
        stderr=subprocess.PIPE, text=True,
        env={"PROMPT_OUTBOX_WEBHOOK_SECRET": "s", "PATH": "/usr/bin:/bin"},
        start_new_session=True,  # its own group: the worker and the embedded Valkey it starts
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "accept_durability=" in line:
                assert "accept_durability=none (chosen)" in line
                break
        else:
            raise AssertionError("the worker never named its durability level")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


async def test_fsync_needs_appendfsync_always_and_replica_needs_a_replica_that_fsyncs(
    replicated_pair: ReplicatedPair,
) -> None:
    """On ``everysec`` WAITAOF counts a local fsync before it happens: ``fsync`` is refused
    there (the default steps down to ``none``); ``replica`` waits for the replica's disk."""
    client = valkey_async.Valkey.from_url(replicated_pair.primary_url)
    try:
        with pytest.raises(DurabilityError, match=r"appendfsync is 'everysec'.*13793"):
            await Outbox(client, Tunables(accept_durability="fsync")).check_durability()
        default = await Outbox(client, FAST).check_durability()
        assert default.level == "none" and any("13793" in n for n in default.notes)
        assert any("1 replica(s): a failover can lose" in p for p in default.problems)
        chosen = Tunables(accept_durability="replica", durability_timeout=5.0)
        report = await Outbox(client, chosen).check_durability()
        assert report.level == "replica"
        assert not any("replica(s)" in p for p in report.problems)  # a failover loses nothing
        assert any("restarts this primary" in p for p in report.problems)  # a restart may
        replica = f"replica 127.0.0.1:{replicated_pair.replica_port}: appendfsync is everysec"
        assert any(p.startswith(replica) for p in report.problems)  # its count is early
    finally:
        await client.aclose()


async def test_a_frozen_replica_answers_not_durable_in_time_and_the_retry_finds_the_entry(
    replicated_pair: ReplicatedPair,
) -> None:
    client = valkey_async.Valkey.from_url(replicated_pair.primary_url, socket_timeout=30)
    timeout = 2.5  # an everysec replica reports its fsync within about a second
    outbox = Outbox(client, Tunables(accept_durability="replica", durability_timeout=timeout))
    try:
        first = await outbox.accept("dur-pair", "s", "u", "m0", "confirmed")
        replicated_pair.freeze_replica()
        started = time.monotonic()
        with pytest.raises(NotDurable) as late:
            await outbox.accept("dur-pair", "s", "u", "m1", "hello")
        assert time.monotonic() - started < timeout + NEVER_HANGS
        assert late.value.level == "replica" and "no replica fsynced" in late.value.detail
        with pytest.raises(NotDurable) as again:  # a duplicate waits too, for the same entry
            await outbox.accept("dur-pair", "s", "u", "m1", "hello")
        assert again.value.entry_id == late.value.entry_id
        replicated_pair.thaw_replica()
        with pytest.raises(Duplicate) as dup:
            await outbox.accept("dur-pair", "s", "u", "m1", "hello")
        assert dup.value.accepted_id == late.value.entry_id
        ids = [e.id for e in await outbox.list("dur-pair", "s")]
        assert ids == [first.id, late.value.entry_id]  # one entry each, never two
    finally:
        replicated_pair.thaw_replica()
        await client.aclose()


async def test_a_cluster_waits_for_the_replica_of_the_workspaces_own_master(
    replicated_cluster: LocalCluster,
) -> None:
    client = connect(replicated_cluster.url, socket_timeout=30)
    timeout = 2.5  # an everysec replica reports its fsync within about a second
    chosen = Tunables(accept_durability="replica", durability_timeout=timeout)
    try:
        outbox = Outbox(client, chosen)
        assert (await outbox.check_durability()).level == "replica"
        master = replicated_cluster.primaries()[0]
        key = key_served_by(master, "ws")
        ws = key[key.index("{") + 1 : key.rindex("}")]
        await outbox.accept(ws, "s", "u", "m0", "confirmed")
        replica = replicated_cluster.replica_of(master)
        replicated_cluster.freeze_node(replica)
        started = time.monotonic()
        with pytest.raises(NotDurable) as late:
            await outbox.accept(ws, "s", "u", "m1", "hello")
        assert time.monotonic() - started < timeout + NEVER_HANGS
        replicated_cluster.thaw_node(replica)
        with pytest.raises(Duplicate) as dup:
            await outbox.accept(ws, "s", "u", "m1", "hello")
        assert dup.value.accepted_id == late.value.entry_id
    finally:
        for port in list(replicated_cluster.frozen):
            replicated_cluster.thaw_node(port)
        await client.aclose()
