"""Crash safety: a worker SIGKILLed mid-delivery loses nothing, and Recover duplicates nothing."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import valkey.asyncio as valkey_async

from prompt_outbox import Entry, Outbox, Status, Verdict
from prompt_outbox.core.keys import SessionKeys
from prompt_outbox.embedded import EmbeddedValkey
from tests.agents import HookLog, ScriptedAgent
from tests.support.tunables import FAST
from tests.support.waiting import eventually, holds

pytestmark = pytest.mark.cluster_too

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def worker_process(url: str, agent_dir: Path, *, hang: bool) -> Iterator[subprocess.Popen[bytes]]:
    args = [sys.executable, "-m", "tests.crash_worker", url, str(agent_dir)]
    proc = subprocess.Popen([*args, "hang"] if hang else args, cwd=ROOT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()


def transcript(agent_dir: Path) -> list[str]:
    path = agent_dir / "seen"
    return path.read_text().split() if path.exists() else []


def truthful_verifier(agent_dir: Path):  # type: ignore[no-untyped-def]
    async def verify(ws: str, ses: str, entry: Entry) -> Verdict:
        return Verdict.DELIVERED if entry.id in transcript(agent_dir) else Verdict.ABSENT

    return verify


@contextlib.asynccontextmanager
async def killed_mid_delivery(
    url: str, outbox: Outbox, agent_dir: Path, count: int = 3
) -> AsyncIterator[list[str]]:
    ids = [(await outbox.accept("ws", "s1", "u", f"c{i}", f"prompt {i}")).id for i in range(count)]
    with worker_process(url, agent_dir, hang=True) as proc:
        await eventually(lambda: holds(bool(transcript(agent_dir))), within=20)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    yield ids


async def test_killed_worker_entry_is_recovered_as_verifying_at_the_head(
    server_url: str,
    client: valkey_async.Valkey,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    outbox = Outbox(client, FAST)
    async with killed_mid_delivery(server_url, outbox, tmp_path) as ids:
        listed = await outbox.list("ws", "s1")
        assert [e.id for e in listed] == ids  # nothing lost
        assert listed[0].status is Status.DELIVERING  # stuck in staging
        await eventually(lambda: _lock_gone(client))  # the dead worker's lease lapses
        assert await outbox.recover() == 1
        assert await outbox.recover() == 0  # idempotent: never requeued twice
        listed = await outbox.list("ws", "s1")
        assert [e.id for e in listed] == ids
        assert [e.status for e in listed] == [Status.VERIFYING, Status.PENDING, Status.PENDING]
        assert await client.llen(SessionKeys("ws", "s1").staging) == 0

        # The verifier finds the interrupted send in the transcript: no second send.
        outbox.set_verifier(truthful_verifier(tmp_path))
        delivered = HookLog()
        outbox.set_on_delivered(delivered)
        agent = ScriptedAgent()
        async with outbox.running(agent, tick=0.05):
            await eventually(lambda: holds(len(delivered.ids) == 3), within=10)
        assert sorted(delivered.ids) == sorted(ids)
        assert [e.id for _, _, e in agent.calls] == ids[1:]
        assert transcript(tmp_path) == ids[:1]


async def _lock_gone(client: valkey_async.Valkey) -> bool:
    return not await client.exists(SessionKeys("ws", "s1").lock)


async def test_a_living_replica_takes_over_when_the_lease_lapses(
    server_url: str,
    client: valkey_async.Valkey,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    outbox = Outbox(client, FAST)
    outbox.set_verifier(truthful_verifier(tmp_path))
    delivered = HookLog()
    outbox.set_on_delivered(delivered)
    ids = [(await outbox.accept("ws", "s1", "u", f"c{i}", f"p{i}")).id for i in range(2)]
    agent = ScriptedAgent()
    with worker_process(server_url, tmp_path, hang=True) as proc:
        await eventually(lambda: holds(bool(transcript(tmp_path))), within=20)
        async with outbox.running(agent, tick=0.05):
            await asyncio.sleep(0.3)
            assert not delivered.ids  # the living holder's session is left alone
            proc.send_signal(signal.SIGKILL)
            killed_at = asyncio.get_running_loop().time()
            await eventually(lambda: holds(len(delivered.ids) == 2), within=15)
            unfrozen_after = asyncio.get_running_loop().time() - killed_at
    assert sorted(delivered.ids) == sorted(ids)
    assert [e.id for _, _, e in agent.calls] == ids[1:]  # the first was verified, not resent
    assert unfrozen_after < FAST.lease_ttl + 5  # the lease, not a 12-minute lock


async def test_worker_that_completes_normally_leaves_nothing_staged(
    server_url: str,
    client: valkey_async.Valkey,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    outbox = Outbox(client, FAST)
    ids = [(await outbox.accept("ws", "s1", "u", f"c{i}", f"p{i}")).id for i in range(3)]
    with worker_process(server_url, tmp_path, hang=False):
        await eventually(lambda: _empty(outbox), within=20)
    assert transcript(tmp_path) == ids


async def _empty(outbox: Outbox) -> bool:
    return await outbox.list("ws", "s1") == []


async def test_recover_skips_a_session_whose_lock_is_held(
    outbox: Outbox, client: valkey_async.Valkey
) -> None:
    k = SessionKeys("ws", "s1")
    entry = await outbox.accept("ws", "s1", "u", "c1", "hello")
    [raw] = await client.lrange(k.queue, 0, -1)
    await client.rpush(k.staging, raw)  # as if staged...
    await client.lrem(k.queue, 1, raw)
    await client.set(k.lock, "another-worker:0", px=10_000)  # ...by a living worker
    assert await outbox.recover() == 0
    assert await client.llen(k.staging) == 1
    await client.delete(k.lock)
    assert await outbox.recover() == 1
    [e] = await outbox.list("ws", "s1")
    assert (e.id, e.status) == (entry.id, Status.VERIFYING)


async def test_recover_dedupes_against_the_queue_by_id(
    outbox: Outbox, client: valkey_async.Valkey
) -> None:
    # A crash between "push to staging" and "remove from the queue" leaves both copies.
    k = SessionKeys("ws", "s1")
    first = await outbox.accept("ws", "s1", "u", "c1", "first")
    second = await outbox.accept("ws", "s1", "u", "c2", "second")
    raw = (await client.lrange(k.queue, 0, 0))[0]
    await client.rpush(k.staging, raw)
    assert await outbox.recover() == 1
    listed = await outbox.list("ws", "s1")
    assert [e.id for e in listed] == [first.id, second.id]  # one copy, in place
    assert listed[0].status is Status.VERIFYING  # the send may have happened


async def test_accepted_entries_survive_a_valkey_sigkill(tmp_path: Path) -> None:
    server = EmbeddedValkey(tmp_path / "valkey")
    server.start()
    try:
        c = valkey_async.Valkey.from_url(server.url)
        outbox = Outbox(c, FAST)
        ids = [(await outbox.accept("ws", "s1", "u", f"c{i}", f"p{i}")).id for i in range(20)]
        await c.aclose()
        server.kill()  # acknowledged == fsynced (appendfsync always)
        server.start()
        c = valkey_async.Valkey.from_url(server.url)
        outbox = Outbox(c, FAST)  # scripts reload on NOSCRIPT
        assert [e.id for e in await outbox.list("ws", "s1")] == ids
        agent = ScriptedAgent()
        for _ in ids:
            assert await outbox.deliver_once("ws", "s1", agent)
        assert [e.id for _, _, e in agent.calls] == ids
        await c.aclose()
    finally:
        server.stop()
