"""A busy workspace's slot moves to another primary while prompts are accepted and delivered.

The client follows MOVED / ASK; a script that meets the slot half moved (TRYAGAIN) is retried.
Nothing is lost, nothing is delivered twice, per-session order holds, and OnDelivered is made
once per entry."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from valkey.asyncio.cluster import ValkeyCluster

from prompt_outbox import Duplicate, Entry, Outbox, OutboxFull, Verdict
from prompt_outbox.storage.connect import connect
from prompt_outbox.storage.store import TRANSIENT_ERRORS
from tests.agents import HookLog
from tests.cluster import LocalCluster, migrate_slot, owner_of
from tests.support.tunables import FAST
from tests.support.waiting import eventually, holds

WS = "moving"
SESSIONS = 6
PER_SESSION = 25


@pytest.mark.timeout(180)
async def test_a_slot_moves_mid_delivery_and_nothing_is_lost_twice_or_reordered(
    valkey_cluster: LocalCluster,
) -> None:
    client = connect(valkey_cluster.url, socket_timeout=5)
    assert isinstance(client, ValkeyCluster)
    await client.flushall(target_nodes=ValkeyCluster.PRIMARIES)
    outbox = Outbox(client, FAST)
    seen: Counter[str] = Counter()
    order: dict[str, list[str]] = {}

    async def deliver(ws: str, ses: str, entry: Entry) -> None:
        await asyncio.sleep(0.005)  # a short turn: deliveries overlap the migration
        if not seen[entry.id]:
            order.setdefault(ses, []).append(entry.id)
        seen[entry.id] += 1

    async def verify(ws: str, ses: str, entry: Entry) -> Verdict:
        return Verdict.DELIVERED if seen[entry.id] else Verdict.ABSENT

    hooks = HookLog()
    outbox.set_verifier(verify)
    outbox.set_on_delivered(hooks)
    accepted: dict[str, list[str]] = {}

    async def client_of(ses: str) -> None:
        for i in range(PER_SESSION):
            while True:  # a careful client: no answer or full -> the same cmid again
                try:
                    entry = await outbox.accept(WS, ses, "u", f"{ses}-{i}", f"{i}")
                    accepted.setdefault(ses, []).append(entry.id)
                    break
                except Duplicate as dup:
                    accepted.setdefault(ses, []).append(dup.accepted_id)
                    break
                except (OutboxFull, *TRANSIENT_ERRORS):
                    await asyncio.sleep(0.02)
            await asyncio.sleep(0.01)

    slot = client.keyslot(f"outboxq:{{{WS}}}:{{s0}}")
    source = owner_of(valkey_cluster.ports, slot)
    target = next(p for p in valkey_cluster.ports if p != source)
    try:
        async with outbox.running(deliver, tick=0.05):
            clients = asyncio.gather(*(client_of(f"s{n}") for n in range(SESSIONS)))
            # Traffic first, then the move under it: a first accept waits for the durability
            # check (a probe and the script loads on every primary), longer than a fixed
            # pause on a busy machine, and a slot with no keys yet moves nothing.
            await eventually(lambda: holds(len(accepted) == SESSIONS), within=30)
            moved = await asyncio.to_thread(migrate_slot, valkey_cluster.ports, slot, target, 0.01)
            await clients
            total = SESSIONS * PER_SESSION
            await eventually(lambda: holds(len(hooks.ids) >= total), within=60)
        assert moved > 0
        assert owner_of(valkey_cluster.ports, slot) == target
        ids = [i for per in accepted.values() for i in per]
        assert len(set(ids)) == total
        assert [i for i in ids if seen[i] != 1] == []  # none lost, none run twice
        assert {ses: order.get(ses) for ses in accepted} == accepted  # order per session
        assert sorted(hooks.ids) == sorted(ids)  # OnDelivered once each
        assert all([await outbox.list(WS, f"s{n}") == [] for n in range(SESSIONS)])
    finally:
        await client.aclose()
