"""opencode turns: the send is ``prompt_async`` and hands back a ``Turn``; the turn's end is
learned from one event stream per opencode server, after a cut, after opencode restarts, after an
abort; every byte of that stream is hostile.

Against a REAL ``opencode serve`` 1.18.33 (offline, with the fake model: ``[sleep N]`` makes
its answer wait N s), and, for what a real opencode will not do (answer garbage, end a turn
before its send is answered, hold sends open), against a stand-in HTTP server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import tracemalloc
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager as AsyncContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import valkey.asyncio as valkey_async

from prompt_outbox import Entry, Outbox
from prompt_outbox.core.callbacks import Turn, TurnEnd, TurnState, TurnWatcher
from prompt_outbox.core.errors import TransientDeliveryError
from prompt_outbox.deliver import (
    OpencodeDeliverer,
    OpencodeTarget,
    TargetResolver,
    opencode_events,
    static_targets,
    template_targets,
)
from prompt_outbox.deliver.answer import MiB
from prompt_outbox.deliver.opencode import message_id
from prompt_outbox.deliver.opencode_events import TurnStreams
from prompt_outbox.deliver.opencode_servers import Servers
from prompt_outbox.deliver.sse_events import SSEParser, session_change
from prompt_outbox.embedded import free_port
from tests.fake_model import FakeModel
from tests.opencode_server import OpencodeServer
from tests.support.tunables import FAST
from tests.support.waiting import eventually, holds
from tests.tcp_proxy import tcp_proxy

WS = "ws"


class Ends:
    """An ``ended`` callback that records each call and answers as ``Outbox.end_turn``:
    ``answers[turn]`` first, in order, then ended True."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.answers: dict[str, list[TurnEnd]] = {}

    async def __call__(self, ws: str, ses: str, turn: str) -> TurnEnd:
        self.calls.append((ws, ses, turn))
        queued = self.answers.get(turn)
        return queued.pop(0) if queued else TurnEnd(True, 1.0)


def entry(text: str) -> Entry:
    now = datetime.now(UTC)
    return Entry(uuid.uuid4().hex[:16], "c1", "u", text, now, last_attempt_at=now)


def assistant_of(server: OpencodeServer, ses: str, user_id: str) -> dict[str, object] | None:
    """The assistant message answering our user message, from the transcript."""
    for m in server.transcript(ses):
        info = m["info"]
        assert isinstance(info, dict)
        if info["role"] == "assistant" and info.get("parentID") == user_id:
            return info
    return None


def completed(info: dict[str, object] | None) -> bool:
    return info is not None and "completed" in info["time"]  # type: ignore[operator]


def watching(url: str, **options: float) -> AsyncContextManager[tuple[OpencodeDeliverer, Ends]]:
    """A deliverer of one tenant on ``url`` (one workspace: ``allow_shared_sessions``)."""
    return watching_with(template_targets(url, allow_shared_sessions=True), **options)


@contextlib.asynccontextmanager
async def watching_with(
    targets: TargetResolver, **options: float
) -> AsyncIterator[tuple[OpencodeDeliverer, Ends]]:
    deliverer = OpencodeDeliverer(targets, **options)  # type: ignore[arg-type]
    ends = Ends()
    deliverer.watch_turns(ends)
    try:
        yield deliverer, ends
    finally:
        await deliverer.aclose()


# -- against a real opencode ------------------------------------------------------------------


async def test_a_send_hands_back_a_turn_and_its_end_is_reported_once(
    opencode: OpencodeServer, fake_model: FakeModel
) -> None:
    ses = opencode.new_session()
    first = entry(f"[sleep 4] a long turn {uuid.uuid4()}")
    async with watching(opencode.url) as (deliverer, ends):
        assert isinstance(deliverer, TurnWatcher)
        turn = await deliverer(WS, ses, first)
        # The send came back while the model still sleeps: the turn goes on without us.
        assert turn == Turn(message_id(first))
        assert not completed(assistant_of(opencode, ses, turn.id))
        assert ends.calls == []
        assert await deliverer.turn_state(WS, ses, turn.id) is TurnState.RUNNING
        await eventually(lambda: holds(ends.calls == [(WS, ses, turn.id)]), within=30)
        # Reported after the assistant message completed, never before.
        assert completed(assistant_of(opencode, ses, turn.id))
        assert await deliverer.turn_state(WS, ses, turn.id) is TurnState.ENDED
        assert deliverer.watched_turns == 0
        # A second turn of the session: reported once too, and the first not again.
        second = await deliverer(WS, ses, entry(f"a short one {uuid.uuid4()}"))
        await eventually(lambda: holds(len(ends.calls) == 2), within=30)
        assert ends.calls == [(WS, ses, turn.id), (WS, ses, second.id)]
    assert fake_model.user_turns(first.text) == 1


