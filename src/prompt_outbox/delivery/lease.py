"""The session lock as a lease: its value, how long it has been held, and the keeper that
renews it while a send, a verification or a sweep runs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime

from ..core.keys import SessionKeys
from ..core.timeutil import to_ms
from ..storage.store import TRANSIENT_ERRORS, Store

log = logging.getLogger("prompt_outbox.delivery")


def new_lock_value(now: datetime) -> str:
    """A fresh owner token. The acquisition time rides in it, so List can say how long the
    hold has lasted: ``<64 random bits in hex>:<ms>``."""
    return f"{secrets.token_hex(8)}:{to_ms(now)}"


def held_for(lock_value: str, pttl_ms: int, now: datetime, lock_ttl: float) -> float:
    """Seconds the lock has been held. A value without our ``:ms`` suffix (a foreign lock)
    falls back to the seed's estimate, ``lock_ttl`` minus the time left."""
    _, _, since = lock_value.rpartition(":")
    if since.isdigit():
        return max(0.0, (to_ms(now) - int(since)) / 1000)
    return max(0.0, lock_ttl - pttl_ms / 1000)


@contextlib.asynccontextmanager
async def kept(
    store: Store,
    k: SessionKeys,
    lockval: str,
    *,
    lease_ms: int,
    every: float,
    ceiling: float,
    now_ms: Callable[[], int],
) -> AsyncIterator[None]:
    """Renew the lease (to ``lease_ms``) every ``every`` seconds while the body runs, for at
    most ``ceiling`` seconds in all (``lock_ttl``: the hard bound on one hold).

    A timer, not a task per delivery: most deliveries end long before the first renewal,
    and then the lease costs one timer handle. A renewal that started runs to its end: it is
    never cancelled (valkey-py 6.2 can swallow a CancelledError that lands inside a command,
    and a keeper that missed its cancel went on renewing for lock_ttl, freezing the session:
    tests/test_lease.py); the exit waits for it, and no timer follows it."""
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    timer: asyncio.TimerHandle | None = None
    renewing: asyncio.Task[None] | None = None
    stopped = False

    def schedule() -> None:
        nonlocal timer
        if not stopped and time.monotonic() - started < ceiling:
            timer = loop.call_later(every, start_renewal)

    def start_renewal() -> None:
        nonlocal renewing
        renewing = asyncio.create_task(renew())

    async def renew() -> None:
        try:
            if not await store.renew(k, lockval, lease_ms, now_ms()):
                log.warning("lease lost mid-delivery", extra={"ws": k.ws, "ses": k.ses})
                return
        except TRANSIENT_ERRORS as exc:
            log.warning("lease renewal failed: %s", exc, extra={"ws": k.ws, "ses": k.ses})
        schedule()

    schedule()
    try:
        yield
    finally:
        stopped = True
        if timer is not None:
            timer.cancel()
        if renewing is not None:
            await asyncio.shield(renewing)  # at most one renew call to finish
