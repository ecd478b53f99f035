"""The only module that talks to Valkey: one method per Lua transition, plus index reads.

Every session transition is one EVALSHA (valkey-py's Script objects reload on NOSCRIPT, which
a restarted server answers since its script cache is not persisted). Replies are normalised to
``str`` whether or not the client decodes responses.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from valkey.asyncio import Valkey
from valkey.commands.core import AsyncScript
from valkey.exceptions import NoScriptError

from .events import EventLogState
from .keys import WAKE_CHANNEL, WORKSPACES, SessionKeys, WorkspaceKeys

_SCRIPTS = (
    "accept",
    "acquire",
    "stage",
    "complete",
    "restore",
    "requeue",
    "replace",
    "renew",
    "release",
    "lock",
    "snapshot",
    "seed",
    "repair",
    "prune_workspace",
    "notified",
    "take_notices",
)

_CLAIM_MARKER_TTL_MS = 3_600_000  # far longer than any retry of one completion


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _load_sources(event_log_len: int, event_log_ttl_ms: int) -> dict[str, str]:
    folder = resources.files("prompt_outbox") / "lua"
    prelude = (
        f"local EVENTS_MAXLEN, EVENTS_TTL_MS = {event_log_len}, {event_log_ttl_ms}\n"
        + (folder / "lib.lua").read_text()
    )
    return {name: prelude + "\n" + (folder / f"{name}.lua").read_text() for name in _SCRIPTS}


@dataclass(frozen=True, slots=True)
class Acquired:
    """What acquire.lua found: kind is busy | staged | head | wait | idle."""

    kind: str
    entries: list[str]
    due_ms: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    queue: list[str]
    staging: list[str]
    lock_value: str
    lock_pttl_ms: int
    log: EventLogState

    @property
    def locked(self) -> bool:
        return bool(self.lock_value)


@dataclass(frozen=True, slots=True)
class AcceptReply:
    """kind is ok | dup (detail = accepted ID) | full (detail = current length)."""

    kind: str
    detail: str = ""


class Store:
    """Valkey access for one Outbox. The client is borrowed: its lifecycle is the caller's.

    ``event_log_len`` / ``event_log_ttl_ms`` bound each session's event log (its newest events;
    gone once the session is quiet that long)."""

    def __init__(
        self, client: Valkey, *, event_log_len: int = 1000, event_log_ttl_ms: int = 86_400_000
    ) -> None:
        self.client = client
        sources = _load_sources(event_log_len, event_log_ttl_ms)
        self._scripts: dict[str, AsyncScript] = {
            name: client.register_script(src) for name, src in sources.items()
        }

    async def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return await self._scripts[name](keys=list(keys), args=list(args))

    async def _registered_eval(
        self, ws: str, now_ms: int, name: str, keys: Sequence[str], args: Sequence[Any]
    ) -> Any:
        """ZADD the workspace registry, EVALSHA, PUBLISH a wake-up: one pipelined round trip.

        The registry write goes FIRST so a concurrent prune cannot drop a workspace that is
        about to hold work (prune_workspace.lua compares the score it read). On NOSCRIPT (a
        restarted server) the script did not run, so loading it and sending again is safe.
        """
        script = self._scripts[name]
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            pipe.zadd(WORKSPACES, {ws: now_ms})
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            pipe.publish(WAKE_CHANNEL, ws)
            replies = await pipe.execute(raise_on_error=False)
            if isinstance(replies[1], NoScriptError) and attempt == 1:
                await self.client.script_load(script.script)
                continue
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            return replies[1]
        raise AssertionError("unreachable")

    # -- transitions -----------------------------------------------------------------------

    async def accept(
        self,
        k: SessionKeys,
        cmid: str,
        entry: str,
        entry_id: str,
        cap: int,
        ttl_ms: int,
        now_ms: int,
    ) -> AcceptReply:
        """Dedupe, cap, push, then the marker (accept.lua), registered and announced."""
        keys = [*k.script_keys(), k.dedupe(cmid)]
        args = [k.ses, entry, entry_id, cap, ttl_ms, now_ms]
        reply = [_text(x) for x in await self._registered_eval(k.ws, now_ms, "accept", keys, args)]
        return AcceptReply(reply[0], reply[1] if len(reply) > 1 else "")

    async def acquire(self, k: SessionKeys, lockval: str, lease_ms: int, now_ms: int) -> Acquired:
        reply = [
            _text(x)
            for x in await self._run("acquire", k.script_keys(), [k.ses, lockval, lease_ms, now_ms])
        ]
        kind, rest = reply[0], reply[1:]
        if kind == "wait":
            return Acquired(kind, [], int(rest[0]))
        return Acquired(kind, rest)

    async def stage(self, k: SessionKeys, lockval: str, original: str, staged: str) -> str:
        return _text(await self._run("stage", k.script_keys(), [lockval, original, staged]))

    async def complete(
        self,
        k: SessionKeys,
        entry: str,
        entry_id: str,
        lockval: str,
        now_ms: int,
        *,
        release: bool,
        notice_grace_ms: int,
    ) -> int:
        """Copies removed (>= 1: this caller fires OnDelivered); -1: another holds the lock.
        With ``notice_grace_ms`` > 0 the claim records the OnDelivered call it owes (``entry``
        is what the hook gets), for another worker to make if this one dies first."""
        w = k.workspace
        keys = [*k.script_keys(), k.claim(entry_id), w.notices, w.notices_due]
        args = [
            k.ses, entry_id, lockval, now_ms, "1" if release else "0", _CLAIM_MARKER_TTL_MS,
            entry, notice_grace_ms,
        ]  # fmt: skip
        return int(await self._run("complete", keys, args))

    async def notified(self, w: WorkspaceKeys, ses: str, entry_id: str) -> bool:
        """The owed OnDelivered call ran: forget it."""
        keys = [w.notices, w.notices_due]
        return int(await self._run("notified", keys, [f"{ses}:{entry_id}"])) == 1

    async def take_notices(
        self, w: WorkspaceKeys, now_ms: int, grace_ms: int, limit: int
    ) -> list[tuple[str, str, str]]:
        """Owed OnDelivered calls overdue (their worker died): (ses, entry_id, entry JSON)
        each, taken for ``grace_ms`` so no other worker takes them meanwhile."""
        keys = [w.notices, w.notices_due]
        flat = await self._run("take_notices", keys, [now_ms, grace_ms, limit])
        out = []
        for member, entry in zip(flat[::2], flat[1::2], strict=True):
            ses, _, entry_id = _text(member).partition(":")
            out.append((ses, entry_id, _text(entry)))
        return out

    async def restore(
        self, k: SessionKeys, lockval: str, staged: str, new: str, now_ms: int, *, release: bool
    ) -> str:
        args = [k.ses, lockval, staged, new, now_ms, "1" if release else "0"]
        return _text(await self._run("restore", k.script_keys(), args))

    async def requeue(
        self, k: SessionKeys, lockval: str, now_ms: int, staged: Sequence[str], new: Sequence[str]
    ) -> int:
        """Entries requeued; -1 lock lost, -2 staging changed since it was read."""
        args = [k.ses, lockval, now_ms, len(staged), *staged, *new]
        return int(await self._run("requeue", k.script_keys(), args))

    async def replace(
        self,
        k: SessionKeys,
        lockval: str,
        now_ms: int,
        pairs: Sequence[tuple[str, str]],
        *,
        release: bool = False,
    ) -> int:
        """Pairs applied; -1 while another holder owns the session. New '' deletes."""
        flat = [s for pair in pairs for s in pair]
        args = [k.ses, lockval, now_ms, "1" if release else "0", *flat]
        return int(await self._run("replace", k.script_keys(), args))

    async def renew(self, k: SessionKeys, lockval: str, lease_ms: int, now_ms: int) -> bool:
        return (
            int(await self._run("renew", k.script_keys(), [k.ses, lockval, lease_ms, now_ms])) == 1
        )

    async def release(self, k: SessionKeys, lockval: str, now_ms: int) -> bool:
        return int(await self._run("release", k.script_keys(), [k.ses, lockval, now_ms])) == 1

    async def lock(self, k: SessionKeys, lockval: str, lease_ms: int, now_ms: int) -> bool:
        return (
            int(await self._run("lock", k.script_keys(), [k.ses, lockval, lease_ms, now_ms])) == 1
        )

    async def seed(self, k: SessionKeys, raw: str, now_ms: int) -> None:
        await self._registered_eval(k.ws, now_ms, "seed", k.script_keys(), [k.ses, raw, now_ms])

    async def repair(self, k: SessionKeys, now_ms: int) -> None:
        """Re-derive one session's index entries from its lists (the slow safety net)."""
        await self._run("repair", k.script_keys(), [k.ses, now_ms])

    # -- reads -----------------------------------------------------------------------------

    async def snapshot(self, k: SessionKeys) -> Snapshot:
        q, d, lockval, pttl, (first, last, length, added, now) = await self._run(
            "snapshot", k.script_keys(), []
        )
        return Snapshot(
            [_text(x) for x in q],
            [_text(x) for x in d],
            _text(lockval),
            int(pttl),
            EventLogState(_text(first), _text(last), int(length), int(added), int(now)),
        )

    async def read_events(
        self, k: SessionKeys, after: str, block_ms: int, count: int
    ) -> list[tuple[str, dict[str, str]]]:
        """Events logged after ``after``, waiting up to ``block_ms`` for the first one."""
        reply = await self.client.xread({k.events: after}, count=count, block=block_ms)
        out: list[tuple[str, dict[str, str]]] = []
        for _stream, rows in reply or []:
            for event_id, fields in rows:
                out.append((_text(event_id), {_text(a): _text(b) for a, b in fields.items()}))
        return out

    async def workspaces(self) -> dict[str, int]:
        """Registered workspaces -> last accept (ms)."""
        rows = await self.client.zrange(WORKSPACES, 0, -1, withscores=True)
        return {_text(ws): int(score) for ws, score in rows}

    async def members(self, key: str) -> list[str]:
        members: set[Any] = await self.client.smembers(key)  # type: ignore[misc]
        return sorted(_text(x) for x in members)

    async def due_sessions(
        self, workspaces: Sequence[str], now_ms: int, limit: int
    ) -> tuple[list[tuple[str, str]], int | None]:
        """Sessions due now (at most ``limit`` per workspace) and the earliest later score."""
        if not workspaces:
            return [], None
        pipe = self.client.pipeline(transaction=False)
        for ws in workspaces:
            ready = WorkspaceKeys(ws).ready
            pipe.zrangebyscore(ready, "-inf", now_ms, start=0, num=limit)
            pipe.zrangebyscore(ready, f"({now_ms}", "+inf", start=0, num=1, withscores=True)
        replies = await pipe.execute(raise_on_error=True)
        due: list[tuple[str, str]] = []
        nxt: int | None = None
        for i, ws in enumerate(workspaces):
            due.extend((ws, _text(ses)) for ses in replies[2 * i])
            for _, score in replies[2 * i + 1]:
                nxt = int(score) if nxt is None else min(nxt, int(score))
        return due, nxt

    async def session_entries(self, keys: Sequence[SessionKeys]) -> list[list[str]]:
        """Each session's staging then queue, raw (one pipelined round trip)."""
        if not keys:
            return []
        pipe = self.client.pipeline(transaction=False)
        for k in keys:
            pipe.lrange(k.staging, 0, -1)
            pipe.lrange(k.queue, 0, -1)
        replies = await pipe.execute(raise_on_error=True)
        return [[_text(x) for x in replies[i] + replies[i + 1]] for i in range(0, len(replies), 2)]

    async def staging_lengths(self, keys: Sequence[SessionKeys]) -> list[int]:
        pipe = self.client.pipeline(transaction=False)
        for k in keys:
            pipe.llen(k.staging)
        return [int(n) for n in await pipe.execute(raise_on_error=True)]

    async def prune_idle_workspace(self, ws: str, score_ms: int) -> bool:
        """Drop an idle workspace from the registry unless an accept touched it since."""
        w = WorkspaceKeys(ws)
        sessions: int = await self.client.scard(w.sessions)  # type: ignore[misc]
        owed: int = await self.client.hlen(w.notices)  # type: ignore[misc]
        if sessions or owed:
            return False
        return int(await self._run("prune_workspace", [WORKSPACES], [ws, score_ms])) == 1

    async def cleanup_workspace(self, w: WorkspaceKeys) -> int:
        """Delete every key of the workspace (found by pattern: an admin action, not a tick)."""
        removed = 0
        batch: list[Any] = []
        async for key in self.client.scan_iter(match=w.scan_pattern, count=500):
            batch.append(key)
            if len(batch) >= 500:
                removed += int(await self.client.delete(*batch))
                batch.clear()
        if batch:
            removed += int(await self.client.delete(*batch))
        await self.client.zrem(WORKSPACES, w.ws)
        return removed

    async def ping(self) -> bool:
        return bool(await self.client.ping())

    async def server_config(self, *names: str) -> dict[str, str]:
        """CONFIG GET for the named settings (the durability check reads these)."""
        raw: dict[Any, Any] = await self.client.config_get(*names)  # type: ignore[arg-type]
        return {_text(k): _text(v) for k, v in raw.items()}

    # -- wake-ups --------------------------------------------------------------------------

    async def wake_ups(self) -> AsyncIterator[str]:
        """Yield the workspace of every accept published on the wake channel ('' on a quiet
        second), until the consumer stops iterating."""
        pubsub = self.client.pubsub()
        try:
            await pubsub.subscribe(WAKE_CHANNEL)
            while True:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                # Also yield on a quiet second, so the consumer can notice it should stop.
                yield _text(msg["data"]) if msg and msg.get("type") == "message" else ""
                await asyncio.sleep(0)
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]
