"""Deliver entries to opencode server sessions, learn when their turns end, and verify
ambiguous sends in the transcript (docs/opencode-turns.md).

The send is ``POST {base}/session/{id}/prompt_async``: opencode stores the user message,
starts the turn and answers 204 at once. The deliverer then returns ``Turn(messageID)``: the
entry is delivered, and the session stays held in turn until opencode reports the session idle
on its event stream (``opencode_events``). Outcome classes of the send (docs/contract.md):

- a connection refused, a connect timeout, or no free connection to that server within
  ``connect_timeout``: nothing reached opencode (transient);
- 2xx: delivered, a turn begins;
- 4xx: definitive (opencode will not take this request: bad body, unknown session; an opencode
  without ``prompt_async`` answers 404 too, and the error says so);
- 5xx, a read timeout or a cut: ambiguous (the message may be stored), verified, never
  re-sent blindly.

Each attempt carries a deterministic ``messageID`` and part ``id``: a time prefix in opencode's
own ID layout (from the attempt's ``lastAttemptAt``, so the message sorts after what the session
already holds) and a suffix derived from the entry ID alone. The verifier looks the suffix up
in ``GET {base}/session/{id}/message``, so any attempt of the entry that persisted is found;
failing that, it matches the text of a user message created after ``lastAttemptAt``.

Every path segment built from an ID is percent-encoded (``session_path``), and an opencode
session ID that cannot be one segment (empty, only dots, or holding ``/``, ``?``, ``#``) is
refused: a client normalises ``/session/../message`` to ``/message``, another route. The
mappings, and the refusal of one that lets two workspaces meet in one opencode session, are
in ``opencode_targets``.

Every request reads a bounded part of opencode's answer, within ``timeout`` in total
(``answer.bounded_request``): the send's answer up to ``SEND_ANSWER_BYTES`` (an error's
detail), the transcript up to ``transcript_max_bytes``, past which the verdict is
inconclusive, never a guess from part of it. Each origin (scheme, host, port) has a pool of
``max_connections_per_server`` connections shared by the servers (base URLs) on it, each
event stream a connection of its own; at most ``max_servers`` servers are kept, and one idle
for ``idle_timeout`` is let go (``opencode_servers``).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
from datetime import datetime
from typing import Any

import httpx

from ..core.callbacks import Turn, TurnEnded, TurnState, Verdict
from ..core.entry import Entry
from ..core.errors import ambiguous, transient
from ..core.timeutil import to_ms
from .answer import Answer, KiB, MiB, bounded_request
from .opencode_events import TurnStreams
from .opencode_servers import Servers, ServersFull
from .opencode_targets import (
    InvalidTarget,
    OpencodeTarget,
    SharedTarget,
    TargetResolver,
    load_targets,
    server_of,
    session_path,
    static_targets,
    template_targets,
)
from .sse_events import EVENT_MAX_BYTES

__all__ = [  # the mappings' names stay importable from here, where they were
    "InvalidTarget",
    "OpencodeDeliverer",
    "OpencodeTarget",
    "SharedTarget",
    "TargetResolver",
    "load_targets",
    "message_id",
    "model_selector",
    "part_id",
    "session_path",
    "static_targets",
    "template_targets",
]

log = logging.getLogger("prompt_outbox.opencode")

_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_SUFFIX_LEN = 14
_CLOCK_SKEW_MS = 2_000  # the text fallback's grace before lastAttemptAt

SEND_ANSWER_BYTES = 64 * KiB  # 204 holds nothing; an error's body is read for its detail
ABORT_ANSWER_BYTES = 4 * KiB  # true/false
TRANSCRIPT_MAX_BYTES = 64 * MiB  # the default bound of one transcript page
MAX_SERVERS = 256  # servers (base URLs) kept at once: each a stream, its origin a pool
IDLE_TIMEOUT = 30.0  # a server's stream and clients outlive its last use this long


def _suffix(entry_id: str) -> str:
    n = int.from_bytes(hashlib.sha256(entry_id.encode()).digest()[:11], "big")
    chars = []
    for _ in range(_SUFFIX_LEN):
        n, r = divmod(n, 62)
        chars.append(_BASE62[r])
    return "".join(chars)


def _time_prefix(when: datetime) -> str:
    # opencode's ascending IDs: 12 hex digits of (epoch_ms * 4096 + counter) mod 2**48. The top
    # counter value sorts after every ID opencode minted in the same millisecond.
    return f"{(to_ms(when) * 4096 + 4095) % 2**48:012x}"


def message_id(entry: Entry) -> str:
    """The opencode ``messageID`` of the entry's current attempt (needs ``last_attempt_at``)."""
    if entry.last_attempt_at is None:
        raise ValueError("the entry has no attempt yet (last_attempt_at is unset)")
    return f"msg_{_time_prefix(entry.last_attempt_at)}{_suffix(entry.id)}"


