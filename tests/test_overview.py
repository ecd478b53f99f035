"""The overview the queue page starts from: workspaces and a workspace's sessions with their
counts, paged. Against a real Valkey (and the cluster): every workspace once across the pages, the
counts and waits of each status, busiest first, bad cursors refused, and a page's cost independent
of the number of workspaces."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from valkey.asyncio.cluster import ValkeyCluster

from prompt_outbox import Entry, InvalidInput, Outbox, Turn
from prompt_outbox.storage.client import Client
from tests.support.clock import ManualClock
from tests.support.entries import error_entry
from tests.support.tunables import FAST

pytestmark = pytest.mark.cluster_too

STATUSES = ("pending", "delivering", "verifying", "error", "parked")


async def test_pages_walk_every_workspace_once(outbox: Outbox) -> None:
    names = {f"ws-{i:02d}" for i in range(37)}
    await asyncio.gather(*(outbox.accept(ws, "s", "u", "c", "hi") for ws in names))
    seen: list[str] = []
    cursor, pages = "", 0
    while True:
        page = await outbox.overview.workspaces(cursor, 5)
        assert len(page.items) <= 5
        seen.extend(w.id for w in page.items)
        pages += 1
        if not page.next:
            break
        cursor = page.next
    assert sorted(seen) == sorted(names)  # each once: no loss, no repeat
    assert pages >= 8
    one = (await outbox.overview.workspaces("", 200)).items
    assert {w.id for w in one} == names
    assert all(w.counts.by_status["pending"] == 1 and w.sessions == 1 for w in one)


async def test_a_tokens_own_workspaces_are_paged_in_order(outbox: Outbox) -> None:
    await outbox.accept("b", "s", "u", "c", "hi")
    page = await outbox.overview.workspaces("", 2, only=["c", "b", "a"])
    assert [w.id for w in page.items] == ["a", "b"] and page.next == "0:0:2"
    assert [w.counts.entries for w in page.items] == [0, 1]
    rest = await outbox.overview.workspaces(page.next, 2, only=["c", "b", "a"])
    assert [w.id for w in rest.items] == ["c"] and rest.next == ""


async def test_counts_waits_and_busiest_first(client: Client) -> None:
    clock = ManualClock()
    outbox = Outbox(client, FAST, clock=clock)
    for i in range(3):  # s-busy: three pending, the oldest accepted first
        await outbox.accept("acme", "s-busy", "u", f"b{i}", f"busy {i}")
        clock.advance(1.0)
    await outbox.accept("acme", "s-one", "u", "o1", "one")
    await outbox.seed_entry_for_test("acme", "s-error", error_entry("e1"))
    clock.advance(10.0)
    page = await outbox.overview.sessions("acme", "", 10)
    assert [s.id for s in page.items] == ["s-busy", "s-error", "s-one"] and page.next == ""
    busy = page.items[0]
    assert busy.counts.by_status == {**dict.fromkeys(STATUSES, 0), "pending": 3}
    assert busy.counts.oldest_pending_for == pytest.approx(13.0)
    assert busy.delivering_for is None and busy.blocked_for is None
    assert page.items[1].counts.by_status["error"] == 1
    assert page.items[1].counts.oldest_pending_for is None
    [acme] = (await outbox.overview.workspaces("", 10, only=["acme"])).items
    assert acme.sessions == 3 and acme.counts.entries == 5
    assert acme.counts.by_status == {**dict.fromkeys(STATUSES, 0), "pending": 4, "error": 1}
    assert acme.counts.oldest_pending_for == pytest.approx(13.0)
    # Paged busiest first.
    first = await outbox.overview.sessions("acme", "", 2)
    assert [s.id for s in first.items] == ["s-busy", "s-error"] and first.next == "2"
    assert [s.id for s in (await outbox.overview.sessions("acme", "2", 2)).items] == ["s-one"]


async def test_a_delivery_in_flight_shows_how_long_it_and_the_blocked_have_waited(
    outbox: Outbox,
) -> None:
    release, sending = asyncio.Event(), asyncio.Event()

    async def held(ws: str, ses: str, entry: Entry) -> None:
        sending.set()
        await release.wait()

    await outbox.accept("acme", "s", "u", "c1", "first")
    await outbox.accept("acme", "s", "u", "c2", "second")
    delivery = asyncio.create_task(outbox.deliver_once("acme", "s", held))
    await asyncio.wait_for(sending.wait(), 5)
    await asyncio.sleep(0.2)
    [s] = (await outbox.overview.sessions("acme")).items
    assert s.counts.by_status["delivering"] == 1 and s.counts.by_status["pending"] == 1
    assert s.delivering_for is not None and 0.1 < s.delivering_for < 30
    assert s.blocked_for is not None and 0.1 < s.blocked_for < 30
    release.set()
    await delivery
    [s] = (await outbox.overview.sessions("acme")).items
    assert s.delivering_for is None and s.counts.entries == 1


async def test_a_session_in_turn_shows_how_long_its_turn_and_the_blocked_have_lasted(
    client: Client,
) -> None:
    # The agent works on a delivered prompt (a turn): the session's lock holds the turn, not
    # a delivery's token, so "blocked for" is the turn's age, not the lock's (it read 0 s).
    clock = ManualClock()
    outbox = Outbox(client, FAST, clock=clock)

    async def turned(ws: str, ses: str, entry: Entry) -> Turn:
        return Turn("t-1")

    await outbox.accept("acme", "s", "u", "c1", "first")
    await outbox.accept("acme", "s", "u", "c2", "second")
    assert await outbox.deliver_once("acme", "s", turned)
    clock.advance(130.0)
    [s] = (await outbox.overview.sessions("acme")).items
    assert s.counts.by_status["pending"] == 1 and s.delivering_for is None
    assert s.blocked_for == pytest.approx(130.0, abs=0.01)
    assert s.in_turn_for == pytest.approx(130.0, abs=0.01)
    assert (await outbox.end_turn("acme", "s", "t-1")).ended
    [s] = (await outbox.overview.sessions("acme")).items
    assert s.in_turn_for is None


@pytest.mark.parametrize(
    "cursor",
    ["x", "1:2", "9:0:0", "1:2:3:4", "-1:0:0", f"0:{2**64}:0", "0:1" + "0" * 20 + ":0", "3775"],
)
async def test_a_bad_workspace_cursor_is_invalid_input(outbox: Outbox, cursor: str) -> None:
    with pytest.raises(InvalidInput):
        await outbox.overview.workspaces(cursor, 10)


async def test_bad_limits_and_session_cursors_are_invalid_input(outbox: Outbox) -> None:
    for limit in (0, 201):
        with pytest.raises(InvalidInput):
            await outbox.overview.workspaces("", limit)
        with pytest.raises(InvalidInput):
            await outbox.overview.sessions("acme", "", limit)
    with pytest.raises(InvalidInput):
        await outbox.overview.sessions("acme", "a:b")
    with pytest.raises(InvalidInput):
        await outbox.overview.workspaces("", 5, only=["bad id!"])


async def _commands(client: Client) -> dict[str, int]:
    stats: dict[str, Any] = await client.info("commandstats")
    return {k: int(v["calls"]) for k, v in stats.items() if "config" not in k and "info" not in k}


async def test_a_pages_cost_does_not_grow_with_the_number_of_workspaces(
    outbox: Outbox, client: Client
) -> None:
    if isinstance(client, ValkeyCluster):
        pytest.skip("counted on one server's INFO commandstats")
    cost: dict[int, dict[str, int]] = {}
    made = 0
    for total in (20, 2000):
        names = [f"w{i}" for i in range(made, total)]
        made = total
        for i in range(0, len(names), 200):
            batch = names[i : i + 200]
            await asyncio.gather(*(outbox.accept(ws, "s", "u", "c", "x") for ws in batch))
        await client.config_resetstat()
        page = await outbox.overview.workspaces("", 10)
        assert len(page.items) == 10
        cost[total] = await _commands(client)
    # A page of 10 reads its 10 workspaces and a few HSCAN batches, never the whole
    # registry (HGETALL / HKEYS would read all 2 000 in as few commands).
    assert sum(cost[2000].values()) <= sum(cost[20].values()) + 10, cost
    assert cost[2000]["cmdstat_hscan"] <= 3, cost
    assert not {"cmdstat_hgetall", "cmdstat_hkeys", "cmdstat_hvals"} & cost[2000].keys(), cost


async def test_the_routes_page_and_show_each_token_its_own(outbox: Outbox) -> None:
    from tests.support.api import ALICE, OPS, serve

    for ws in ("acme", "other", "third"):
        await outbox.accept(ws, "s1", "u", "c1", "hi")
    await outbox.accept("acme", "s2", "u", "c1", "hi")
    await outbox.accept("acme", "s2", "u", "c2", "again")
    async for http in serve(outbox):
        assert (await http.get("/v1/workspaces")).status_code == 401
        mine = (await http.get("/v1/workspaces", headers=ALICE)).json()
        assert [w["id"] for w in mine["workspaces"]] == ["acme"] and mine["next"] is None
        [acme] = mine["workspaces"]
        assert (acme["sessions"], acme["entries"], acme["counts"]["pending"]) == (2, 3, 3)
        assert acme["oldestPendingFor"] >= 0
        every, cursor = [], ""
        while True:  # the admin sees every workspace holding work, a page at a time
            page = await http.get(
                "/v1/workspaces", params={"limit": 2, "cursor": cursor}, headers=OPS
            )
            assert page.status_code == 200, page.text
            every += [w["id"] for w in page.json()["workspaces"]]
            if page.json()["next"] is None:
                break
            cursor = page.json()["next"]
        assert sorted(every) == ["acme", "other", "third"]
        sessions = (await http.get("/v1/workspaces/acme/sessions", headers=ALICE)).json()
        assert [s["id"] for s in sessions["sessions"]] == ["s2", "s1"]  # busiest first
        assert sessions["sessions"][0]["deliveringFor"] is None
        assert sessions["sessions"][0]["blockedFor"] is None
        assert sessions["sessions"][0]["inTurnFor"] is None
        other = await http.get("/v1/workspaces/other/sessions", headers=ALICE)
        assert (other.status_code, other.json()["error"]) == (403, "forbidden")
        # A cursor off the declared form is refused by the schema, before the library.
        bad = await http.get("/v1/workspaces", params={"cursor": "9:0:0"}, headers=OPS)
        assert (bad.status_code, bad.json()["error"]) == (422, "invalid_request")
        big = await http.get("/v1/workspaces", params={"limit": 500}, headers=OPS)
        assert (big.status_code, big.json()["error"]) == (422, "invalid_request")


BIG = "\x01" * 100_000  # 100 kB of text: ~600 kB of JSON once escaped, the largest entry


async def _fill(outbox: Outbox, ws: str, text: str) -> Callable[[], Awaitable[None]]:
    """Four sessions of three entries, the first of each in flight (staged, its lock held:
    the agent has not answered), so every kind of read a page makes has something to read.
    Returns what lets the deliveries end."""
    hold, sending = asyncio.Event(), asyncio.Event()
    sent: list[str] = []

    async def stuck(ws: str, ses: str, entry: Entry) -> None:
        sent.append(ses)
        if len(sent) == 4:
            sending.set()
        await hold.wait()

    for s in range(4):
        for i in range(3):
            await outbox.accept(ws, f"s{s}", "u", f"c{i}", text)
    deliveries = [asyncio.create_task(outbox.deliver_once(ws, f"s{s}", stuck)) for s in range(4)]
    await asyncio.wait_for(sending.wait(), 30)

    async def end() -> None:
        hold.set()
        await asyncio.gather(*deliveries)

    return end


async def _read(client: Client, page: Any) -> tuple[dict[str, int], int]:
    """The commands one call made, and the bytes the server sent for it."""
    await client.config_resetstat()
    before = int((await client.info("stats"))["total_net_output_bytes"])
    await page
    after = int((await client.info("stats"))["total_net_output_bytes"])
    return await _commands(client), after - before


async def test_a_pages_reads_do_not_grow_with_the_bytes_held(
    outbox: Outbox, client: Client
) -> None:
    # docs/security.md: one page read every entry of a workspace (102 MB held: serve 78 ->
    # 272 MB for a 177-byte answer). Now a page reads what the scripts keep: its commands and
    # the bytes Valkey sends are the same for 12 entries of a few bytes as of ~600 kB each.
    if isinstance(client, ValkeyCluster):
        pytest.skip("counted on one server's INFO commandstats and stats")
    ends = [await _fill(outbox, "small", "x"), await _fill(outbox, "big", BIG)]
    cost = {}
    for ws in ("small", "big"):
        cost[ws, "workspaces"] = await _read(client, outbox.overview.workspaces("", 10, only=[ws]))
        cost[ws, "sessions"] = await _read(client, outbox.overview.sessions(ws))
        cost[ws, "metrics"] = await _read(client, outbox.count_by_status())
    for kind in ("workspaces", "sessions", "metrics"):
        (small, small_bytes), (big, big_bytes) = cost["small", kind], cost["big", kind]
        assert big == small, (kind, cost)  # the same commands, as many
        assert not {"cmdstat_lrange", "cmdstat_lindex"} & big.keys(), (kind, big)
        assert big_bytes <= small_bytes + 64, (kind, cost)  # 600 kB an entry: none sent
    [page] = (await outbox.overview.workspaces("", 10, only=["big"])).items
    assert page.counts.by_status == {**dict.fromkeys(STATUSES, 0), "pending": 8, "delivering": 4}
    for end in ends:
        await end()


async def test_the_counts_read_no_entry(outbox: Outbox, client: Client) -> None:
    # Likewise /metrics (no token) and `stats` read every entry of every workspace.
    end = await _fill(outbox, "big", BIG)
    await outbox.accept("other", "s", "u", "c", "x")
    assert await outbox.count_by_workspace() == {
        "big": {"pending": 8, "delivering": 4},
        "other": {"pending": 1},
    }
    assert await outbox.count_by_status() == {"pending": 9, "delivering": 4}
    if not isinstance(client, ValkeyCluster):  # counted on one server's INFO commandstats
        commands, sent = await _read(client, outbox.count_by_status())
        assert "cmdstat_lrange" not in commands and "cmdstat_smembers" not in commands, commands
        assert sent < 8_000, sent  # a few fields a workspace, against ~7 MB of entries
    await end()
