"""The event feed behind every watch, on real servers: streams share a few connections, an
event arrives on its notice (not at the next poll), a reader that falls behind is cut off and
resumes exactly, and no event is lost to a killed subscription, a restart or a moved slot."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from valkey.asyncio import Valkey
from valkey.asyncio.cluster import ValkeyCluster

from prompt_outbox import Duplicate, EditResult, Outbox, OutboxFull
from prompt_outbox.api.sse import event_stream
from prompt_outbox.core.events import QueueEvent, QueueReset
from prompt_outbox.core.keys import session_keys
from prompt_outbox.core.metrics import Metrics
from prompt_outbox.embedded import EmbeddedValkey
from prompt_outbox.storage.client import Client
from prompt_outbox.storage.connect import connect
from prompt_outbox.storage.feed import (
    Event,
    EventFeed,
    FeedLimits,
    FellBehind,
    Follower,
    StreamEnded,
)
from prompt_outbox.storage.store import TRANSIENT_ERRORS, Store
from tests.cluster import LocalCluster, migrate_slot, owner_of
from tests.support.events import take
from tests.support.pubsub import kill_subscriptions, masters
from tests.support.tunables import FAST
from tests.support.waiting import eventually, holds

pytestmark = pytest.mark.cluster_too

WS, SES = "ws", "s1"
QUIET = 60.0  # a poll this long never fires in a test: only a notice (or a re-subscription) wakes
ROOMY = dataclasses.replace(FAST, event_log_bytes=16 * 1024 * 1024)
"""Logs that hold 30 events of 40 kB without beginning again (event_log_bytes)."""


class Watch:
    """A watch consumed in the background, its non-quiet items collected."""

    def __init__(self, outbox: Outbox, ws: str, ses: str, poll: float = QUIET) -> None:
        self.items: list[QueueEvent | QueueReset] = []
        self._stream = outbox.watch(ws, ses, poll=poll)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for item in self._stream:
            if item is not None:
                self.items.append(item)

    def accepted(self) -> list[str]:
        return [i.entry_id for i in self.items if isinstance(i, QueueEvent)]

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._stream.aclose()  # type: ignore[attr-defined]


async def connected(client: Client) -> int:
    """Client connections on the server (summed over the primaries of a cluster)."""
    if isinstance(client, ValkeyCluster):
        per_node = await client.info("clients", target_nodes=ValkeyCluster.PRIMARIES)
        return sum(int(info["connected_clients"]) for info in per_node.values())
    return int((await client.info("clients"))["connected_clients"])


async def accept(outbox: Outbox, ws: str, ses: str, cmid: str) -> str:
    """Accept like a careful client: on no answer (a slot moving), the same cmid again."""
    while True:
        try:
            return (await outbox.accept(ws, ses, "u", cmid, cmid)).id
        except Duplicate as dup:
            return dup.accepted_id
        except (OutboxFull, *TRANSIENT_ERRORS):  # type: ignore[misc]
            await asyncio.sleep(0.02)


async def test_many_watches_share_a_few_connections(outbox: Outbox, client: Client) -> None:
    before = await connected(client)
    where = [(f"ws{n % 20}", f"s{n}") for n in range(200)]
    watches = [Watch(outbox, ws, ses) for ws, ses in where]
    try:
        await eventually(lambda: holds(all(w.items for w in watches)))  # every reset
        ids = [await accept(outbox, ws, ses, "c1") for ws, ses in where]
        await eventually(lambda: holds([w.accepted() for w in watches] == [[i] for i in ids]))
        # Blocked reads held one connection per watch (200); now, whatever the count: one
        # subscription per node, and the reads' pooled connections (at most FeedLimits.reads
        # in flight at once; a cluster client pools per node, so per node).
        added = await connected(client) - before
        assert added <= await masters(client) * (FeedLimits().reads + 1) + 2, added
    finally:
        for w in watches:
            await w.close()
    # The last watch out unsubscribes: the subscription connections close.
    await eventually(lambda: _pubsub_clients(client, 0))


async def _pubsub_clients(client: Client, expected: int) -> bool:
    if isinstance(client, ValkeyCluster):
        per_node = await client.info("clients", target_nodes=ValkeyCluster.PRIMARIES)
        return sum(int(info["pubsub_clients"]) for info in per_node.values()) == expected
    return int((await client.info("clients"))["pubsub_clients"]) == expected


async def test_an_event_comes_on_its_notice_not_at_the_next_poll(outbox: Outbox) -> None:
    watch = Watch(outbox, WS, SES)
    try:
        await eventually(lambda: holds(len(watch.items) == 1))
        for n in range(5):
            ids = [await accept(outbox, WS, SES, f"c{n}")]
            await eventually(lambda: holds(watch.accepted()[-1:] == ids), within=1.0)  # noqa: B023
    finally:
        await watch.close()


async def test_a_reader_that_falls_behind_is_cut_off_and_resumes_exactly(client: Client) -> None:
    outbox = Outbox(client, FAST, feed=FeedLimits(max_behind=5))
    stream = outbox.watch(WS, SES, poll=0.05)
    got: list[QueueEvent] = []
    try:
        assert isinstance(await anext(stream), QueueReset)
        first = await accept(outbox, WS, SES, "c0")
        while not got:
            item = await anext(stream)
            if isinstance(item, QueueEvent):
                got.append(item)
        assert got[0].entry_id == first
        # The reader stops reading while 12 more events are logged: more than it may leave.
        rest = [await accept(outbox, WS, SES, f"c{n}") for n in range(1, 13)]
        await asyncio.sleep(0.3)
        with pytest.raises(FellBehind):  # after what was buffered: every cut-off moves it on
            async for item in stream:
                if isinstance(item, QueueEvent):
                    got.append(item)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    assert 1 < len(got) <= 1 + 5
    # It comes back with the last ID it got: exactly the rest, no reset. (The backlog is more
    # than max_behind: a resume reads it a buffer at a time and is not cut off for it.)
    resumed = await take(outbox, len(rest) + 1 - len(got), last=got[-1].event_id)
    assert all(isinstance(e, QueueEvent) for e in resumed)
    assert [e.entry_id for e in got + resumed if isinstance(e, QueueEvent)] == [first, *rest]


async def test_sse_ends_a_stream_that_fell_behind_cleanly_after_its_last_event() -> None:
    async def items() -> AsyncIterator[QueueEvent | QueueReset | None]:
        yield QueueEvent("5-0", "accepted", "e1", None)
        raise FellBehind("over 5 events unread")

    async def connected() -> bool:
        return False

    body = [
        c if isinstance(c, str) else c.decode()
        async for c in event_stream(None, items(), connected)
    ]
    # The last event, then the end (no error): EventSource reconnects with Last-Event-ID 5-0.
    *_, last, end = "".join(body).split("\n\n")
    assert last.startswith("id: 5-0\nevent: queue.update\n") and end == ""


async def test_a_killed_subscription_loses_no_event(outbox: Outbox, client: Client) -> None:
    watches = [Watch(outbox, f"ws{n}", SES) for n in range(6)]
    try:
        await eventually(lambda: holds(all(w.items for w in watches)))
        first = [await accept(outbox, f"ws{n}", SES, "c0") for n in range(6)]
        await eventually(lambda: holds([w.accepted() for w in watches] == [[i] for i in first]))
        await kill_subscriptions(client)
        # Logged while the subscriptions are down or being made again: the re-subscription's
        # look back finds them (well before the 30-second safety poll).
        then = [await accept(outbox, f"ws{n}", SES, "c1") for n in range(6)]
        want = [[a, b] for a, b in zip(first, then, strict=True)]
        await eventually(lambda: holds([w.accepted() for w in watches] == want), within=5.0)
    finally:
        for w in watches:
            await w.close()


@pytest.mark.timeout(60)
async def test_a_restarted_server_loses_no_event(tmp_path: Path, server_kind: str) -> None:
    if server_kind != "standalone":
        pytest.skip("a cluster node restart is a failover: the chaos suite's")
    server = EmbeddedValkey(tmp_path / "valkey")
    server.start()
    client = connect(server.url, socket_timeout=5)
    outbox = Outbox(client, FAST)
    watch = Watch(outbox, WS, SES)
    try:
        await eventually(lambda: holds(len(watch.items) == 1))
        first = await accept(outbox, WS, SES, "c0")
        await eventually(lambda: holds(watch.accepted() == [first]))
        await asyncio.to_thread(server.stop)
        await asyncio.to_thread(server.start)
        then = await accept(outbox, WS, SES, "c1")
        await eventually(lambda: holds(watch.accepted() == [first, then]), within=10.0)
    finally:
        await watch.close()
        await outbox.aclose()
        await client.aclose()
        server.stop()


@pytest.mark.timeout(120)
async def test_a_moved_slot_loses_no_event(valkey_cluster: LocalCluster) -> None:
    client = connect(valkey_cluster.url, socket_timeout=5)
    assert isinstance(client, ValkeyCluster)
    await client.flushall(target_nodes=ValkeyCluster.PRIMARIES)
    outbox = Outbox(client, dataclasses.replace(FAST, cap=100))
    ws, sessions = "moving-events", [f"s{n}" for n in range(4)]
    watches = [Watch(outbox, ws, ses) for ses in sessions]
    slot = client.keyslot(session_keys(ws, "s0").events)
    source = owner_of(valkey_cluster.ports, slot)
    target = next(p for p in valkey_cluster.ports if p != source)
    ids: dict[str, list[str]] = {ses: [] for ses in sessions}

    async def traffic(count: int) -> None:
        for _ in range(count):
            for ses in sessions:
                ids[ses].append(await accept(outbox, ws, ses, f"c{len(ids[ses])}"))
            await asyncio.sleep(0.01)

    try:
        await eventually(lambda: holds(all(w.items for w in watches)))
        mover = asyncio.to_thread(migrate_slot, valkey_cluster.ports, slot, target, 0.01)
        await asyncio.gather(traffic(30), mover)
        assert owner_of(valkey_cluster.ports, slot) == target
        await traffic(3)  # after the move: only the re-subscription on the new owner hears it
        want = [ids[ses] for ses in sessions]
        await eventually(lambda: holds([w.accepted() for w in watches] == want), within=10.0)
        # The sessions' channels followed their slot: the new owner serves a subscription.
        async with Valkey(host="127.0.0.1", port=target) as node:
            assert int((await node.info("clients"))["pubsub_clients"]) >= 1
        async with Valkey(host="127.0.0.1", port=source) as node:
            await eventually(lambda: _pubsub_clients(node, 0))
    finally:
        for w in watches:
            await w.close()
        await outbox.aclose()
        await client.aclose()


# -- the byte bounds (docs/security.md, finding 5) -------------------------------------------

KB = 1000
BIG = 40 * KB  # each edit logs the whole entry: an event of about this many bytes


async def edits(outbox: Outbox, ses: str, entry_id: str, count: int, start: int = 0) -> None:
    """``count`` edits of ``entry_id`` in ``ses``, each logging an event of about BIG bytes."""
    for n in range(start, start + count):
        result = await outbox.edit(WS, ses, entry_id, text=f"{n:04d}" + "x" * BIG)
        assert result is EditResult.UPDATED


def fell_behind(metrics: Metrics, bound: str) -> float | None:
    return metrics.registry.get_sample_value(
        "prompt_outbox_streams_fell_behind_total", {"bound": bound}
    )


async def drain(follower: Follower) -> tuple[list[Event], BaseException | None]:
    """What a reader that takes everything at once gets, until the follower is quiet or ends."""
    got: list[Event] = []
    try:
        while batch := await follower.next(0.2):
            got += batch
    except StreamEnded as exc:
        return got, exc
    return got, None


async def test_a_follower_is_cut_off_at_its_byte_bound_and_resumes_exactly(client: Client) -> None:
    # 30 events of ~40 KB: far under the event bound (1000), over 200 KB of bytes.
    limits = FeedLimits(max_behind_bytes=200 * KB)
    metrics = Metrics()
    feed = EventFeed(Store(client), limits, metrics)
    outbox = Outbox(client, ROOMY)
    entry = await outbox.accept(WS, SES, "u", "c0", "small")
    k = session_keys(WS, SES)
    follower = feed.follow(k, "0-0")
    try:
        await edits(outbox, SES, entry.id, 30)  # its reader takes nothing meanwhile
        await eventually(lambda: holds(follower.failure is not None))
        assert isinstance(follower.failure, FellBehind), follower.failure
        # It read up to its bound (one event past it at most), then stopped reading.
        assert limits.max_behind_bytes <= follower.buffered < limits.max_behind_bytes + 2 * BIG
        assert feed.buffered == follower.buffered
        assert fell_behind(metrics, "bytes") == 1
        got, ended = await drain(follower)  # what was buffered first: each cut-off moves it on
        assert isinstance(ended, FellBehind)
    finally:
        follower.close()
    assert feed.buffered == 0
    assert 2 < len(got) < 31
    # It comes back after the last event it got: exactly the rest, read a buffer at a time
    # (the backlog is over the bound, and is not counted against it).
    with feed.follow(k, got[-1][0]) as again:
        rest, ended = await drain(again)
    assert ended is None
    kinds = [fields["kind"] for _, fields in got + rest]
    assert kinds == ["accepted"] + ["edited"] * 30
    texts = [json.loads(fields["entry"])["text"][:4] for _, fields in got[1:] + rest]
    assert texts == [f"{n:04d}" for n in range(30)]


async def test_the_process_budget_sheds_the_readers_holding_most(client: Client) -> None:
    # Each of three idle readers stays under its own bound (1 MB), together over the budget.
    limits = FeedLimits(max_behind_bytes=1000 * KB, max_buffered_bytes=300 * KB)
    metrics = Metrics()
    feed = EventFeed(Store(client), limits, metrics)
    outbox = Outbox(client, ROOMY)
    idle = [f"idle{n}" for n in range(3)]
    ids = {ses: (await outbox.accept(WS, ses, "u", "c0", "small")).id for ses in [*idle, "fast"]}
    followers = {ses: feed.follow(session_keys(WS, ses), "0-0") for ses in idle}
    fast = feed.follow(session_keys(WS, "fast"), "0-0")
    fast_got: list[Event] = []

    async def read_fast() -> None:
        while True:
            fast_got.extend(await fast.next(QUIET))

    reader = asyncio.create_task(read_fast())
    try:
        for ses in idle:
            await edits(outbox, ses, ids[ses], 5)  # 200 KB each
            await edits(outbox, "fast", ids["fast"], 2, start=len(fast_got))
        await eventually(lambda: holds(len(fast_got) == 1 + 6))
        assert feed.buffered <= limits.max_buffered_bytes
        shed = [ses for ses in idle if followers[ses].failure is not None]
        assert shed, "the budget cut no follower"
        assert fell_behind(metrics, "process") == len(shed)
        for ses in shed:  # its buffer is freed at once: a reader that never takes holds nothing
            assert followers[ses].buffered == 0
            got, ended = await drain(followers[ses])
            assert (got, type(ended)) == ([], FellBehind)
            # ... and it resumes after the last event it took (none here): everything.
            with feed.follow(session_keys(WS, ses), "0-0") as again:
                rest, _ = await drain(again)
            assert [f["kind"] for _, f in rest] == ["accepted"] + ["edited"] * 5
        assert fast.failure is None  # the reader that keeps up is never the one cut
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        for f in [*followers.values(), fast]:
            f.close()
    assert feed.buffered == 0
    assert metrics.registry.get_sample_value("prompt_outbox_stream_buffer_bytes") == 0


async def test_a_reader_that_keeps_up_is_not_cut_by_the_byte_bound(client: Client) -> None:
    # 40 events of ~40 KB (1.6 MB) through a bound of 100 KB: a reader that takes each as it
    # comes never has more than the one in hand unread.
    feed = EventFeed(Store(client), FeedLimits(max_behind_bytes=100 * KB))
    outbox = Outbox(client, ROOMY)
    entry = await outbox.accept(WS, SES, "u", "c0", "small")
    got: list[Event] = []
    with feed.follow(session_keys(WS, SES), "0-0") as follower:

        async def read() -> None:
            while True:
                got.extend(await follower.next(QUIET))

        reader = asyncio.create_task(read())
        try:
            await edits(outbox, SES, entry.id, 40)
            await eventually(lambda: holds(len(got) == 41 or reader.done()))
            assert not reader.done(), reader.exception()
            assert follower.failure is None
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


def test_feed_limits_refuse_nonsense_byte_bounds() -> None:
    for bad in ({"max_behind_bytes": 0}, {"max_buffered_bytes": -1}, {"max_behind_bytes": 1.5}):
        with pytest.raises(ValueError, match=r"FeedLimits\.max_"):
            FeedLimits(**bad)  # type: ignore[arg-type]


async def test_a_watch_holds_no_copy_of_its_opening_queue(outbox: Outbox) -> None:
    """The snapshot a watch opens with is the whole queue (up to cap entries of 100 KB): once
    its reset is handed out, the watch keeps following without it."""
    for n in range(3):
        await outbox.accept(WS, SES, "u", f"c{n}", "x" * 10_000)
    stream = outbox.watch(WS, SES, poll=0.05)
    try:
        reset = await anext(stream)
        assert isinstance(reset, QueueReset) and len(reset.entries) == 3
        # Not while its reset is out either (a reader may take minutes to write it).
        assert not stream.ag_frame.f_locals["snaps"]  # type: ignore[attr-defined]
        assert await anext(stream) is None  # following now: quiet
        assert not stream.ag_frame.f_locals["snaps"]  # type: ignore[attr-defined]
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
