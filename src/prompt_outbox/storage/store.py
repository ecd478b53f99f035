"""The Valkey access above the storage layer sees: one method per Lua transition, plus
reads, and the parts it owns: ``due``, ``walk``, ``turns``, ``budgets``, ``picks``, ``series``.

Every session transition is one EVALSHA, reloaded on NOSCRIPT (a restarted server's script
cache is empty), and auto-pipelined on a standalone server (autopipe.py). Each reply becomes
a typed value from ``replies``; nothing above this module sees a raw reply.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from valkey.commands.core import AsyncScript
from valkey.exceptions import ClusterError, NoScriptError, TryAgainError
from valkey.exceptions import ConnectionError as ValkeyConnectionError
from valkey.exceptions import TimeoutError as ValkeyTimeoutError

from ..core.errors import StorageFormatError
from ..core.keys import FORMAT_KEY, STORAGE_FORMAT, SessionKeys, WorkspaceKeys
from . import replies, waitaof
from .budget import Budgets
from .client import Client
from .dueindex import DueIndex
from .memory import MemoryCeiling
from .picks import Picks
from .replies import (
    Accept,
    Accepted,
    Acquire,
    Acquired,
    BytesFull,
    Claim,
    Claimed,
    Counted,
    Edited,
    Forgot,
    Format,
    Held,
    Lock,
    Ok,
    Replace,
    Requeue,
    SessionTally,
    Snapshot,
    Write,
    lowered_ms,
    parse,
    text,
)
from .scripts import CLAIM_MARKER_TTL_MS, READS, LogBounds, sources
from .series import Series
from .topology import topology_of
from .turnstore import TurnStore
from .walk import Walk

UNAVAILABLE: tuple[type[Exception], ...] = (
    ValkeyConnectionError,
    ValkeyTimeoutError,
    ClusterError,
    TryAgainError,
)
"""Valkey cannot answer right now: unreachable, timed out, a cluster reconfiguring, or a slot
half moved to another node for longer than the client's own retries (TRYAGAIN, "TTL
exhausted"). BusyLoadingError, a restarted server replaying its AOF, is a ConnectionError.
The API answers these with 503; a client sends again (same clientMessageID)."""

TRANSIENT_ERRORS: tuple[type[Exception], ...] = (*UNAVAILABLE, OSError)
"""What is worth retrying for (bookkeeping, the run loop): UNAVAILABLE, or the socket under it."""


def notice_member(ses: str, entry_id: str) -> str:
    """How an owed OnDelivered call is named in the workspace's notice HASH and ZSET."""
    return f"{ses}:{entry_id}"


