"""The session lock as a lease: its value, how long it has been held, and the keeper that
renews it while a send, a verification or a sweep runs."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from ..core.entry import Entry, Status, decode_entry
from ..core.keys import SessionKeys
from ..core.timeutil import to_ms
from ..core.turns import decode_turn
from ..storage.replies import Snapshot
from ..storage.store import TRANSIENT_ERRORS, Store

log = logging.getLogger("prompt_outbox.delivery")


def new_lock_value(now: datetime) -> str:
    """A fresh owner token. The acquisition time rides in it, so List can say how long the
    hold has lasted: ``<64 random bits in hex>:<ms>``."""
    return f"{secrets.token_hex(8)}:{to_ms(now)}"


def held_for(lock_value: str, pttl_ms: int, now: datetime, lock_ttl: float) -> float:
    """Seconds the lock has been held. A value without our ``:ms`` suffix (a foreign lock)
    falls back to the contract's estimate, ``lock_ttl`` minus the time left (docs/contract.md)."""
    _, _, since = lock_value.rpartition(":")
    if since.isdigit():
        return max(0.0, (to_ms(now) - int(since)) / 1000)
    return max(0.0, lock_ttl - pttl_ms / 1000)


def hold_times(
    lock_value: str, pttl_ms: int, now: datetime, lock_ttl: float
) -> tuple[float, float | None, str]:
    """A held lock's seconds held, seconds in turn (None for a delivery's lock), and why the
    turn is still held ('' unless a check could not settle it): List's and the overview's."""
    turn = decode_turn(lock_value)
    if turn is not None:
        lasted = turn.seconds(to_ms(now))
        return lasted, lasted, turn.why
    return held_for(lock_value, pttl_ms, now, lock_ttl), None, ""


def listed(snap: Snapshot, now: datetime, lock_ttl: float) -> list[Entry]:
    """``Outbox.list``'s entries: while the session is held (a delivery's lock, or a turn),
    pending entries carry ``blocked_by_in_flight`` and ``in_flight_for`` (seconds the hold has
    lasted), and in turn also ``in_turn_for`` (and ``turn_why``, when a check could not settle
    it): "sending..." or "the agent is working" versus "frozen"."""
    entries = [decode_entry(raw) for raw in (*snap.staging, *snap.queue)]
    lock_value = snap.lock_value
    if not lock_value:
        return entries
    held, in_turn, why = hold_times(lock_value, snap.lock_pttl_ms, now, lock_ttl)
    turn_for = in_turn or 0.0
    return [
        replace(
            e, blocked_by_in_flight=True, in_flight_for=held, in_turn_for=turn_for, turn_why=why
        )
        if e.status is Status.PENDING
        else e
        for e in entries
    ]


class Kept:
    """Renew the lease (to ``lease_ms``) every ``every`` seconds while the body runs, for at
    most ``ceiling`` seconds in all (``lock_ttl``: the hard bound on one hold).

    A timer, not a task per delivery: most deliveries end long before the first renewal,
    and then the lease costs one timer handle. (A class, not a generator context manager:
    this runs once per delivery, and the generator's machinery cost as much as the timer.)
    A renewal that started runs to its end: it is never cancelled (valkey-py 6.2 can swallow
    a CancelledError that lands inside a command, and a keeper that missed its cancel went on
    renewing for lock_ttl, freezing the session: tests/test_lease.py); the exit waits for
    it, and no timer follows it."""

    __slots__ = (
        "_ceiling",
        "_every",
        "_k",
        "_lease_ms",
        "_lockval",
        "_now_ms",
        "_renewing",
        "_started",
        "_stopped",
        "_store",
        "_timer",
    )

    def __init__(
        self,
        store: Store,
        k: SessionKeys,
        lockval: str,
        *,
        lease_ms: int,
        every: float,
        ceiling: float,
        now_ms: Callable[[], int],
    ) -> None:
        self._store, self._k, self._lockval = store, k, lockval
        self._lease_ms, self._every, self._ceiling, self._now_ms = lease_ms, every, ceiling, now_ms
        self._started = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._renewing: asyncio.Task[None] | None = None
        self._stopped = False

    async def __aenter__(self) -> None:
        self._started = time.monotonic()
        self._schedule()

    async def __aexit__(self, *exc: object) -> None:
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
        if self._renewing is not None:
            await asyncio.shield(self._renewing)  # at most one renew call to finish

    def _schedule(self) -> None:
        if not self._stopped and time.monotonic() - self._started < self._ceiling:
            self._timer = asyncio.get_running_loop().call_later(self._every, self._start_renewal)

    def _start_renewal(self) -> None:
        self._renewing = asyncio.create_task(self._renew())

    async def _renew(self) -> None:
        k = self._k
        try:
            if not await self._store.renew(k, self._lockval, self._lease_ms, self._now_ms()):
                log.warning("lease lost mid-delivery", extra={"workspace": k.ws, "session": k.ses})
                return
        except TRANSIENT_ERRORS as exc:
            log.warning(
                "lease renewal failed: %s", exc, extra={"workspace": k.ws, "session": k.ses}
            )
        self._schedule()
