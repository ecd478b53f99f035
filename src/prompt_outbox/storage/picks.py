"""What an operator action reads of a session (``admin.py``): the one entry it acts on
(``entry.lua``), or its queued entries in some statuses a slice of bounded bytes at a time
(``entries.lua``), each with whether a holder has the session and whether it has staged
entries. Never the whole session: an action costs the bytes of what it acts on, a slice at
most at a time, whatever the session holds."""

from __future__ import annotations

from collections.abc import Sequence

from ..core.keys import SessionKeys
from .replies import Found, Ok, Slice, parse
from .turnstore import Run


class Picks:
    """The operator actions' reads; ``run`` runs a script (``Store._run``)."""

    def __init__(self, run: Run) -> None:
        self._run = run

    async def entry(self, k: SessionKeys, entry_id: str) -> Found:
        """One entry of the session, found by its ID, and whether the session is held or has
        staged entries (entry.lua): its bytes only are read."""
        return Found.of(parse(Ok, await self._run("entry", k.script_keys(), [entry_id]))[1])

    async def entries(
        self, k: SessionKeys, statuses: Sequence[str], max_bytes: int, skip: int = 0
    ) -> Slice:
        """The session's queued entries in ``statuses``, after the first ``skip`` of them, at
        most ``max_bytes`` of them (one at least), with what a slice says (entries.lua)."""
        args = [max_bytes, skip, *statuses]
        return Slice.of(parse(Ok, await self._run("entries", k.script_keys(), args))[1])
