"""The memory ceiling (docs/security.md, finding 12): with a maxmemory, accepts stop at
``accept_memory_ratio`` of it (StorageFull, HTTP 503 storage_full), read from the node that owns
the workspace's slot, so that deliveries, which free room, still run below the point where Valkey
(noeviction) refuses every write. Real servers given a small maxmemory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from prompt_outbox import Duplicate, Outbox, StorageFull
from prompt_outbox.core.keys import SessionKeys
from prompt_outbox.storage.client import Client
from prompt_outbox.storage.memory import MemoryCeiling
from prompt_outbox.storage.topology import topology_of
from tests.agents import ScriptedAgent
from tests.support.api import ALICE, serve
from tests.support.clock import ManualClock
from tests.support.memory import memory, node_of, on_node
from tests.support.tunables import FAST

pytestmark = pytest.mark.cluster_too

WS = "acme"
TEXT = "x" * 50_000
# Read the memory at every accept (a test cannot wait for the 1 s default), and keep one
# event a session so that deliveries free what they move.
TUNABLES = replace(
    FAST,
    memory_check_interval=0.001,
    event_log_len=1,
    workspace_cap=100_000,
    workspace_budget_share=1.0,  # the ceiling, not the budget, is under test
)
ROOM = 2 * 1024 * 1024  # bytes between the memory in use now and the accept ceiling


@pytest.fixture
async def ceiling(client: Client) -> AsyncIterator[int]:
    """Give the workspace's node a maxmemory whose 0.8 is ROOM above what it uses now; the
    maxmemory, given back as it was after the test (the servers are shared). Now: once the
    scripts are loaded (a megabyte or more of Valkey's memory on a fresh server)."""
    node = node_of(client, WS)
    await Outbox(client, TUNABLES).check_durability()  # loads the scripts
    before = await memory(client, node)
    limit = int((before["used"] + ROOM) / TUNABLES.accept_memory_ratio)
    await on_node(client, node, "CONFIG", "SET", "maxmemory", str(limit))
    try:
        yield limit
    finally:
        await on_node(client, node, "CONFIG", "SET", "maxmemory", str(before["max"]))


async def fill(outbox: Outbox) -> list[tuple[str, str]]:
    """Accept 50 kB prompts over sessions of 10 until the ceiling refuses one: the accepted
    (session, cmid) pairs. The refused one wrote nothing."""
    accepted: list[tuple[str, str]] = []
    for i in range(200):
        ses, cmid = f"s{i // 10}", f"c{i}"
        try:
            await outbox.accept(WS, ses, "u", cmid, TEXT)
        except StorageFull as full:
            assert full.limit > 0 and full.used >= TUNABLES.accept_memory_ratio * full.limit
            assert cmid not in [e.client_message_id for e in await outbox.list(WS, ses)]
            return accepted
        accepted.append((ses, cmid))
    raise AssertionError("the ceiling never refused an accept")


async def test_accepts_stop_at_the_ceiling_while_deliveries_go_on_and_free_room(
    client: Client, clock: ManualClock, ceiling: int
) -> None:
    outbox = Outbox(client, TUNABLES, clock=clock)
    accepted = await fill(outbox)
    assert len(accepted) >= 10  # 2 MB of room held some 50 kB prompts first
    node = node_of(client, WS)
    assert (await memory(client, node))["used"] < ceiling  # headroom left below maxmemory
    with pytest.raises(StorageFull):
        await outbox.accept(WS, "new", "u", "n", "a small one is refused too")
    # A client's retry of a prompt that was accepted still learns its ID.
    ses, cmid = accepted[0]
    with pytest.raises(Duplicate):
        await outbox.accept(WS, ses, "u", cmid, TEXT)
    # Deliveries run at the ceiling, and free room for accepts again.
    agent = ScriptedAgent()
    for ses in sorted({ses for ses, _ in accepted}):
        while await outbox.deliver_once(WS, ses, agent):
            pass
    assert len(agent.calls) == len(accepted)
    await outbox.accept(WS, "new", "u", "n", TEXT)
    assert outbox.metrics.refused_storage_full._value.get() >= 2


async def test_the_ceiling_is_the_workspace_nodes_own(
    client: Client, clock: ManualClock, ceiling: int, server_kind: str
) -> None:
    # Another workspace on a node with room accepts (on a cluster; a standalone server is
    # one node, and refuses it too).
    outbox = Outbox(client, TUNABLES, clock=clock)
    await fill(outbox)
    if server_kind == "standalone":
        with pytest.raises(StorageFull):
            await outbox.accept("other", "s1", "u", "a", TEXT)
        return
    others = (f"w{i}" for i in range(1000))
    other = next(w for w in others if node_of(client, w).name != node_of(client, WS).name)
    await outbox.accept(other, "s1", "u", "a", TEXT)


async def test_the_api_answers_storage_full_503_with_retry_after(
    client: Client, clock: ManualClock, ceiling: int
) -> None:
    outbox = Outbox(client, TUNABLES, clock=clock)
    await fill(outbox)
    # A token's byte budget (a quarter of the memory by default) would come first here.
    async for http in serve(outbox, token_budget_share=1.0):
        body = {"clientMessageID": "api-1", "text": "hello"}
        r = await http.post("/v1/workspaces/acme/sessions/api/prompts", json=body, headers=ALICE)
        assert (r.status_code, r.json()["error"]) == (503, "storage_full")
        assert r.headers["Retry-After"] == "10"
        assert str(ceiling) not in r.text  # the server's figures stay the operator's


async def test_no_maxmemory_no_ceiling(client: Client, clock: ManualClock) -> None:
    node = node_of(client, WS)
    before = (await memory(client, node))["max"]
    await on_node(client, node, "CONFIG", "SET", "maxmemory", "0")
    try:
        outbox = Outbox(client, replace(TUNABLES, accept_memory_ratio=0.001), clock=clock)
        await outbox.accept(WS, "s1", "u", "a", TEXT)
    finally:
        await on_node(client, node, "CONFIG", "SET", "maxmemory", str(before))


async def info_calls(client: Client, node: Any) -> int:
    raw = await on_node(client, node, "INFO", "commandstats")
    stats = raw if "cmdstat_info" in raw or "cmdstat_ping" in raw else next(iter(raw.values()))
    return int(stats.get("cmdstat_info", {}).get("calls", 0))


async def test_the_reading_is_cached_per_node_for_its_interval(client: Client) -> None:
    # No round trip per accept: one INFO per node per interval, however many accepts ask.
    now = [100.0]
    gauge = MemoryCeiling(topology_of(client), 0.8, 1.0, clock=lambda: now[0])
    k = SessionKeys(WS, "s1")
    node = node_of(client, WS)
    before = await info_calls(client, node)
    for _ in range(50):
        assert await gauge.over(k) is None
    now[0] += 0.999
    assert await gauge.over(k) is None
    first = await info_calls(client, node)
    now[0] += 0.001
    for _ in range(50):
        await gauge.over(k)
    second = await info_calls(client, node)
    # Each info_calls is an INFO too (counted by the next one): the gauge read once, then once.
    assert (first - before, second - first) == (2, 2)


async def test_the_first_reading_is_taken_before_the_first_accept(
    client: Client, clock: ManualClock
) -> None:
    # check_durability reads every primary, so the first accepts send no INFO of their own.
    outbox = Outbox(client, replace(TUNABLES, memory_check_interval=3600.0), clock=clock)
    await outbox.check_durability()
    node = node_of(client, WS)
    before = await info_calls(client, node)
    for i in range(20):
        await outbox.accept(WS, "s1", "u", f"c{i}", "hello")
    assert await info_calls(client, node) - before == 1  # info_calls' own INFO


async def test_edits_stop_at_the_ceiling_too(
    client: Client, clock: ManualClock, ceiling: int
) -> None:
    # An edit logs the whole entry again: under no bound, one tenant's edits filled Valkey
    # past every other tenant's accepts (docs/security.md: edits were unmetered).
    outbox = Outbox(client, TUNABLES, clock=clock)
    await outbox.accept(WS, "edited", "u", "first", "short")
    [entry] = await outbox.list(WS, "edited")
    # Well past the ceiling (used at 0.9 of maxmemory) and below Valkey's own refusal: no
    # byte freed meanwhile can bring it back under (the fixture gives the maxmemory back).
    node = node_of(client, WS)
    used = (await memory(client, node))["used"]
    await on_node(client, node, "CONFIG", "SET", "maxmemory", str(int(used / 0.9)))
    with pytest.raises(StorageFull):
        await outbox.edit(WS, "edited", entry.id, text=TEXT)
    [same] = await outbox.list(WS, "edited")
    assert same.text == "short"  # nothing written
    async for http in serve(outbox):
        url = f"/v1/workspaces/acme/sessions/edited/prompts/{entry.id}"
        r = await http.patch(url, json={"text": "another"}, headers=ALICE)
        assert (r.status_code, r.json()["error"]) == (503, "storage_full"), r.text


async def test_valkey_refusing_a_write_for_memory_is_503_not_500(
    client: Client, clock: ManualClock
) -> None:
    # Past maxmemory (noeviction) Valkey itself refuses the write, whatever our ceiling said.
    node = node_of(client, WS)
    before = await memory(client, node)
    blind = replace(TUNABLES, memory_check_interval=3600.0)  # read once, before the change
    outbox = Outbox(client, blind, clock=clock)
    await outbox.check_durability()  # takes the reading: no maxmemory, no ceiling
    await on_node(client, node, "CONFIG", "SET", "maxmemory", str(before["used"] // 2))
    try:
        async for http in serve(outbox):
            body = {"clientMessageID": "oom-1", "text": "hello"}
            url = "/v1/workspaces/acme/sessions/oom/prompts"
            r = await http.post(url, json=body, headers=ALICE)
    finally:
        await on_node(client, node, "CONFIG", "SET", "maxmemory", str(before["max"]))
    assert (r.status_code, r.json()["error"]) == (503, "storage_full"), r.text
    assert await outbox.list(WS, "oom") == []