class Store:
    """Valkey access for one Outbox. The client is borrowed: its lifecycle is the caller's.

    ``logs``: each session's event log's bounds, the markers' life (``LogBounds``).
    ``memory_ratio`` / ``memory_interval``: accepts stop at that share of a node's maxmemory,
    read at most once per interval (memory.py). ``budget_share``: of the node's memory, a
    workspace's byte budget (budget.py). On a cluster every transition is still one script on
    the workspace's slot (its keys share the ``{ws}`` hash tag)."""

    def __init__(
        self,
        client: Client,
        *,
        logs: LogBounds | None = None,
        memory_ratio: float = 0.8,
        memory_interval: float = 1.0,
        budget_share: float = 0.1,
    ) -> None:
        self.client = client
        self.topology = topology_of(client)
        """Standalone or cluster, decided once (storage/topology.py)."""
        self.memory = MemoryCeiling(self.topology, memory_ratio, memory_interval)
        """The accept path's memory ceiling (per node cached INFO memory)."""
        self._scripts: dict[str, AsyncScript] = {
            name: client.register_script(src)  # type: ignore[misc]  # cluster: typed as Valkey's
            for name, src in sources(logs or LogBounds()).items()
        }
        self.due = DueIndex(self.topology, self._scripts)
        self.walk = Walk(client, self.due)
        """The walks over every workspace (maintenance, recovery, counts, admin)."""
        self.turns = TurnStore(client, self._run, self.due)
        """Sessions held in turn: their ends, checks and owners (storage/turnstore.py)."""
        self.budgets = Budgets(client, self.memory, budget_share, self._run)
        """The workspaces' byte budgets, and what each holds (storage/budget.py)."""
        self.picks = Picks(self._run)
        """What an operator action reads of a session: one entry, or a slice (picks.py)."""
        self.series = Series(client, self._run)
        """The reads behind the queue page's charts and a session's history (series.py)."""
        self._pipe = self.topology.auto_pipeline(self.load_scripts)
        # How a transition and its due mark travel, chosen once (the only read of the kind):
        # one script with a WAITAOF after it on its connection, or three calls.
        one_node = self.topology.one_node
        self._marked_eval = self._marked_in_script if one_node else self._marked_around
        self._waits_ride = one_node
        self._format_recorded = False

    async def record_format(self) -> None:
        """Record this version's storage format in Valkey, once per Store (format.lua); raise
        ``StorageFormatError`` if a newer one is there. Every transition calls it first, so no
        write goes into a store a newer version wrote (reads are left alone)."""
        if self._format_recorded:
            return
        reply = await self._scripts["format"](keys=[FORMAT_KEY], args=[STORAGE_FORMAT])
        word, rest = parse(Format, reply)
        if word is Format.NEWER:
            raise StorageFormatError(text(rest[0]), STORAGE_FORMAT)
        self._format_recorded = True

    async def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if not self._format_recorded and name not in READS:
            await self.record_format()
        if self._pipe is None:  # a cluster: alone (autopipe.py)
            return await self._scripts[name](keys=list(keys), args=list(args))
        return await self._pipe.call(self._scripts[name], keys, args)

    async def _ok(
        self, kind: type[Held | Lock | Forgot], name: str, keys: list[str], args: Sequence[Any]
    ) -> bool:
        """A yes / no script: True for its OK word (any word its enum lacks raises)."""
        word, _ = parse(kind, await self._run(name, keys, args))
        return word.name == "OK"

    async def _marked_around(
        self,
        ws: str,
        now_ms: int,
        name: str,
        keys: Sequence[str],
        args: Sequence[Any],
        tail: Sequence[tuple[Any, ...]] = (),
    ) -> tuple[Any, list[Any]]:
        """``_marked_eval`` on a cluster, which keeps the marks in other slots than the
        workspace and refuses scripts in a pipeline: mark before, run, mark after, in that
        order, and no ``tail`` (answers [])."""
        await self.due.mark(ws, now_ms, "before")
        reply = await self._run(name, keys, args)
        await self.due.mark(ws, now_ms, "after")
        return reply, []

    async def _marked_in_script(
        self,
        ws: str,
        now_ms: int,
        name: str,
        keys: Sequence[str],
        args: Sequence[Any],
        tail: Sequence[tuple[Any, ...]] = (),
    ) -> tuple[Any, list[Any]]:
        """Run a transition that may make work due sooner, with its due mark (dueindex.py
        says why); its reply, and the answers to ``tail`` (raw commands, errors included).
        This is ``_marked_eval`` on one server (``_marked_around`` on a cluster).

        The transition and its mark are one script (``<name>_marked``), and ``tail`` rides
        after it on the same connection: a pipeline that met NOSCRIPT (a restarted server)
        ran nothing, so it is sent again after loading."""
        await self.record_format()  # the pipeline below bypasses ``_run``
        mark_keys, mark_args = self.due.in_script(ws, now_ms)
        keys, args = [*keys, *mark_keys], [*args, *mark_args]
        if not tail:
            return await self._run(f"{name}_marked", keys, args), []
        script = self._scripts[f"{name}_marked"]
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            for command in tail:
                pipe.execute_command(*command)
            answers = await pipe.execute(raise_on_error=False)
            if attempt == 1 and isinstance(answers[0], NoScriptError):
                await self.load_scripts()
                continue
            if isinstance(answers[0], Exception):
                raise answers[0]
            return answers[0], answers[1:]
        raise AssertionError("unreachable")

    # -- transitions -----------------------------------------------------------------------

    async def accept(
        self,
        k: SessionKeys,
        cmid: str,
        fingerprint: str,
        entry: str,
        entry_id: str,
        cap: int,
        workspace_cap: int,
        ttl_ms: int,
        now_ms: int,
        wait: waitaof.WaitAof | None = None,
        while_busy: str = "enqueue",
    ) -> Accepted:
        """accept.lua: dedupe (key, then payload ``fingerprint``), the memory ceiling (the
        node's cached reading, passed in: STORAGE_FULL), ``while_busy`` (a reject refuses a
        busy session; an interrupt names the entry in flight), the session's ``cap``, the
        workspace's ``workspace_cap`` (its count's total: O(1)), its byte budget (a share of
        the node's memory, from the same reading: BYTES_FULL past it, five fields read),
        push, marker, fingerprint;
        marked due and announced. With ``wait``, then WAITAOF for the accept (or
        a DUPLICATE's first accept, whose marker is written again for it): in the accept's
        own pipeline on a standalone server, as a pair of its own on a cluster. ``now_ms`` is
        the accept's time, which is the entry's ``acceptedAt``: the tally's oldest pending
        takes it from here, so the script never decodes the entry."""
        marker = k.dedupe(cmid)
        tail = wait.commands() if wait is not None and self._waits_ride else []
        keys = [*k.script_keys(), marker, k.fingerprint(cmid)]
        waits = int(bool(tail))
        args = [k.ses, entry, entry_id, cap, ttl_ms, waits, fingerprint, while_busy, workspace_cap]
        memory = await self.memory.reading(k.queue)
        over, budget = memory.over(self.memory.ratio), memory.budget(self.budgets.share)
        args += [int(over), now_ms, budget]
        reply, answers = await self._marked_eval(k.ws, now_ms, "accept", keys, args, tail)
        outcome, rest = parse(Accept, reply)
        if outcome is Accept.STORAGE_FULL:
            return Accepted(outcome, memory=memory)
        if outcome is Accept.BYTES_FULL:
            return Accepted(outcome, held=BytesFull.of(rest), budget=budget)
        first = text(rest[0]) if outcome in (Accept.DUPLICATE, Accept.REUSED) else ""
        in_flight = text(rest[0]) if outcome is Accept.OK and rest else ""
        if wait is None or outcome not in (Accept.OK, Accept.DUPLICATE):
            return Accepted(outcome, first, None, in_flight)
        if answers:
            seen = waitaof.waited(first or entry_id, answers)
        else:
            seen = await waitaof.confirm(self.topology, self._scripts["confirm"], marker, wait)
        return Accepted(outcome, first, seen, in_flight)

    async def acquire(self, k: SessionKeys, lockval: str, lease_ms: int, now_ms: int) -> Acquired:
        """Take the lock if the session needs a worker, and say for what (acquire.lua). A
        holder's WAIT / IDLE lets its lock go: the due index is marked if that moved the
        workspace's work earlier."""
        args = [k.ses, lockval, lease_ms, now_ms]
        return await self._acquired(k, await self._run("acquire", k.script_keys(), args))

    async def _acquired(self, k: SessionKeys, reply: Any) -> Acquired:
        kind, rest = parse(Acquire, reply)
        if kind in (Acquire.WAIT, Acquire.IDLE):
            lowered = lowered_ms(rest[0])
            if lowered is not None:
                await self.due.mark(k.ws, lowered)
            return Acquired(kind, [])
        return Acquired(kind, [text(x) for x in rest])

    async def stage(
        self, k: SessionKeys, lockval: str, original: str, staged: str, ran: str = ""
    ) -> Write:
        """Copy the head into staging, then take it off the queue (stage.lua). ``ran``: the
        ``notice_member`` of an owed OnDelivered call that has run, forgotten in the same
        call (whatever the stage's outcome)."""
        w = k.workspace
        keys = [*k.script_keys(), w.notices, w.notices_due]
        args = [k.ses, lockval, original, staged, ran]
        return parse(Write, await self._run("stage", keys, args))[0]

    async def complete(
        self,
        k: SessionKeys,
        entry: str,
        entry_id: str,
        lockval: str,
        now_ms: int,
        grace_ms: int,
        next_lease_ms: int = 0,
        turn: str = "",
        turn_ms: int = 0,
        owner: str = "",
        turn_id: str = "",
    ) -> Claimed:
        """The cross-list claim (complete.lua). CLAIMED: this caller fires OnDelivered. With
        ``grace_ms`` > 0 the claim records the OnDelivered call it owes (``entry`` is what
        the hook gets), for another worker to make if this one dies first. With
        ``next_lease_ms`` > 0 a claim also answers the caller's next step, as ``acquire``
        would (the lock re-leased for that long, or let go). With ``turn`` (a turn's value,
        core/turns.py) the claim hands the lock to the turn for ``turn_ms`` instead, owned
        by ``owner`` if not ''."""
        w = k.workspace
        keys = [*k.script_keys(), k.claim(entry_id), w.notices, w.notices_due, w.turns]
        keys += [k.early_end, w.in_turn]
        args = [k.ses, entry_id, lockval, now_ms, CLAIM_MARKER_TTL_MS, entry, grace_ms]
        args += [next_lease_ms, turn, turn_ms, owner, turn_id]
        claim, rest = parse(Claim, await self._run("complete", keys, args))
        if claim is Claim.CLAIMED and rest and text(rest[0]) == "ended":
            return Claimed(claim, ended_early=True)
        if claim is Claim.CLAIMED and rest:
            return Claimed(claim, await self._acquired(k, rest))
        return Claimed(claim)

    async def restore(
        self, k: SessionKeys, lockval: str, staged: str, new: str, now_ms: int
    ) -> Write:
        """Put a staged entry back at its place with its new state (restore.lua)."""
        args = [k.ses, lockval, staged, new, now_ms]
        return parse(Write, await self._run("restore", k.script_keys(), args))[0]

    async def requeue(
        self, k: SessionKeys, lockval: str, now_ms: int, staged: Sequence[str], new: Sequence[str]
    ) -> Counted[Requeue]:
        """Recover the exact staging read, as ``new`` (requeue.lua)."""
        args = [k.ses, lockval, now_ms, len(staged), *staged, *new]
        outcome, rest = parse(Requeue, await self._run("requeue", k.script_keys(), args))
        return Counted(outcome, int(rest[0]) if rest else 0)

    async def replace(
        self,
        k: SessionKeys,
        lockval: str,
        now_ms: int,
        pairs: Sequence[tuple[str, str]],
        *,
        budgeted: bool = False,
    ) -> Counted[Replace]:
        """Compare-and-swap whole entry strings; a new '' removes (replace.lua). Without a
        lock (``lockval`` '', an operator's edit) the change may make work due at once, so it
        is marked due and announced like an accept. ``budgeted`` (a client's retry): raises
        ``WorkspaceBytesFull``, nothing written, while the workspace is at its byte budget."""
        budget = await self.budgets.limit(k.queue) if budgeted else 0
        args = [k.ses, lockval, now_ms, budget, *(s for pair in pairs for s in pair)]
        if lockval:
            reply = await self._run("replace", k.script_keys(), args)
        else:
            reply, _ = await self._marked_eval(k.ws, now_ms, "replace", k.script_keys(), args)
        outcome, rest = parse(Replace, reply)
        if outcome is Replace.BYTES_FULL:
            raise BytesFull.of(rest).refusal(budget)
        return Counted(outcome, int(rest[0]) if rest else 0)

    async def edit(self, k: SessionKeys, old: str, new: str, entry_id: str) -> Edited:
        """Swap an entry for its edited one (edit.lua); ``WorkspaceBytesFull`` past the budget."""
        budget = await self.budgets.limit(k.queue)
        args = [old, new, entry_id, budget, k.ses]
        word, rest = parse(Edited, await self._run("edit", k.script_keys(), args))
        if word is Edited.BYTES_FULL:
            raise BytesFull.of(rest).refusal(budget)
        return word

    async def renew(self, k: SessionKeys, lockval: str, lease_ms: int, now_ms: int) -> bool:
        """Extend the caller's lease; False once it is lost (renew.lua)."""
        return await self._ok(Held, "renew", k.script_keys(), [k.ses, lockval, lease_ms, now_ms])

    async def release(self, k: SessionKeys, lockval: str, now_ms: int) -> bool:
        """Compare-and-delete the lock; False if it was not the caller's (release.lua). Marks
        the due index if letting go moved the workspace's work earlier."""
        word, rest = parse(
            Held, await self._run("release", k.script_keys(), [k.ses, lockval, now_ms])
        )
        lowered = lowered_ms(rest[0])
        if lowered is not None:
            await self.due.mark(k.ws, lowered)
        return word is Held.OK

    async def lock(self, k: SessionKeys, lockval: str, lease_ms: int, now_ms: int) -> bool:
        """Take the lock unless another holder has it (lock.lua). The workspace is marked
        first, by the lease's expiry: a holder that changes entries and dies before its
        release leaves them due no later than that."""
        await self.due.mark(k.ws, now_ms + lease_ms)
        return await self._ok(Lock, "lock", k.script_keys(), [k.ses, lockval, lease_ms, now_ms])

    async def notified(self, w: WorkspaceKeys, members: Sequence[str]) -> bool:
        """Owed OnDelivered calls of one workspace ran (``notice_member`` each): forget them
        all in one call (notified.lua). True if any record was there."""
        return await self._ok(Forgot, "notified", [w.notices, w.notices_due], members)

    async def take_notices(
        self, w: WorkspaceKeys, now_ms: int, grace_ms: int, limit: int
    ) -> list[tuple[str, str, str]]:
        """Owed OnDelivered calls overdue (their worker died): (ses, entry_id, entry JSON)
        each, taken for ``grace_ms`` so no other worker takes them meanwhile."""
        keys = [w.notices, w.notices_due]
        _, flat = parse(Ok, await self._run("take_notices", keys, [now_ms, grace_ms, limit]))
        out = []
        for member, entry in zip(flat[::2], flat[1::2], strict=True):
            ses, _, entry_id = text(member).partition(":")
            out.append((ses, entry_id, text(entry)))
        return out

    async def seed(self, k: SessionKeys, raw: str, now_ms: int) -> None:
        """Append a raw entry, marked due and announced like an accept (seed.lua)."""
        reply, _ = await self._marked_eval(
            k.ws, now_ms, "seed", k.script_keys(), [k.ses, raw, now_ms]
        )
        parse(Ok, reply)

    async def repair(self, k: SessionKeys, now_ms: int) -> None:
        """Re-derive one session's index entries from its lists (the slow safety net)."""
        parse(Ok, await self._run("repair", k.script_keys(), [k.ses, now_ms]))

    # -- reads -----------------------------------------------------------------------------

    async def snapshot(self, k: SessionKeys) -> Snapshot:
        """The session and its event log's state, in one consistent read (snapshot.lua)."""
        _, payload = parse(Ok, await self._run("snapshot", k.script_keys(), []))
        return replies.snapshot(payload)

    async def tally(self, w: WorkspaceKeys, sessions: Sequence[str]) -> list[SessionTally]:
        """What the overview shows of these sessions of the workspace, in one consistent
        read of the counts the scripts keep (tally.lua): a few small fields a session, no
        entry read."""
        if not sessions:
            return []
        keys = [w.count, w.oldest, *(SessionKeys(w.ws, ses).lock for ses in sessions)]
        _, payload = parse(Ok, await self._run("tally", keys, list(sessions)))
        return replies.session_tallies(list(sessions), payload)

    async def read_events(
        self, k: SessionKeys, after: str, block_ms: int | None, count: int
    ) -> list[tuple[str, dict[str, str]]]:
        """Events logged after ``after`` (at most ``count``), waiting up to ``block_ms`` for the
        first one; ``None`` answers at once (how the shared event feed, storage/feed.py, reads:
        a blocked read would hold a pooled connection per stream)."""
        reply = await self.client.xread({k.events: after}, count=count, block=block_ms)
        out: list[tuple[str, dict[str, str]]] = []
        for _stream, rows in reply or []:
            for event_id, fields in rows:
                out.append((text(event_id), {text(a): text(b) for a, b in fields.items()}))
        return out

    async def load_scripts(self) -> None:
        """SCRIPT LOAD every script (on a cluster, on every primary), then record the format.
        Done once before the first accept, so that it does not meet NOSCRIPT and send its
        durability wait twice, nor spend a round trip on the format."""
        await self.topology.load_scripts([script.script for script in self._scripts.values()])
        await self.record_format()

    async def ping(self) -> bool:
        return bool(await self.client.ping())
