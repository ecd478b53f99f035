"""The due index (storage/dueindex.py): the ordering rules that keep a mark from going
missing, the loop's compare-and-set, and a tick whose cost does not grow with idle tenants."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from valkey.asyncio.cluster import ValkeyCluster

from prompt_outbox import Duplicate, Entry, Outbox
from prompt_outbox.core.callbacks import Wiring
from prompt_outbox.core.keys import LEGACY_WORKSPACES, SessionKeys, WorkspaceKeys, buckets
from prompt_outbox.core.metrics import Metrics
from prompt_outbox.delivery.engine import Engine
from prompt_outbox.delivery.maintenance import Maintenance
from prompt_outbox.storage.client import Client
from prompt_outbox.storage.dueindex import Mark
from prompt_outbox.storage.store import Store
from tests.agents import ScriptedAgent
from tests.support.tunables import FAST
from tests.support.waiting import eventually, holds

pytestmark = pytest.mark.cluster_too

ERROR_ENTRY = (
    '{{"id":"{id}","clientMessageID":"{id}","userID":"u","text":"stuck",'
    '"acceptedAt":"2026-12-01T00:00:00.000000Z","attempts":5,"lastError":"x","status":"error"}}'
)


def now_ms() -> int:
    return int(time.time() * 1000)


def maintenance_of(store: Store) -> Maintenance:
    """The maintenance passes alone (no run loop deciding when), with FAST tunables."""
    engine = Engine(store, FAST, lambda: datetime.now(UTC), Metrics(), Wiring())
    return Maintenance(store, engine, FAST, Metrics(), Wiring())


async def marks_due(store: Store, at_ms: int) -> list[Mark]:
    """The marks due at ``at_ms``, read as a loop reads them (with their generations)."""
    found, _ = await store.due.due_visits(at_ms, limit=10)
    return [mark for mark, _ in found]


async def score_of(client: Client, ws: str) -> float | None:
    score: float | None = await client.zscore(WorkspaceKeys(ws).bucket.due, ws)
    return score


async def test_an_accept_marks_its_workspace_due_and_registers_it(
    outbox: Outbox, client: Client
) -> None:
    before = now_ms()
    await outbox.accept("ws", "s1", "u", "c1", "hi")
    score = await score_of(client, "ws")
    assert score is not None and before - 5000 <= score <= now_ms()
    assert list(await Store(client).walk.workspaces()) == ["ws"]


async def test_a_loop_cannot_drop_a_mark_a_writer_renewed_after_its_read(client: Client) -> None:
    # The loop read the mark, then read the workspace (empty), while an accept marked and
    # pushed: the loop's compare-and-set must lose, or the accepted entry would go unseen.
    store, outbox = Store(client), Outbox(client, FAST)
    await store.due.mark("ws", now_ms(), "before")  # a writer that died before its push
    [stale] = await marks_due(store, now_ms())
    await outbox.accept("ws", "s1", "u", "c1", "hi")  # marks before and after its push
    assert await store.due.unmark([(stale, None)], grace_ms=0) == [False]
    score = await score_of(client, "ws")
    assert score is not None and score <= now_ms()


async def test_a_young_writer_keeps_a_mark_until_its_grace_has_passed(client: Client) -> None:
    # Marked, transition not seen yet: the loop may not drop the mark, only push it to the
    # writer's generation + grace (if the writer then dies, its work waits at most that long).
    store = Store(client)
    await store.due.mark("ws", now_ms(), "before")
    [mark] = await marks_due(store, now_ms())
    assert await store.due.unmark([(mark, None)], grace_ms=60_000) == [True]
    settle = int(mark.generation) // 1000 + 60_000  # the BEFORE mark made that generation
    assert await score_of(client, "ws") == settle
    # With no grace left the same unmark drops it.
    [mark] = await marks_due(store, settle)
    assert await store.due.unmark([(mark, None)], grace_ms=0) == [True]
    assert await score_of(client, "ws") is None


async def test_a_mark_after_a_landed_change_needs_no_grace(client: Client) -> None:
    # The writer's second mark says its transition is in place: the visit saw it, so the
    # loop may drop the mark at once (no second visit a lease later).
    store = Store(client)
    await store.due.mark("ws", now_ms(), "before")
    await store.due.mark("ws", now_ms(), "after")
    [mark] = await marks_due(store, now_ms())
    assert await store.due.unmark([(mark, None)], grace_ms=60_000) == [True]
    assert await score_of(client, "ws") is None


async def test_a_stale_mark_costs_one_visit_then_goes(client: Client) -> None:
    store, outbox = Store(client), Outbox(client, replace(FAST, lease_ttl=0.2))
    await store.due.mark("ghost", now_ms(), "before")  # its writer died: nothing behind it
    async with outbox.running(ScriptedAgent(), tick=0.05):
        await eventually(lambda: _gone(client, "ghost"), within=5)


async def _gone(client: Client, ws: str) -> bool:
    return await score_of(client, ws) is None


async def test_a_retry_sooner_than_the_lease_is_not_held_back_by_it(client: Client) -> None:
    # The loop leaves the mark at the drain's lease expiry (30 s here); the drain's last
    # acquire lets the lock go with the retry due in 0.2 s, and must mark that.
    outbox = Outbox(client, replace(FAST, lease_ttl=30.0, retry_backoff=0.2, max_backoff=0.2))
    agent = ScriptedAgent([RuntimeError("refused")])
    await outbox.accept("ws", "s1", "u", "c1", "hi")
    async with outbox.running(agent, tick=5.0):
        await eventually(lambda: holds(len(agent.calls) == 2), within=5)


async def test_an_operator_retry_wakes_the_loop_at_once(client: Client) -> None:
    outbox = Outbox(client, FAST)
    delivered: list[str] = []

    async def deliver(ws: str, ses: str, entry: Entry) -> None:
        delivered.append(entry.text)

    await outbox.seed_entry_for_test("ws", "s1", ERROR_ENTRY.format(id="e1"))
    async with outbox.running(deliver, tick=10.0):
        await asyncio.sleep(0.2)
        assert delivered == []  # an error entry is not due
        assert (await outbox.retry("ws", "s1", "e1")).name == "UPDATED"
        await eventually(lambda: holds(delivered == ["stuck"]), within=3)


async def test_the_pre_index_registry_is_migrated_at_start(client: Client) -> None:
    # A store written before the due index: entries, per-workspace ready sets, and the old
    # registry ZSET, but no buckets. Starting a loop folds it in and delivers.
    outbox = Outbox(client, FAST)
    await outbox.accept("old", "s1", "u", "c1", "from before")
    for b in buckets():
        await client.delete(b.due, b.registry)
    await client.zadd(LEGACY_WORKSPACES, {"old": now_ms()})
    agent = ScriptedAgent()
    async with outbox.running(agent, tick=0.05):
        await eventually(lambda: holds(agent.texts == ["from before"]), within=5)
    assert not await client.exists(LEGACY_WORKSPACES)
    assert "old" in await Store(client).walk.workspaces()


async def _commands(client: Client) -> int:
    if isinstance(client, ValkeyCluster):
        stats = await client.info("commandstats", target_nodes=ValkeyCluster.PRIMARIES)
        rows = [v for node in stats.values() for v in node.values()] if stats else []
    else:
        rows = list((await client.info("commandstats")).values())
    return sum(int(row["calls"]) for row in rows if isinstance(row, dict))


async def _no_marks(client: Client) -> bool:
    return sum([await client.zcard(b.due) for b in buckets()]) == 0


async def _idle_commands(client: Client, workspaces: int) -> int:
    outbox = Outbox(client, replace(FAST, repair_interval=3600.0))
    for i in range(workspaces):
        await outbox.seed_entry_for_test(f"w{i}", "s1", ERROR_ENTRY.format(id=f"e{i}"))
    async with outbox.running(ScriptedAgent(), tick=0.05):
        # The start-up recovery pass and one visit per seeded workspace (its mark) come first.
        await eventually(lambda: _no_marks(client), within=30, interval=0.1)
        before = await _commands(client)
        await asyncio.sleep(1.0)  # about 20 ticks
        return await _commands(client) - before


@pytest.mark.parametrize("idle", [300])
async def test_an_idle_tick_costs_the_same_with_many_idle_workspaces(
    client: Client, idle: int
) -> None:
    few = await _idle_commands(client, 3)
    many = await _idle_commands(client, idle)
    # A count, not a time: about one read per bucket per tick either way (the figure that
    # grew with the tenants before the index was ~2 per workspace per tick).
    assert many <= few * 1.5 + 20, (few, many)
    assert many < idle  # O(workspaces) per tick would be at least 20 x idle here


async def test_wake_ups_cross_clients_over_sharded_pub_sub(
    connect_client: Callable[..., Client], client: Client
) -> None:
    # The loop sleeps for 10 s between scans: only the wake-up (SPUBLISH on the bucket's
    # shard channel, heard over SSUBSCRIBE) can start this delivery in time.
    worker, front = Outbox(connect_client(), FAST), Outbox(connect_client(), FAST)
    agent = ScriptedAgent()
    async with worker.running(agent, tick=10.0):
        channel = WorkspaceKeys("ws").bucket.wake
        await eventually(lambda: _shard_subscribers(client, channel), within=5)
        await asyncio.sleep(0.1)  # past the loop's first scan
        await front.accept("ws", "s1", "u", "c1", "wake up")
        await eventually(lambda: holds(agent.texts == ["wake up"]), within=2)


async def _shard_subscribers(client: Client, channel: str) -> int:
    if isinstance(client, ValkeyCluster):
        node = client.get_node_from_key(channel)
        reply = await client.execute_command("PUBSUB", "SHARDNUMSUB", channel, target_nodes=node)
    else:
        reply = await client.execute_command("PUBSUB", "SHARDNUMSUB", channel)
    return int(reply[1])


async def test_repair_passes_skip_workspaces_nothing_wrote_to(client: Client) -> None:
    # Between full passes only workspaces a writer marked since their last repair are
    # repaired: idle tenants cost a registry read, not a script per session.
    from prompt_outbox.delivery.maintenance import FULL_REPAIR_EVERY

    outbox, store = Outbox(client, FAST), Store(client)
    for ws in ("quiet", "touched"):  # idle tenants: one error entry each, nothing due
        await outbox.seed_entry_for_test(ws, "s1", ERROR_ENTRY.format(id="e1"))
    maintenance = maintenance_of(store)
    await maintenance.repair()  # the first pass is full
    for ws in ("quiet", "touched"):  # both lose an index entry behind the scripts' back
        await client.srem(WorkspaceKeys(ws).errors, "s1")
    await outbox.accept("touched", "s2", "u", "c2", "y")  # a writer: its workspace is redone
    await maintenance.repair()
    assert await client.sismember(WorkspaceKeys("touched").errors, "s1")
    assert not await client.sismember(WorkspaceKeys("quiet").errors, "s1")
    for _ in range(FULL_REPAIR_EVERY - 1):  # ...until the next full pass
        await maintenance.repair()
    assert await client.sismember(WorkspaceKeys("quiet").errors, "s1")


async def test_a_pending_writer_keeps_its_mark_whoever_marked_last(client: Client) -> None:
    # Writer A marked BEFORE its push; then B marked ALONE (a change in place). The loop read
    # B's generation: A's push may still be missing from what it saw, so the mark must stay.
    store = Store(client)
    await store.due.mark("ws", now_ms(), "before")
    await store.due.mark("ws", now_ms(), "alone")
    [mark] = await marks_due(store, now_ms())
    assert await store.due.unmark([(mark, None)], grace_ms=60_000) == [True]
    score = await score_of(client, "ws")
    assert score is not None and score > now_ms() + 50_000


async def test_a_saturated_loop_waits_instead_of_scanning_again_and_again(
    client: Client,
) -> None:
    # concurrency 1, one long delivery, another session due: the loop must not spin on the
    # mark it cannot serve (it would scan and visit thousands of times a second).
    outbox = Outbox(client, replace(FAST, concurrency=1, delivery_timeout=30.0))
    release = asyncio.Event()

    async def slow(ws: str, ses: str, entry: Entry) -> None:
        await release.wait()

    await outbox.accept("ws", "s1", "u", "c1", "long")
    await outbox.accept("ws", "s2", "u", "c2", "waits")
    async with outbox.running(slow, tick=0.5):
        await asyncio.sleep(0.3)
        before = await _commands(client)
        await asyncio.sleep(1.0)
        spent = await _commands(client) - before
        release.set()
    assert spent < 200, spent  # about 2 scans, and the lease renewals


async def test_a_full_repair_finds_a_workspace_the_registry_lost(client: Client) -> None:
    # A bucket's node failed over before its replica had the accept's marks: the entry is
    # there, the registry and the mark are not. A full repair pass finds it by SCAN.
    outbox, store = Outbox(client, FAST), Store(client)
    await outbox.accept("lost", "s1", "u", "c1", "still here")
    b = WorkspaceKeys("lost").bucket
    await client.zrem(b.due, "lost")
    await client.hdel(b.registry, "lost")
    await maintenance_of(store).repair(full=True)
    assert "lost" in await store.walk.workspaces()
    score = await score_of(client, "lost")
    assert score is not None and score <= now_ms()


async def test_an_accept_after_a_restart_emptied_the_script_cache_runs_once(
    client: Client,
) -> None:
    # The accept and its mark are one script on a standalone server: NOSCRIPT means it did
    # not run, so it is loaded and sent again, once (a second run would answer duplicate).
    # At level fsync its WAITAOF rides the same pipeline and is sent again with it.
    if isinstance(client, ValkeyCluster):
        pytest.skip("the cluster path sends each call alone (no pipeline)")
    outbox = Outbox(client, FAST)
    await outbox.check_durability()
    await client.script_flush()
    entry = await outbox.accept("ws", "s1", "u", "c1", "once")
    assert [e.id for e in await outbox.list("ws", "s1")] == [entry.id]
    score = await score_of(client, "ws")
    assert score is not None


async def _generation(client: Client, ws: str) -> str | None:
    generation: bytes | None = await client.hget(WorkspaceKeys(ws).bucket.registry, ws)
    return generation.decode() if generation else None


async def test_an_accept_behind_a_ready_session_needs_no_mark(client: Client) -> None:
    # The first accept makes the session ready: marked, a new generation. The second waits
    # behind the first, so no work became due sooner: on a standalone server (mark and
    # accept in one script) it leaves the mark and the generation as they were. A cluster
    # marks before and after each accept: it cannot know in advance.
    outbox = Outbox(client, FAST)
    await outbox.accept("ws", "s1", "u", "c1", "first")
    first = await _generation(client, "ws")
    assert first is not None and await score_of(client, "ws") is not None
    await outbox.accept("ws", "s1", "u", "c2", "second")
    with pytest.raises(Duplicate):
        await outbox.accept("ws", "s1", "u", "c2", "second")
    unchanged = await _generation(client, "ws") == first
    assert unchanged is not isinstance(client, ValkeyCluster)
    await outbox.accept("ws", "s2", "u", "c3", "another session")  # ready now: marked
    assert await _generation(client, "ws") != first
    delivered: list[str] = []

    async def deliver(ws: str, ses: str, entry: Entry) -> None:
        delivered.append(entry.text)

    async with outbox.running(deliver, tick=10.0):
        await eventually(lambda: holds(len(delivered) == 3), within=5)
    assert [t for t in delivered if t != "another session"] == ["first", "second"]


@pytest.mark.parametrize("before", ["empty", "pending head", "only an error entry", "locked"])
async def test_an_accept_indexes_its_session_as_a_full_refresh_would(
    client: Client, before: str
) -> None:
    # accept.lua derives the indexes in O(1) (index_pushed): from the entry count and
    # whether a ready score was there. After it, repair.lua (which reads everything) must
    # find nothing to change; a session whose only entry is in error becomes ready with the
    # new entry as its head, and is marked.
    store, outbox = Store(client), Outbox(client, FAST)
    k = SessionKeys("ws", "s1")
    ready, sessions = k.script_keys()[3], k.script_keys()[4]
    if before == "pending head":
        await outbox.accept("ws", "s1", "u", "c0", "ahead")
    elif before == "only an error entry":
        await outbox.seed_entry_for_test("ws", "s1", ERROR_ENTRY.format(id="e1"))
        await client.delete(WorkspaceKeys("ws").bucket.due)  # seed.lua's due mark, visited
    elif before == "locked":
        assert await store.lock(k, "holder", 30_000, now_ms())
    await outbox.accept("ws", "s1", "u", "c1", "new")

    async def indexes() -> tuple[float | None, bool]:
        score: float | None = await client.zscore(ready, "s1")
        return score, bool(await client.sismember(sessions, "s1"))

    incremental = await indexes()
    await store.repair(k, now_ms())
    full = await indexes()
    assert incremental[1] is full[1] is True
    if before == "locked":  # repair re-derives the lease expiry from the lock's PTTL
        assert incremental[0] is not None and full[0] is not None
        assert abs(incremental[0] - full[0]) < 2_000
    else:
        assert incremental[0] == full[0] == 0  # due at once
    if before == "only an error entry":
        assert await score_of(client, "ws") is not None
