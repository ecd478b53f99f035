"""Forgetting the OnDelivered calls that have run, by group commit.

A claim records the OnDelivered call it owes; once the hook has run, the record is forgotten,
by the drain's next stage or, at a drain's end, by a call of its own. Under load many drains
of a workspace end together: the records of every drain that ends while that workspace's
previous call is out go together in the next one (notified.lua takes many), as a database
commits a group of transactions with one fsync. A drain's end waits for the call that carried
its record, so nothing is forgotten later than before; with one drain ending at a time, each
call carries one record, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ..core.keys import WorkspaceKeys
from ..storage.store import Store
from .tasks import Detached

Bookkeep = Callable[[str, Callable[[], Awaitable[bool]]], Awaitable[bool | None]]
"""How a post-delivery write is made: retried through a short outage (``Engine._bookkeep``)."""


@dataclass
class _Group:
    w: WorkspaceKeys
    members: list[str] = field(default_factory=list)
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Forgets:
    """One workspace's forgets in flight at a time; those that arrive meanwhile wait, grouped."""

    def __init__(self, store: Store, bookkeep: Bookkeep) -> None:
        self._store = store
        self._bookkeep = bookkeep
        self._waiting: dict[str, _Group] = {}  # ws -> the group its next call carries
        self._calling: set[str] = set()  # workspaces with a call out
        self._tasks = Detached()

    async def forget(self, w: WorkspaceKeys, member: str) -> None:
        """Forget one record (``notice_member``); returns once the call that carried it has
        landed or been given up (then the record stays, and its hook is made again later)."""
        group = self._waiting.get(w.ws)
        if group is None:
            group = self._waiting[w.ws] = _Group(w)
        group.members.append(member)
        if w.ws not in self._calling:
            self._calling.add(w.ws)
            self._tasks.start(self._call(w.ws))
        await asyncio.shield(group.done)  # a cancelled drain leaves the call to finish

    async def _call(self, ws: str) -> None:
        try:
            while (group := self._waiting.pop(ws, None)) is not None:
                try:
                    await self._bookkeep("notified", self._notified(group))
                except asyncio.CancelledError:
                    group.done.cancel()
                    raise
                except Exception as exc:
                    group.done.set_exception(exc)
                else:
                    group.done.set_result(None)
        finally:
            self._calling.discard(ws)
            left = self._waiting.pop(ws, None)  # only after a cancel: nobody will call for it
            if left is not None:
                left.done.cancel()

    def _notified(self, group: _Group) -> Callable[[], Awaitable[bool]]:
        return lambda: self._store.notified(group.w, group.members)