async def test_turn_state_without_a_stream_asks_the_status(opencode: OpencodeServer) -> None:
    ses = opencode.new_session()
    deliverer = OpencodeDeliverer(
        template_targets(opencode.url, allow_shared_sessions=True)
    )  # watch_turns never called
    try:
        turn = await deliverer(WS, ses, entry(f"[sleep 3] {uuid.uuid4()}"))
        assert await deliverer.turn_state(WS, ses, turn.id) is TurnState.RUNNING
        await eventually(lambda: holds(completed(assistant_of(opencode, ses, turn.id))), within=30)
        assert await deliverer.turn_state(WS, ses, turn.id) is TurnState.ENDED
        assert deliverer.watched_turns == 0  # nothing is watched without a callback
    finally:
        await deliverer.aclose()


async def test_the_end_is_learned_after_the_event_stream_was_cut_mid_turn(
    opencode: OpencodeServer,
) -> None:
    ses = opencode.new_session()
    async with (
        tcp_proxy(opencode.port) as proxy,
        watching(proxy.url) as (deliverer, ends),
    ):
        turn = await deliverer(WS, ses, entry(f"[sleep 4] {uuid.uuid4()}"))
        await eventually(lambda: holds(proxy.connections >= 2))  # the send and the stream
        assert await deliverer.turn_state(WS, ses, turn.id) is TurnState.RUNNING
        # Cut the stream and keep opencode out of reach until the turn is over: its idle
        # event goes to nobody, and the stream has no replay.
        proxy.refusing = True
        proxy.cut()
        await eventually(lambda: holds(completed(assistant_of(opencode, ses, turn.id))), within=30)
        assert ends.calls == []
        assert await deliverer.turn_state(WS, ses, turn.id) is TurnState.UNKNOWN
        proxy.refusing = False
        # The reconnect reads /session/status: the session is no longer busy.
        await eventually(lambda: holds(ends.calls == [(WS, ses, turn.id)]), within=30)


