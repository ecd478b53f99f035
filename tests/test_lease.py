"""The lease keeper stops when its delivery ends, however the end lands.

Regression (found by the chaos suite's worker-kill run): the keeper was stopped by cancelling
it, and valkey-py 6.2 sometimes swallows a CancelledError that lands inside a command. The
keeper then went on renewing until lock_ttl (over two minutes): its session froze for every
worker, and the step waiting for the keeper froze with it.

The checks do not depend on how the scheduler runs us: the keeper renews every 5 ms (so the
body's end often lands inside a renew command) but to a 30 s lease (so no stall of this
machine can let it lapse), and "stopped" is read from Valkey itself: once the lease context
has exited, the lock's expiry never moves forward again.
"""

from __future__ import annotations

import asyncio
import random

import valkey.asyncio as valkey_async

from prompt_outbox.core.keys import session_keys
from prompt_outbox.core.timeutil import to_ms, utcnow
from prompt_outbox.delivery.lease import Kept, new_lock_value
from prompt_outbox.storage.store import Store
from tests.support.waiting import eventually

LEASE_MS = 30_000
EVERY = 0.005


def now_ms() -> int:
    return to_ms(utcnow())


async def test_the_lease_keeper_always_stops_when_its_body_ends(
    client: valkey_async.Valkey,
) -> None:
    store = Store(client)
    k = session_keys("ws", "s1")
    rng = random.Random(7)
    for _ in range(200):
        lockval = new_lock_value(utcnow())
        assert await store.lock(k, lockval, LEASE_MS, now_ms())
        lease = Kept(store, k, lockval, lease_ms=LEASE_MS, every=EVERY, ceiling=60.0, now_ms=now_ms)
        await lease.__aenter__()
        await asyncio.sleep(rng.uniform(0, 4 * EVERY))
        # The bug froze here for lock_ttl; the bound only turns a hang into a failure.
        async with asyncio.timeout(10):
            await lease.__aexit__(None, None, None)
        expiry = await client.pexpiretime(k.lock)
        await asyncio.sleep(3 * EVERY)  # a keeper still running would renew in this time
        assert await client.pexpiretime(k.lock) == expiry, "renewed after the body ended"
        assert await store.release(k, lockval, now_ms())  # still ours all along


async def test_the_lease_keeper_renews_while_the_body_runs(client: valkey_async.Valkey) -> None:
    store = Store(client)
    k = session_keys("ws", "s1")
    lockval = new_lock_value(utcnow())
    assert await store.lock(k, lockval, LEASE_MS, now_ms())
    first = await client.pexpiretime(k.lock)
    async with Kept(store, k, lockval, lease_ms=LEASE_MS, every=EVERY, ceiling=60.0, now_ms=now_ms):

        async def renewed() -> bool:
            return int(await client.pexpiretime(k.lock)) > first

        await eventually(renewed)
    assert await store.release(k, lockval, now_ms())