def part_id(entry: Entry) -> str:
    """The opencode text part ``id`` of the entry's current attempt."""
    return "prt_" + message_id(entry).removeprefix("msg_")


def model_selector(model: str | None) -> dict[str, str] | None:
    """Map an entry's raw model JSON to opencode's ``{providerID, modelID}`` (None: default).

    Accepted: ``"provider/model"``, ``{"providerID", "modelID"}`` or ``{"provider", "model"}``.
    Anything else raises ValueError (a definitive failure: no retry will make it valid).
    """
    if model is None:
        return None
    value = json.loads(model)
    if isinstance(value, str):
        provider, sep, name = value.partition("/")
        if sep and provider and name:
            return {"providerID": provider, "modelID": name}
    elif isinstance(value, dict):
        for p_key, m_key in (("providerID", "modelID"), ("provider", "model")):
            p_val, m_val = value.get(p_key), value.get(m_key)
            if isinstance(p_val, str) and isinstance(m_val, str) and p_val and m_val:
                return {"providerID": p_val, "modelID": m_val}
    raise ValueError(f"cannot map model selector {model} to opencode's providerID/modelID")


class OpencodeDeliverer:
    """A Deliverer (``await d(ws, ses, entry)``) for opencode that hands back a ``Turn``, its
    ``TurnWatcher`` (``watch_turns``, ``turn_state``), its ``Aborter`` (``abort``) and its
    Verifier (``.verify``).

    ``targets`` maps our (workspace, session) to an opencode server and session ID
    (``template_targets``, ``static_targets``, ``load_targets`` or a callable of your own).
    ``timeout`` bounds each request in total (a send answers in ~0.1 s; past it the send is
    ambiguous and the verifier settles it). ``max_connections_per_server`` sizes each
    origin's (scheme, host, port) connection pool, shared by the servers there (sends,
    status and transcript reads; each event stream has a connection of its own).
    ``max_servers`` bounds the servers (distinct base URLs) kept at once: a send to one more
    lets the idlest idle one go, or fails transient when all are in use. ``idle_timeout``:
    how long a server's event stream, and its origin's clients, outlive its last request or
    watched turn. ``event_max_bytes`` bounds one line and one event of the event stream.
    ``transcript_limit`` is how many recent messages the verifier reads,
    ``transcript_max_bytes`` how many bytes of them at most (past it: inconclusive).
    ``client`` is borrowed if given (for every server, with its own limits); otherwise the
    clients are made per origin and closed when idle, or by ``aclose()``.
    """

    def __init__(
        self,
        targets: TargetResolver,
        *,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        auth: tuple[str, str] | None = None,
        max_connections_per_server: int = 32,
        max_servers: int = MAX_SERVERS,
        idle_timeout: float = IDLE_TIMEOUT,
        event_max_bytes: int = EVENT_MAX_BYTES,
        transcript_limit: int = 500,
        transcript_max_bytes: int = TRANSCRIPT_MAX_BYTES,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if transcript_limit < 1:
            raise ValueError("transcript_limit must be at least 1")
        if transcript_max_bytes < 1:
            raise ValueError("transcript_max_bytes must be at least 1")
        if max_connections_per_server < 1:
            raise ValueError("max_connections_per_server must be at least 1")
        self._targets = targets
        self._limit = transcript_limit
        self._max_bytes = transcript_max_bytes
        self._timeout = timeout
        self._auth = auth
        # Waiting for a free connection is bounded by connect_timeout: past it nothing was
        # sent (transient), where the request's own deadline would make it ambiguous.
        self._http_timeout = httpx.Timeout(timeout, connect=connect_timeout, pool=connect_timeout)
        self._ssl: Any = None
        self._servers = Servers(
            self._new_client if client is None else None,
            borrowed=client,
            connections=max_connections_per_server,
            max_servers=max_servers,
            idle_timeout=idle_timeout,
        )
        self._streams = TurnStreams(
            self._servers,
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_bytes=event_max_bytes,
        )

    def _new_client(self, limits: httpx.Limits) -> httpx.AsyncClient:
        """An origin's client: one pool per origin, so one busy origin's sends never take
        another's connections."""
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context()  # one for all (20 ms, ~100s of KiB)
        transport = httpx.AsyncHTTPTransport(verify=self._ssl, limits=limits)
        return httpx.AsyncClient(
            transport=transport, verify=self._ssl, timeout=self._http_timeout, auth=self._auth
        )

    async def _target(self, ws: str, ses: str) -> OpencodeTarget:
        """The session's target, its ID one path segment and its URL a server's (else
        InvalidTarget: definitive); a resolver that fails otherwise is transient."""
        try:
            found = self._targets(ws, ses)
            target = await found if inspect.isawaitable(found) else found
        except InvalidTarget:
            raise  # a misconfiguration, not a passing failure: definitive
        except Exception as exc:
            # The contract's own example of a transient failure: the endpoint could not be resolved.
            raise transient(exc) from exc
        session_path(target.session_id)
        server_of(self._base(target))
        return target

    @staticmethod
    def _base(target: OpencodeTarget) -> str:
        return target.base_url.rstrip("/")

    def _url(self, target: OpencodeTarget, tail: str) -> str:
        """``{base}/session/{id}/{tail}``, the ID one encoded segment (InvalidTarget,
        definitive, if it cannot be one: a resolver of the caller's own)."""
        return f"{self._base(target)}/session/{session_path(target.session_id)}/{tail}"

    async def __call__(self, ws: str, ses: str, entry: Entry) -> Turn:
        body: dict[str, Any] = {
            "messageID": message_id(entry),
            "parts": [{"id": part_id(entry), "type": "text", "text": entry.text}],
        }
        if (model := model_selector(entry.model)) is not None:
            body["model"] = model
        target = await self._target(ws, ses)
        url = self._url(target, "prompt_async")
        turn = Turn(body["messageID"])
        # Watched before the send: the turn may end before its 204 is read.
        try:
            watch = self._streams.watch(self._base(target), target.session_id, ws, ses, turn.id)
        except ServersFull as exc:
            raise transient(exc) from exc  # every server kept is in use: nothing sent
        try:
            answer = await self._request(target, "POST", url, SEND_ANSWER_BYTES, json_body=body)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, ServersFull) as exc:
            self._streams.drop(watch)
            raise transient(exc) from exc  # opencode is down or its pool full: nothing sent
        except httpx.HTTPError as exc:
            self._streams.drop(watch)
            raise ambiguous(exc) from exc  # cut or timed out: the message may be stored
        except BaseException:
            self._streams.drop(watch)
            raise
        status = answer.status
        if 200 <= status < 300:
            self._streams.sent(watch)
            return turn
        self._streams.drop(watch)
        detail = f"opencode answered {status}: {answer.detail()}"
        if status == 404 and b"NotFoundError" not in answer.body:
            detail += " (no prompt_async route: an opencode older than this deliverer supports)"
        if 400 <= status < 500:
            raise RuntimeError(detail)
        raise ambiguous(detail)

    def watch_turns(self, ended: TurnEnded | None) -> None:
        """``TurnWatcher``: from now on, report each watched turn that opencode says ended to
        ``ended(ws, ses, turn_id)`` (learned from one event stream per opencode server);
        None stops every stream and forgets the turns watched."""
        if ended is None:
            self._streams.stop()
        else:
            self._streams.start(ended)

    @property
    def watched_turns(self) -> int:
        """How many turns this deliverer watches now (sent and not yet heard ending)."""
        return len(self._streams)

    @property
    def servers_kept(self) -> int:
        """How many opencode servers (distinct base URLs) it keeps now (<= ``max_servers``)."""
        return self._servers.kept

    @property
    def clients_open(self) -> int:
        """How many HTTP clients it made are open (two per origin at most: requests and event
        streams; none with a borrowed ``client``)."""
        return self._servers.clients

    @property
    def event_streams(self) -> int:
        """How many event streams run (one per server kept with a turn watched, or since)."""
        return self._streams.streams

    async def turn_state(self, ws: str, ses: str, turn_id: str) -> TurnState:
        """``TurnWatcher``: RUNNING while the session is busy in opencode, ENDED once it is
        not, UNKNOWN when opencode cannot be asked; from the live event stream when it
        watches the turn, else from ``GET /session/status``. The turn is watched from then
        on (while ``watch_turns`` has a callback)."""
        try:
            target = await self._target(ws, ses)
        except Exception as exc:
            log.info("no opencode target to ask about a turn: %s", exc, extra={"turn": turn_id})
            return TurnState.UNKNOWN
        return await self._streams.state(self._base(target), target.session_id, ws, ses, turn_id)

    async def abort(self, ws: str, ses: str) -> None:
        """Abort the session's turn in flight (whileBusy interrupt, a turn past its ceiling):
        ``POST /session/{id}/abort``. opencode then reports the session idle, which ends the
        turn; its prompt stays in the transcript, delivered, never sent again."""
        target = await self._target(ws, ses)
        answer = await self._request(target, "POST", self._url(target, "abort"), ABORT_ANSWER_BYTES)
        if answer.status >= 300:
            raise RuntimeError(f"opencode answered {answer.status} to the abort")

    async def _request(
        self, target: OpencodeTarget, method: str, url: str, limit: int, **kwargs: Any
    ) -> Answer:
        async with self._servers.request(self._base(target)) as client:
            return await bounded_request(
                client, method, url, limit=limit, deadline=self._timeout, **kwargs
            )

    async def verify(self, ws: str, ses: str, entry: Entry) -> Verdict:
        """DELIVERED if an attempt of the entry is in the transcript, ABSENT if provably not,
        INCONCLUSIVE when opencode cannot be read or the window is older than what was read."""
        try:
            target = await self._target(ws, ses)
            url = self._url(target, "message")
            answer = await self._request(
                target, "GET", url, self._max_bytes, params={"limit": self._limit}
            )
        except Exception as exc:
            log.info("opencode transcript unreadable: %s", exc, extra={"entry": entry.id})
            return Verdict.INCONCLUSIVE
        if answer.status == 404:
            return Verdict.ABSENT  # no such session: the message cannot be in it
        if answer.status != 200:
            return Verdict.INCONCLUSIVE
        if why := answer.incomplete:
            log.warning(
                "opencode transcript is %s: inconclusive (raise transcript_max_bytes or lower "
                "transcript_limit)",
                why,
                extra={"entry": entry.id},
            )
            return Verdict.INCONCLUSIVE
        try:
            messages = answer.json()
            return self._judge(messages, entry)
        except (ValueError, TypeError, KeyError, AttributeError):
            return Verdict.INCONCLUSIVE

    def _judge(self, messages: list[dict[str, Any]], entry: Entry) -> Verdict:
        suffix = _suffix(entry.id)
        since = to_ms(entry.last_attempt_at) - _CLOCK_SKEW_MS if entry.last_attempt_at else 0
        oldest: int | None = None
        for m in messages:
            info = m["info"]
            created = int(info["time"]["created"])
            oldest = created if oldest is None else min(oldest, created)
            if info["role"] != "user":
                continue
            if str(info["id"]).endswith(suffix):
                return Verdict.DELIVERED
            texts = [p.get("text") for p in m.get("parts", []) if p.get("type") == "text"]
            if created >= since and entry.text in texts:
                return Verdict.DELIVERED
        if len(messages) >= self._limit and oldest is not None and oldest > since:
            return Verdict.INCONCLUSIVE  # the send window is older than the page we read
        return Verdict.ABSENT

    async def aclose(self) -> None:
        """Stop the event streams and close the clients this deliverer made."""
        await self._streams.close()
        await self._servers.aclose()
