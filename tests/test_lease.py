"""The lease keeper stops when its delivery ends, however the end lands.

Regression (found by the chaos suite's worker-kill run): the keeper was stopped by cancelling
it, and valkey-py 6.2 sometimes swallows a CancelledError that lands inside a command. The
keeper then went on renewing until lock_ttl (over two minutes): its session froze for every
worker, and the step waiting for the keeper froze with it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time

import valkey.asyncio as valkey_async

from prompt_outbox import Outbox
from prompt_outbox.keys import session_keys
from prompt_outbox.outbox import _lock_value
from tests.conftest import FAST


async def test_the_lease_keeper_always_stops_promptly(client: valkey_async.Valkey) -> None:
    # A lease renewed every 10 ms keeps a renew command in flight much of the time, so the
    # end of the body often lands inside one.
    tunables = dataclasses.replace(FAST, lease_ttl=0.03, delivery_timeout=60.0)
    outbox = Outbox(client, tunables)
    k = session_keys("ws", "s1")
    rng = random.Random(7)
    worst = 0.0
    for _ in range(300):
        lockval = _lock_value(outbox._clock())
        assert await outbox._store.lock(k, lockval, 30_000, outbox._now_ms())
        lease = outbox._lease(k, lockval)
        await lease.__aenter__()
        await asyncio.sleep(rng.uniform(0, 0.03))
        started = time.monotonic()
        async with asyncio.timeout(5):
            await lease.__aexit__(None, None, None)
        worst = max(worst, time.monotonic() - started)
        assert await outbox._store.release(k, lockval, outbox._now_ms())  # still ours, released
    assert worst < 1.0, worst
