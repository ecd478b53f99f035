"""The group commit of OnDelivered records (delivery/forgets.py), against a real Valkey."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from prompt_outbox.core.keys import session_keys
from prompt_outbox.delivery.forgets import Forgets
from prompt_outbox.storage.client import Client
from prompt_outbox.storage.store import Store, notice_member

WS = "forgets-ws"


class CountingStore(Store):
    """A Store that counts its notified calls and what each carried."""

    def __init__(self, client: Client) -> None:
        super().__init__(client)
        self.calls: list[list[str]] = []

    async def notified(self, w, members):  # type: ignore[no-untyped-def]
        self.calls.append(list(members))
        await asyncio.sleep(0.02)  # a slow call: forgets that arrive meanwhile must group
        return await super().notified(w, members)


async def direct(what: str, call: Callable[[], Awaitable[bool]]) -> bool | None:
    return await call()


async def owe(client: Client, n: int) -> list[str]:
    w = session_keys(WS, "s0").workspace
    members = [notice_member(f"s{i}", f"e{i}") for i in range(n)]
    await client.hset(w.notices, mapping={m: "{}" for m in members})
    await client.zadd(w.notices_due, {m: 1000 for m in members})
    return members


async def test_forgets_that_arrive_while_a_call_is_out_share_the_next(client: Client) -> None:
    store = CountingStore(client)
    forgets = Forgets(store, direct)
    w = session_keys(WS, "s0").workspace
    members = await owe(client, 20)
    first = asyncio.create_task(forgets.forget(w, members[0]))
    await asyncio.sleep(0.005)  # its call is out
    await asyncio.gather(first, *(forgets.forget(w, m) for m in members[1:]))
    assert await client.hlen(w.notices) == 0 and await client.zcard(w.notices_due) == 0
    assert store.calls == [members[:1], members[1:]]


async def test_one_at_a_time_each_call_carries_one(client: Client) -> None:
    store = CountingStore(client)
    forgets = Forgets(store, direct)
    w = session_keys(WS, "s0").workspace
    members = await owe(client, 3)
    for m in members:
        await forgets.forget(w, m)
    assert store.calls == [[m] for m in members]


async def test_a_cancelled_drain_leaves_its_record_to_the_call(client: Client) -> None:
    store = CountingStore(client)
    forgets = Forgets(store, direct)
    w = session_keys(WS, "s0").workspace
    [member] = await owe(client, 1)
    waiter = asyncio.create_task(forgets.forget(w, member))
    await asyncio.sleep(0.005)  # the call is out
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await asyncio.sleep(0.05)
    assert await client.hlen(w.notices) == 0  # the call went on and landed


async def test_a_failed_call_fails_its_group_and_the_next_group_still_goes(
    client: Client,
) -> None:
    w = session_keys(WS, "s0").workspace
    members = await owe(client, 3)
    failed_once: list[bool] = []

    async def failing_first(what: str, call: Callable[[], Awaitable[bool]]) -> bool | None:
        if not failed_once:
            failed_once.append(True)
            await asyncio.sleep(0.02)
            raise RuntimeError("boom")
        return await call()

    forgets = Forgets(Store(client), failing_first)
    first = asyncio.create_task(forgets.forget(w, members[0]))
    await asyncio.sleep(0.005)  # its call is out
    rest = [forgets.forget(w, m) for m in members[1:]]
    results = await asyncio.gather(first, *rest, return_exceptions=True)
    assert isinstance(results[0], RuntimeError)
    assert results[1:] == [None, None]
    assert await client.hkeys(w.notices) == [members[0].encode()]  # the failed one stays owed