async def test_opencode_killed_and_restarted_mid_turn_ends_the_turn(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    server = OpencodeServer(tmp_path / "oc", fake_model.base_url)
    server.start()
    try:
        ses = server.new_session()
        async with watching(server.url) as (deliverer, ends):
            turn = await deliverer(WS, ses, entry(f"[sleep 30] {uuid.uuid4()}"))
            assert await deliverer.turn_state(WS, ses, turn.id) is TurnState.RUNNING
            server.stop()  # kill -9: the turn dies with it, and nothing resumes it

            async def unknown() -> bool:
                return await deliverer.turn_state(WS, ses, turn.id) is TurnState.UNKNOWN

            await eventually(unknown)  # once the stream saw the cut
            assert ends.calls == []
            server.start()
            await eventually(lambda: holds(ends.calls == [(WS, ses, turn.id)]), within=30)
            assert await deliverer.turn_state(WS, ses, turn.id) is TurnState.ENDED
    finally:
        server.stop()


async def test_an_abort_ends_a_running_turn(opencode: OpencodeServer) -> None:
    ses = opencode.new_session()
    async with watching(opencode.url) as (deliverer, ends):
        turn = await deliverer(WS, ses, entry(f"[sleep 30] {uuid.uuid4()}"))
        assert await deliverer.turn_state(WS, ses, turn.id) is TurnState.RUNNING
        await deliverer.abort(WS, ses)
        await eventually(lambda: holds(ends.calls == [(WS, ses, turn.id)]), within=20)
    info = assistant_of(opencode, ses, turn.id)
    assert info is not None and info["error"]["name"] == "MessageAbortedError"  # type: ignore[index]


async def test_through_the_run_loop_the_next_prompt_waits_for_the_turn(
    client: valkey_async.Valkey, opencode: OpencodeServer, fake_model: FakeModel
) -> None:
    """The case that made turns necessary, end to end: A's turn (4 s) is far longer than every
    timeout in the stack (1 s), yet B reaches opencode only after A's turn completed, and
    each prompt runs once. The old deliverer's send timed out, was verified delivered, and B
    went into A's running turn."""
    outbox = Outbox(client, dataclasses.replace(FAST, delivery_timeout=1.0))
    deliverer = OpencodeDeliverer(
        template_targets(opencode.url, allow_shared_sessions=True), timeout=1.0
    )
    outbox.set_verifier(deliverer.verify)
    ses = opencode.new_session()
    a, b = f"[sleep 4] A {uuid.uuid4()}", f"B {uuid.uuid4()}"
    async with outbox.running(deliverer):
        await outbox.accept(WS, ses, "u1", "c1", a)
        await outbox.accept(WS, ses, "u1", "c2", b)

        async def drained() -> bool:
            return await outbox.list(WS, ses) == []

        await eventually(lambda: holds(fake_model.user_turns(b) == 1), within=40)
        await eventually(drained)
    await deliverer.aclose()
    one_after_the_other(opencode, fake_model, ses, a, b)


async def test_serve_holds_the_next_prompt_for_a_turn_longer_than_its_timeout(
    opencode: OpencodeServer, fake_model: FakeModel, tmp_path: Path
) -> None:
    """The case that made turns necessary, as an outside harness ran it: ``prompt-outbox serve
    --opencode-url ... --opencode-timeout 2`` and two prompts POSTed for one session, A a 6 s
    turn. Before, A's send timed out, was verified delivered, and B went into A's running
    turn; nothing over HTTP could say the session was in turn."""
    from tests.support.serve import service, wait_healthy

    ses, port = opencode.new_session(), free_port()
    a, b = f"[sleep 6] A {uuid.uuid4()}", f"B {uuid.uuid4()}"
    args = ["--no-auth", "--port", str(port), "--data-dir", str(tmp_path)]
    base = f"http://127.0.0.1:{port}/v1/workspaces/{WS}/sessions/{ses}"
    one_tenant = {"PROMPT_OUTBOX_OPENCODE_ALLOW_SHARED_SESSIONS": "1"}  # the flag's variable
    with service([*args, "--opencode-url", opencode.url, "--opencode-timeout", "2"], one_tenant):
        wait_healthy(port)
        async with httpx.AsyncClient(base_url=base) as http:
            ids = []
            for n, text in enumerate((a, b)):
                r = await http.post("/prompts", json={"clientMessageID": f"m{n}", "text": text})
                assert r.status_code == 202, r.text
                ids.append(r.json()["id"])

            async def in_turn() -> Any:
                r = await http.get("/turn")
                assert r.status_code in (200, 404), r.text
                return r.json() if r.status_code == 200 else None

            async def entries() -> Any:
                return (await http.get("/prompts")).json()["entries"]

            async def drained() -> bool:
                return not await entries()

            # While A's turn runs: the route names it, and B waits behind it saying so.
            held = await eventually(in_turn, within=30, interval=0.05)
            waiting = await entries()
            assert [e["id"] for e in waiting] == ids[1:], waiting
            assert isinstance(waiting[0].get("inTurnFor"), int), waiting
            assert held["entry"] == ids[0] and held["why"] == "", held
            await eventually(lambda: holds(fake_model.user_turns(b) == 1), within=40)
            await eventually(drained, within=30, interval=0.05)
    # opencode's turn ID is A's user message (prompt_async's entry-derived messageID).
    assert held["turn"] == one_after_the_other(opencode, fake_model, ses, a, b)


def one_after_the_other(server: OpencodeServer, model: FakeModel, ses: str, a: str, b: str) -> str:
    """Assert, from opencode's transcript, that A and B each ran once and that B's user
    message was created after A's turn (its assistant message) completed; A's message ID."""
    transcript: list[Any] = server.transcript(ses)
    users = [m for m in transcript if m["info"]["role"] == "user"]
    assert [[p["text"] for p in m["parts"] if p["type"] == "text"] for m in users] == [[a], [b]]
    first, second = (m["info"] for m in users)
    a_done: Any = assistant_of(server, ses, str(first["id"]))
    assert completed(a_done)
    assert second["time"]["created"] >= a_done["time"]["completed"]
    assert model.user_turns(a) == 1 and model.user_turns(b) == 1
    return str(first["id"])


# -- a stand-in opencode: what a real one does not do on demand -----------------------------


Handler = Callable[[], Awaitable[tuple[int, bytes]]]


class StandIn:
    """A loopback HTTP server in the test's loop: ``GET /event`` opens a stream the test
    writes to (``emit``), ``GET /session/status`` answers ``status``, ``POST
    .../prompt_async`` runs ``on_prompt`` (default: 204). Under any path prefix too, alike
    (opencode servers behind a proxy): ``stream_paths`` has the prefix of each stream open."""

    def __init__(self) -> None:
        self.status: dict[str, object] = {}
        self.on_prompt: Handler | None = None
        self.streams: list[asyncio.StreamWriter] = []
        self.stream_opens = 0
        self.stream_paths: list[str] = []
        self.status_reads = 0
        self.prompts = 0
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def emit(self, data: bytes) -> None:
        for writer in list(self.streams):
            writer.write(data)
            await writer.drain()

    async def event(self, kind: str, session: str, status: str | None = None) -> None:
        props: dict[str, object] = {"sessionID": session}
        if status is not None:
            props["status"] = {"type": status}
        body = json.dumps({"id": "evt_1", "type": kind, "properties": props})
        await self.emit(f"data: {body}\n\n".encode())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *lines = head.decode("latin-1").split("\r\n")
                _, path, _ = line.split(" ", 2)
                size = 0
                for h in lines:
                    name, _, value = h.partition(":")
                    if name.strip().lower() == "content-length":
                        size = int(value)
                await reader.readexactly(size)
                path = path.partition("?")[0]
                if path.endswith("/event"):
                    self.stream_opens += 1
                    self.stream_paths.append(path.removesuffix("/event"))
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                        b"Connection: close\r\n\r\n"
                    )
                    self.streams.append(writer)
                    await reader.read()  # until the client goes
                    return
                if path.endswith("/session/status"):
                    self.status_reads += 1
                    status, body = 200, json.dumps(self.status).encode()
                elif path.endswith("/prompt_async"):
                    self.prompts += 1
                    status, body = (204, b"") if self.on_prompt is None else await self.on_prompt()
                else:
                    status, body = 404, b"no such route"
                writer.write(
                    f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            if writer in self.streams:
                self.streams.remove(writer)
            writer.transport.abort()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def close(self) -> None:
        for writer in self.streams:
            writer.transport.abort()
        assert self._server is not None
        self._server.close()


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    agent = StandIn()
    await agent.start()
    yield agent
    await agent.close()


async def test_a_turn_that_ends_before_its_send_is_answered_is_reported(
    stand_in: StandIn,
) -> None:
    """The watch begins before the send: an idle that comes before the 204 counts. The
    outbox holds the turn only once the send returned, so a first "no such turn" is asked
    again (today's code, watching after the send, never reported this turn)."""
    async with watching(stand_in.url) as (deliverer, ends):
        stand_in.status = {"ses_a": {"type": "busy"}}
        warm = await deliverer(WS, "ses_a", entry("warm the stream up"))
        await eventually(lambda: holds(len(stand_in.streams) == 1))

        async def idle_first() -> tuple[int, bytes]:
            await stand_in.event("session.status", "ses_a", "busy")
            await stand_in.event("session.idle", "ses_a")
            stand_in.status = {}
            await asyncio.sleep(0.2)  # the idle is read before the 204 is
            return 204, b""

        stand_in.on_prompt = idle_first
        short = entry("a very short turn")
        ends.answers[message_id(short)] = [TurnEnd(False), TurnEnd(False)]  # not held yet
        turn = await deliverer(WS, "ses_a", short)
        await eventually(lambda: holds(len(ends.calls) >= 4))
        # The idle ended both turns of the session; the second was asked until it was held.
        assert ends.calls.count((WS, "ses_a", warm.id)) == 1
        assert ends.calls.count((WS, "ses_a", turn.id)) == 3


async def test_a_turn_not_busy_yet_after_its_send_is_not_ended_by_a_status_read(
    stand_in: StandIn,
) -> None:
    """prompt_async answers 204 before the session is busy (on a fresh opencode, ~0.6 s
    before). A reconnect's status read in that gap must not end the turn: the next prompt
    would go into it. Here the stream is cut as the send is answered, and the status says
    nothing is busy until the turn is under way."""
    async with watching(stand_in.url) as (deliverer, ends):

        async def cut_then_answer() -> tuple[int, bytes]:
            await eventually(lambda: holds(len(stand_in.streams) == 1))
            for writer in list(stand_in.streams):
                writer.transport.abort()
            return 204, b""

        stand_in.on_prompt = cut_then_answer
        turn = await deliverer(WS, "ses_a", entry("hello"))
        reads = stand_in.status_reads
        await eventually(lambda: holds(stand_in.stream_opens == 2 and len(stand_in.streams) == 1))
        await eventually(lambda: holds(stand_in.status_reads > reads))  # the reconnect's read
        await asyncio.sleep(0.1)  # what that read decides is done in the same loop turn
        assert ends.calls == []
        stand_in.status = {"ses_a": {"type": "busy"}}
        await stand_in.event("session.status", "ses_a", "busy")
        await stand_in.event("session.idle", "ses_a")
        await eventually(lambda: holds(ends.calls == [(WS, "ses_a", turn.id)]))


async def test_a_late_idle_of_the_last_turn_does_not_end_the_next(stand_in: StandIn) -> None:
    """opencode ends a turn with two idles (``session.status`` idle, then ``session.idle``)
    and sends one more after an abort. The first ends A and B is sent at once; an idle that
    comes after B's send, before B went busy, is A's and must not end B, or the prompt after
    B would go into B's running turn (the old watcher ended every watched turn on any idle).
    """
    async with watching(stand_in.url) as (deliverer, ends):
        a = await deliverer(WS, "ses_a", entry("A"))
        await eventually(lambda: holds(len(stand_in.streams) == 1))
        await stand_in.event("session.status", "ses_a", "busy")
        await stand_in.event("session.status", "ses_a", "idle")
        await eventually(lambda: holds(ends.calls == [(WS, "ses_a", a.id)]))
        b = await deliverer(WS, "ses_a", entry("B"))
        await stand_in.event("session.idle", "ses_a")  # A's second idle, after B's send
        await asyncio.sleep(0.3)
        assert ends.calls == [(WS, "ses_a", a.id)]
        assert await deliverer.turn_state(WS, "ses_a", b.id) is TurnState.RUNNING
        await stand_in.event("session.status", "ses_a", "busy")
        await stand_in.event("session.status", "ses_a", "idle")
        await eventually(lambda: holds(ends.calls[1:] == [(WS, "ses_a", b.id)]))


async def test_an_idle_for_a_turn_never_seen_busy_is_checked_by_a_status_read(
    stand_in: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn that ends before the stream saw it busy (it failed at once) is not lost: the
    idle asks for a status read once the turn is of age, and that read ends it."""
    monkeypatch.setattr(opencode_events, "SEND_GRACE", 0.3)
    async with watching(stand_in.url) as (deliverer, ends):
        stand_in.status = {"ses_w": {"type": "busy"}}
        await deliverer(WS, "ses_w", entry("keeps the stream open"))
        await eventually(lambda: holds(len(stand_in.streams) == 1))
        await asyncio.sleep(0.5)  # the connect's reads are done: only the idle asks again
        turn = await deliverer(WS, "ses_a", entry("fails at once"))
        reads = stand_in.status_reads
        await stand_in.event("session.idle", "ses_a")
        await eventually(lambda: holds(ends.calls == [(WS, "ses_a", turn.id)]))
        assert stand_in.status_reads > reads


async def test_checks_of_many_turns_share_one_status_read(stand_in: StandIn) -> None:
    """A worker asks about every turn it holds each check interval; with no live stream
    (here: no turn watched), 200 turns of one server asked at once cost one status read."""
    deliverer = OpencodeDeliverer(template_targets(stand_in.url, allow_shared_sessions=True))
    try:
        stand_in.status = {f"ses_{i}": {"type": "busy"} for i in range(0, 200, 2)}
        states = await asyncio.gather(
            *(deliverer.turn_state(WS, f"ses_{i}", f"msg_{i}") for i in range(200))
        )
        assert states == [TurnState.RUNNING, TurnState.ENDED] * 100
        assert stand_in.status_reads == 1
    finally:
        await deliverer.aclose()


async def test_a_definitive_failure_forgets_the_turn_and_an_old_opencode_is_named(
    stand_in: StandIn,
) -> None:
    async with watching(stand_in.url) as (deliverer, _):

        async def not_found() -> tuple[int, bytes]:
            return 404, b"404 Not Found"  # an opencode without prompt_async

        stand_in.on_prompt = not_found
        with pytest.raises(RuntimeError, match="no prompt_async route"):
            await deliverer(WS, "ses_a", entry("hello"))
        assert deliverer.watched_turns == 0

        async def no_session() -> tuple[int, bytes]:
            return 404, b'{"name":"NotFoundError","data":{"message":"Session not found"}}'

        stand_in.on_prompt = no_session
        with pytest.raises(RuntimeError, match="404") as caught:
            await deliverer(WS, "ses_a", entry("hello"))
        assert "prompt_async route" not in str(caught.value)
        assert deliverer.watched_turns == 0


async def test_a_hostile_event_stream_is_bounded_and_does_not_kill_the_watcher(
    stand_in: StandIn,
) -> None:
    """A 10 MB line, garbage JSON, deep nesting, bad UTF-8, unknown and malformed events:
    none is buffered past the bound (64 KiB here), none stops the stream; the idle that
    follows still ends the turn."""
    bound = 64 * 1024
    async with watching(stand_in.url, event_max_bytes=bound) as (deliverer, ends):
        stand_in.status = {"ses_a": {"type": "busy"}}
        turn = await deliverer(WS, "ses_a", entry("hello"))
        await eventually(lambda: holds(len(stand_in.streams) == 1))
        gc.collect()
        tracemalloc.start()
        try:
            base, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            piece = b"x" * 65536
            await stand_in.emit(b"data: ")
            for _ in range(160):  # 10 MiB in one line, then the line ends
                await stand_in.emit(piece)
            await stand_in.emit(b"\n\n")
            for junk in (
                b"data: {not json\n\n",
                b"data: " + b"[" * 100_000 + b"\n\n",  # "session." absent: never parsed
                b'data: {"type":"session.idle","properties":' + b"[" * 50_000 + b"\n\n",
                b'data: {"type":"session.idle","properties":{"sessionID":7}}\n\n',
                b'data: ["session.idle"]\n\n',
                b"data: \xff\xfe\xfd session.\n\n",
                b'event: weird\ndata: {"type":"session.unknown","properties":{}}\n\n',
                b": a comment\nretry: 5\nid: 9\n\n",
            ):
                await stand_in.emit(junk)
            assert ends.calls == []
            await stand_in.event("session.status", "ses_a", "busy")
            await stand_in.event("session.idle", "ses_a")
            await eventually(lambda: holds(ends.calls == [(WS, "ses_a", turn.id)]))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        # What it read of the 10 MiB line is gone; what it held at once is a few bounds.
        assert peak - base < 2 * MiB, peak - base
        assert stand_in.stream_opens == 1  # the stream was never dropped


async def test_each_origin_has_its_own_pool(stand_in: StandIn) -> None:
    """Sends held open on one opencode take that origin's connections only: another
    origin's send goes at once, and a send that finds no free connection within
    ``connect_timeout`` is transient (nothing was sent), also to another base URL on the
    same origin (one pool per origin, whatever the paths). The old code shared one pool of
    100 across every server, and sent the third prompt into the held server too."""
    other = StandIn()
    await other.start()
    release = asyncio.Event()

    async def held() -> tuple[int, bytes]:
        await release.wait()
        return 204, b""

    stand_in.on_prompt = held
    urls = {"a": stand_in.url, "b": other.url}
    deliverer = OpencodeDeliverer(
        lambda ws, ses: template_targets(urls[ws], allow_shared_sessions=True)(ws, ses),
        max_connections_per_server=2,  # the origin's requests (event streams have their own)
        connect_timeout=0.5,
    )
    try:
        sends = [asyncio.ensure_future(deliverer("a", f"ses_{i}", entry("held"))) for i in (1, 2)]
        await eventually(lambda: holds(stand_in.prompts == 2))
        assert isinstance(await deliverer("b", "ses_b", entry("elsewhere")), Turn)
        async with asyncio.timeout(30):  # the old code sent it, and it hung with the rest
            with pytest.raises(TransientDeliveryError):
                await deliverer("a", "ses_4", entry("no free connection"))
            urls["a"] = stand_in.url + "/another/prefix"
            with pytest.raises(TransientDeliveryError):
                await deliverer("a", "ses_5", entry("no free connection on that origin"))
        assert stand_in.prompts == 2
        assert deliverer.clients_open == 2  # one request pool per origin
        release.set()
        assert all(isinstance(t, Turn) for t in await asyncio.gather(*sends))
    finally:
        release.set()
        await deliverer.aclose()
        await other.close()


def open_files() -> int:
    """This process's open file descriptors (sockets included): the stand-in's ends too."""
    return len(os.listdir("/proc/self/fd"))


async def test_many_session_urls_keep_one_client_and_idle_ones_close(stand_in: StandIn) -> None:
    """The finding: with ``{session}`` in the URL every session name made an HTTP client of
    its own, kept for ever (600 names took serve from 20 to 1,230 open files). Now the bases
    of one origin share its client, at most ``max_servers`` are kept (a new one lets the
    idlest idle one go), and once idle for ``idle_timeout`` they are let go and the client
    closed: open files back where they were. The old code held 400 clients and ~800 files."""
    deliverer = OpencodeDeliverer(
        template_targets(stand_in.url + "/{workspace}/{session}"),
        max_servers=8,
        idle_timeout=0.5,
    )
    before, most = open_files(), 0
    try:
        for batch in range(50):  # 400 session names, 8 sends at once
            names = [f"s{batch}-{i}" for i in range(8)]
            await asyncio.gather(*(deliverer(WS, n, entry("hi")) for n in names))
            assert deliverer.servers_kept <= 8 and deliverer.clients_open == 1
            most = max(most, open_files() - before)
        assert stand_in.prompts == 400
        assert most <= 40, most  # 8 requests at once: both ends of ~8 connections
        await eventually(
            lambda: holds(deliverer.servers_kept == 0 and deliverer.clients_open == 0), within=30
        )
        await eventually(lambda: holds(open_files() <= before), within=30)
    finally:
        await deliverer.aclose()


async def test_watched_turns_hold_their_streams_and_idle_servers_are_let_go(
    stand_in: StandIn,
) -> None:
    """One event stream per server (base URL) kept. A watched turn holds its server: its
    stream outlives the idle timeout, and its end is still heard. A send to one more server
    when all ``max_servers`` hold watched turns fails transient and sends nothing; once turns
    end, their servers are idle: the idlest is let go for a new one, and the rest once idle
    for ``idle_timeout`` (their streams closed, the origin's clients too at the end)."""
    deliverer = OpencodeDeliverer(
        template_targets(stand_in.url + "/{workspace}/{session}"),
        max_servers=4,
        idle_timeout=0.5,
    )
    ends = Ends()
    deliverer.watch_turns(ends)
    stand_in.status = {f"s{i}": {"type": "busy"} for i in range(6)}
    try:
        turns = [await deliverer(WS, f"s{i}", entry("a long turn")) for i in range(4)]
        await eventually(lambda: holds(len(stand_in.streams) == 4))
        assert deliverer.event_streams == 4 and deliverer.servers_kept == 4
        with pytest.raises(TransientDeliveryError, match="max_servers"):
            await deliverer(WS, "s4", entry("a fifth server"))
        assert stand_in.prompts == 4 and deliverer.watched_turns == 4

        async def end(session: str) -> None:
            stand_in.status.pop(session)
            await stand_in.event("session.status", session, "busy")
            await stand_in.event("session.idle", session)

        for i in (1, 2, 3):
            await end(f"s{i}")
        await eventually(lambda: holds(len(ends.calls) == 3))
        fifth = await deliverer(WS, "s4", entry("now there is room"))
        assert deliverer.servers_kept <= 4
        # s1-s3 idle past the timeout: let go, their streams closed. s0 and s4 stay.
        await eventually(lambda: holds(len(stand_in.streams) == 2), within=30)
        await asyncio.sleep(1.0)  # twice the idle timeout: watched turns keep their streams
        assert deliverer.servers_kept == 2 and deliverer.event_streams == 2
        assert len(stand_in.streams) == 2
        await end("s0")
        await end("s4")
        await eventually(lambda: holds(len(ends.calls) == 5))
        assert {c[2] for c in ends.calls} == {t.id for t in [*turns, fifth]}
        await eventually(
            lambda: holds(deliverer.servers_kept == 0 and deliverer.clients_open == 0), within=30
        )
        await eventually(lambda: holds(not stand_in.streams))
    finally:
        await deliverer.aclose()


async def test_one_event_stream_per_server_path_on_an_origin(stand_in: StandIn) -> None:
    """Two paths on one origin may be two opencode servers behind a proxy: a stream each.
    One server spelled two ways (a trailing slash) is one stream; the origin has one client
    for requests and one for streams, whatever its paths."""
    targets = static_targets(
        {
            ("w1", "a"): OpencodeTarget(stand_in.url + "/p/", "sa"),
            ("w2", "b"): OpencodeTarget(stand_in.url + "/p", "sb"),
            ("w3", "c"): OpencodeTarget(stand_in.url + "/q", "sc"),
        }
    )
    stand_in.status = {s: {"type": "busy"} for s in ("sa", "sb", "sc")}
    async with watching_with(targets) as (deliverer, _):
        for ws, ses in (("w1", "a"), ("w2", "b"), ("w3", "c")):
            await deliverer(ws, ses, entry("hello"))
        await eventually(lambda: holds(len(stand_in.streams) == 2))
        assert sorted(stand_in.stream_paths) == ["/p", "/q"]
        assert deliverer.event_streams == 2 and deliverer.servers_kept == 2
        assert deliverer.clients_open == 2


# -- the parts, alone -----------------------------------------------------------------------


def test_the_parser_splits_every_line_ending_across_chunks() -> None:
    stream = b'data: {"a":1}\r\ndata: 2\r\rdata: x\n\n: c\nevent: e\ndata:y\r\n\r\n'
    whole = SSEParser().feed(stream)
    assert [(e.event, e.data) for e in whole] == [
        ("message", b'{"a":1}\n2'),
        ("message", b"x"),
        ("e", b"y"),
    ]
    for size in (1, 2, 3, 7):
        parser = SSEParser()
        pieces = [parser.feed(stream[i : i + size]) for i in range(0, len(stream), size)]
        assert [e for p in pieces for e in p] == whole


def test_the_parser_drops_an_event_past_its_bound_and_keeps_the_next() -> None:
    parser = SSEParser(max_bytes=10)
    out = parser.feed(b"data: 0123456789ABC\ndata: ok\n\ndata: 12345\ndata: 67890\n\ndata: b\n\n")
    assert [e.data for e in out] == [b"b"]
    assert parser.skipped == 2


@pytest.mark.parametrize(
    ("data", "want"),
    [
        (b'{"type":"session.idle","properties":{"sessionID":"s"}}', ("s", True)),
        (
            b'{"type":"session.status","properties":{"sessionID":"s","status":{"type":"idle"}}}',
            ("s", True),
        ),
        (
            b'{"type":"session.status","properties":{"sessionID":"s","status":{"type":"busy"}}}',
            ("s", False),
        ),
        (b'{"type":"message.updated","properties":{"sessionID":"s"}}', None),
        (b'{"type":"session.status","properties":{"sessionID":"s","status":"idle"}}', None),
        (b"session.", None),
        (b'{"type":"session.idle","properties":{"sessionID":""}}', None),
    ],
)
def test_session_changes_are_read_from_well_formed_events_only(
    data: bytes, want: tuple[str, bool] | None
) -> None:
    assert session_change(data) == want


async def test_ten_thousand_watched_turns_cost_under_a_kib_each() -> None:
    """A held turn is a record in the table, not a task or a connection: 10,000 of them,
    with IDs of real lengths, cost at most 1 KiB each beyond the empty table."""
    down = f"http://127.0.0.1:{free_port()}"  # its stream only retries: nothing to hold
    client = httpx.AsyncClient()
    servers = Servers(None, borrowed=client, connections=1, max_servers=1, idle_timeout=1.0)
    streams = TurnStreams(servers, timeout=1.0, connect_timeout=1.0)
    streams.start(Ends())
    n = 10_000
    try:
        gc.collect()
        tracemalloc.start()
        before, _ = tracemalloc.get_traced_memory()
        for i in range(n):  # the IDs made here, as each send makes its own: counted
            session, ses = f"ses_{uuid.uuid4().hex[:26]}", f"s{i:07d}-{uuid.uuid4().hex[:8]}"
            turn = f"msg_{i:026d}"
            streams.sent(streams.watch(down, session, "workspace-1", ses, turn))
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert len(streams) == n
        assert (after - before) / n <= 1024, (after - before) / n
    finally:
        await streams.close()
        await servers.aclose()
        await client.aclose()


def test_a_deliverer_is_a_turn_watcher_with_the_documented_defaults() -> None:
    targets = template_targets("http://127.0.0.1:1", allow_shared_sessions=True)
    deliverer = OpencodeDeliverer(targets)
    assert isinstance(deliverer, TurnWatcher)
    assert (deliverer.servers_kept, deliverer.clients_open, deliverer.event_streams) == (0, 0, 0)
    for option, value in [
        ("max_connections_per_server", 0),
        ("event_max_bytes", 0),
        ("max_servers", 0),
        ("idle_timeout", -1.0),
    ]:
        with pytest.raises(ValueError, match=option):
            OpencodeDeliverer(targets, **{option: value})  # type: ignore[arg-type]
