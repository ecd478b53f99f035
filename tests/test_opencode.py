"""The opencode deliverer and verifier against a REAL ``opencode serve`` (offline, with the
fake model server): deliver, a send whose answer is lost verified without a second turn,
opencode down then back, and the response classes. Its turns: tests/test_opencode_turns.py."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import valkey.asyncio as valkey_async

from prompt_outbox import Entry, Outbox, Status, Verdict
from prompt_outbox.core.errors import InvalidId
from prompt_outbox.deliver import OpencodeDeliverer, OpencodeTarget, template_targets
from prompt_outbox.deliver.opencode import (
    InvalidTarget,
    SharedTarget,
    load_targets,
    message_id,
    model_selector,
    part_id,
    static_targets,
)
from prompt_outbox.embedded import free_port
from tests.fake_model import FakeModel
from tests.opencode_server import OpencodeServer
from tests.support.tunables import FAST
from tests.support.waiting import eventually, holds
from tests.tcp_proxy import tcp_proxy

WS = "ws"
# Real turns take a moment on a loaded machine: the outbox's bound must not be what cuts them.
TUNABLES = dataclasses.replace(FAST, delivery_timeout=60.0)


def wired(
    client: valkey_async.Valkey, url: str, seen: list[Entry], timeout: float = 60.0
) -> tuple[Outbox, OpencodeDeliverer]:
    outbox = Outbox(client, TUNABLES)
    deliverer = OpencodeDeliverer(
        template_targets(url, allow_shared_sessions=True), timeout=timeout
    )
    outbox.set_verifier(deliverer.verify)

    async def on_delivered(ws: str, ses: str, entry: Entry) -> None:
        seen.append(entry)

    outbox.set_on_delivered(on_delivered)
    return outbox, deliverer


async def deliver_until(
    outbox: Outbox, ses: str, deliverer: OpencodeDeliverer, done: Callable[[], bool]
) -> None:
    """Step the session (``deliver_once``) until ``done()``: a step that sends an entry and
    leaves its session in turn answers False, so the step's answer cannot say it."""

    async def step() -> bool:
        await outbox.deliver_once(WS, ses, deliverer)
        return done()

    await eventually(step)


def user_messages(server: OpencodeServer, session_id: str) -> list[tuple[str, list[str]]]:
    out = []
    for m in server.transcript(session_id):
        info = m["info"]
        assert isinstance(info, dict)
        if info["role"] == "user":
            parts = m["parts"]
            assert isinstance(parts, list)
            out.append((str(info["id"]), [p["text"] for p in parts if p["type"] == "text"]))
    return out


async def test_delivers_one_turn_with_the_entry_derived_ids_and_model(
    client: valkey_async.Valkey, opencode: OpencodeServer, fake_model: FakeModel
) -> None:
    seen: list[Entry] = []
    outbox, deliverer = wired(client, opencode.url, seen)
    ses = opencode.new_session()
    text = f"hello opencode {uuid.uuid4()}"
    await outbox.accept(WS, ses, "u1", "c1", text, model='"fake/fake-model"')
    await outbox.deliver_once(WS, ses, deliverer)  # the send: the turn goes on
    assert await outbox.list(WS, ses) == []
    [entry] = seen
    # prompt_async answers before the message is stored (~0.6 s on a fresh opencode).
    await eventually(lambda: holds(user_messages(opencode, ses) != []), within=30)
    assert user_messages(opencode, ses) == [(message_id(entry), [text])]
    await eventually(lambda: holds(fake_model.user_turns(text) == 1), within=30)
    await eventually(lambda: holds(len(opencode.transcript(ses)) == 2), within=30)
    assistant = [m["info"] for m in opencode.transcript(ses) if m["info"]["role"] == "assistant"]  # type: ignore[index]
    assert [a["modelID"] for a in assistant] == ["fake-model"]  # type: ignore[index]
    assert await deliverer.verify(WS, ses, entry) is Verdict.DELIVERED
    await deliverer.aclose()


async def test_a_send_whose_answer_is_lost_is_verified_delivered_without_a_second_turn(
    client: valkey_async.Valkey, opencode: OpencodeServer, fake_model: FakeModel
) -> None:
    # The send reaches opencode, but its 204 never comes back (a proxy swallows it): past the
    # deliverer's 1 s timeout the send is ambiguous, and the verifier settles it.
    seen: list[Entry] = []
    ses = opencode.new_session()
    text = f"[sleep 2] a turn whose send is cut {uuid.uuid4()}"
    async with tcp_proxy(opencode.port) as proxy:
        outbox, deliverer = wired(client, proxy.url, seen, timeout=1.0)
        proxy.swallow = True
        await outbox.accept(WS, ses, "u1", "c1", text)
        assert await outbox.deliver_once(WS, ses, deliverer)
        [entry] = await outbox.list(WS, ses)
        assert entry.status is Status.VERIFYING and "timeout" in entry.last_error.lower()
        proxy.swallow = False
        # The verifier finds the message in the transcript: delivered, and never sent again.
        await deliver_until(outbox, ses, deliverer, lambda: bool(seen))
        assert await outbox.list(WS, ses) == [] and [e.id for e in seen] == [entry.id]
        await deliverer.aclose()
    # The turn opencode started completes by itself; the model saw the prompt once.
    await eventually(lambda: holds(len(opencode.transcript(ses)) == 2), within=30)
    assert fake_model.user_turns(text) == 1
    assert [texts for _, texts in user_messages(opencode, ses)] == [[text]]


async def test_an_interrupt_aborts_the_turn_and_its_prompt_counts_as_delivered(
    client: valkey_async.Valkey, opencode: OpencodeServer, fake_model: FakeModel
) -> None:
    # whileBusy interrupt against the real opencode: the first prompt's turn sleeps 30 s in
    # the model; the interrupt asks for an abort (POST /session/{id}/abort), opencode reports
    # the session idle, the deliverer's event stream ends the turn, and the second prompt goes
    # next: after the first turn ended, never into it.
    seen: list[Entry] = []
    worker, deliverer = wired(client, opencode.url, seen)
    api = Outbox(client, TUNABLES)  # the accepting "process": the ask travels by pub/sub
    ses = opencode.new_session()
    first, second = f"[sleep 30] a long turn {uuid.uuid4()}", f"do this instead {uuid.uuid4()}"
    started = time.monotonic()
    async with worker.running(deliverer):
        await api.accept(WS, ses, "u1", "c1", first)
        await eventually(lambda: holds(fake_model.user_turns(first) == 1), within=30)
        await api.accept(WS, ses, "u1", "c2", second, while_busy="interrupt")
        await eventually(lambda: holds(fake_model.user_turns(second) == 1), within=30)
    assert time.monotonic() - started < 25  # the 30 s turn did not run out
    assert [e.text for e in seen] == [first, second]
    assert worker.metrics.aborts.labels(outcome="asked")._value.get() == 1
    # Each prompt reached opencode once, in order; the model saw each once.
    assert [texts for _, texts in user_messages(opencode, ses)] == [[first], [second]]
    assert fake_model.user_turns(first) == 1 and fake_model.user_turns(second) == 1
    infos = [m["info"] for m in opencode.transcript(ses)]
    aborted = [i for i in infos if i["role"] == "assistant" and i.get("error")]  # type: ignore[index,union-attr]
    assert [a["error"]["name"] for a in aborted] == ["MessageAbortedError"]  # type: ignore[index]
    # The second prompt reached opencode after the first turn had ended.
    _, second_user = [i for i in infos if i["role"] == "user"]  # type: ignore[index]
    assert second_user["time"]["created"] >= aborted[0]["time"]["completed"]  # type: ignore[index]
    await deliverer.aclose()


async def test_opencode_down_is_retried_without_an_attempt_then_delivered(
    client: valkey_async.Valkey, tmp_path: Path, fake_model: FakeModel
) -> None:
    server = OpencodeServer(tmp_path / "oc", fake_model.base_url)
    server.start()
    try:
        ses = server.new_session()
        server.stop()
        seen: list[Entry] = []
        outbox, deliverer = wired(client, server.url, seen)
        text = f"sent while opencode is down {uuid.uuid4()}"
        await outbox.accept(WS, ses, "u1", "c1", text)
        assert await outbox.deliver_once(WS, ses, deliverer)
        [entry] = await outbox.list(WS, ses)
        assert (entry.status, entry.attempts, entry.transient_fails) == (Status.PENDING, 0, 1)
        server.start()  # the agent restarts on the same store, with the same session
        await deliver_until(outbox, ses, deliverer, lambda: bool(seen))
        assert await outbox.list(WS, ses) == [] and len(seen) == 1
        await eventually(lambda: holds(fake_model.user_turns(text) == 1), within=30)
        assert [texts for _, texts in user_messages(server, ses)] == [[text]]
        await deliverer.aclose()
    finally:
        server.stop()


async def test_unknown_session_is_a_definitive_failure(
    client: valkey_async.Valkey, opencode: OpencodeServer
) -> None:
    outbox, deliverer = wired(client, opencode.url, [])
    ses = "ses_" + "0" * 26  # well formed, but opencode has no such session: 404
    await outbox.accept(WS, ses, "u1", "c1", "nobody is there")
    assert await outbox.deliver_once(WS, ses, deliverer)
    [entry] = await outbox.list(WS, ses)
    assert (entry.status, entry.attempts) == (Status.PENDING, 1)
    assert "404" in entry.last_error
    await deliverer.aclose()


async def test_verifier_absent_when_never_sent_and_inconclusive_when_down(
    opencode: OpencodeServer,
) -> None:
    ses = opencode.new_session()
    entry = Entry(
        id="0123abcd",
        client_message_id="c",
        user_id="u",
        text="never sent",
        accepted_at=datetime.now(UTC),
        status=Status.VERIFYING,
        last_attempt_at=datetime.now(UTC),
    )
    up = OpencodeDeliverer(template_targets(opencode.url, allow_shared_sessions=True))
    down = OpencodeDeliverer(
        template_targets(f"http://127.0.0.1:{free_port()}", allow_shared_sessions=True)
    )
    unmapped = OpencodeDeliverer(static_targets({}))
    assert await up.verify(WS, ses, entry) is Verdict.ABSENT
    assert await down.verify(WS, ses, entry) is Verdict.INCONCLUSIVE
    assert await unmapped.verify(WS, ses, entry) is Verdict.INCONCLUSIVE
    for d in (up, down, unmapped):
        await d.aclose()


def test_ids_are_deterministic_per_attempt_and_sort_like_opencode_ids() -> None:
    t1 = datetime(2026, 12, 2, 20, 0, 0, tzinfo=UTC)
    t2 = datetime(2026, 12, 2, 20, 0, 1, tzinfo=UTC)
    e = Entry(id="abc", client_message_id="c", user_id="u", text="t", accepted_at=t1)
    first = dataclasses.replace(e, last_attempt_at=t1)
    again = dataclasses.replace(e, last_attempt_at=t2)
    assert message_id(first) == message_id(first) and message_id(first) < message_id(again)
    assert message_id(first)[-14:] == message_id(again)[-14:]  # the entry's own suffix
    assert part_id(first) == "prt_" + message_id(first)[4:]
    assert len(message_id(first)) == len("msg_") + 12 + 14
    with pytest.raises(ValueError):
        message_id(e)


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (None, None),
        ('"openai/gpt-5"', {"providerID": "openai", "modelID": "gpt-5"}),
        ('{"providerID":"p","modelID":"m"}', {"providerID": "p", "modelID": "m"}),
        ('{"provider":"p","model":"a/b"}', {"providerID": "p", "modelID": "a/b"}),
    ],
)
def test_model_selector_mapping(raw: str | None, want: dict[str, str] | None) -> None:
    assert model_selector(raw) == want


@pytest.mark.parametrize("raw", ['"no-slash"', "[]", '{"provider":"p"}', "42", '"/m"'])
def test_unmappable_model_is_a_clear_error(raw: str) -> None:
    with pytest.raises(ValueError, match="cannot map model"):
        model_selector(raw)


def test_static_targets_resolve_and_refuse_unmapped() -> None:
    resolve = static_targets({("w", "s"): OpencodeTarget("http://127.0.0.1:1", "ses_x")})
    assert resolve("w", "s") == OpencodeTarget("http://127.0.0.1:1", "ses_x")
    with pytest.raises(LookupError):
        resolve("w", "other")


def test_serve_delivers_to_opencode_through_the_api(
    opencode: OpencodeServer, fake_model: FakeModel, tmp_path: Path
) -> None:
    import httpx

    from tests.support.serve import service, wait_healthy

    ses = opencode.new_session()
    port = free_port()
    args = ["--no-auth", "--port", str(port), "--data-dir", str(tmp_path)]
    text = f"through the service {uuid.uuid4()}"
    url = f"http://127.0.0.1:{port}/v1/workspaces/{WS}/sessions/{ses}/prompts"
    with service([*args, "--opencode-url", opencode.url, "--opencode-allow-shared-sessions"]):
        wait_healthy(port)
        r = httpx.post(
            url, json={"clientMessageID": "m1", "text": text, "model": "fake/fake-model"}
        )
        assert r.status_code == 202, r.text
        deadline = time.monotonic() + 60
        while httpx.get(url).json()["entries"]:
            assert time.monotonic() < deadline, httpx.get(url).text
            time.sleep(0.1)
    assert [texts for _, texts in user_messages(opencode, ses)] == [[text]]
    assert fake_model.user_turns(text) == 1


# -- path segments (docs/security.md, finding 8): against a real HTTP server recording paths ---


@contextlib.contextmanager
def recording_agent() -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """A real HTTP server on loopback answering every request 200 (an empty transcript for a
    GET), recording each request's method and path exactly as it came on the wire."""
    seen: list[tuple[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append((self.command, self.path))
            body = b"[]" if self.command == "GET" else b'{"info":{}}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def _entry(entry_id: str = "e1") -> Entry:
    now = datetime.now(UTC)
    return Entry(entry_id, "c1", "u", "hi", now, last_attempt_at=now)


async def test_the_agent_gets_each_session_id_as_one_encoded_path_segment() -> None:
    with recording_agent() as (url, seen):
        targets = static_targets(
            {
                (WS, "a.b"): OpencodeTarget(url, "a.b"),
                (WS, "odd"): OpencodeTarget(url, "ses x%y"),  # a hand-written map's odd ID
            }
        )
        deliverer = OpencodeDeliverer(targets)
        try:
            await deliverer(WS, "a.b", _entry())
            await deliverer.abort(WS, "a.b")
            assert await deliverer.verify(WS, "a.b", _entry()) is Verdict.ABSENT
            await deliverer(WS, "odd", _entry())
        finally:
            await deliverer.aclose()
        templated = OpencodeDeliverer(template_targets(url + "/agents/{workspace}/{session}"))
        try:
            await templated(WS, "a.b", _entry())
        finally:
            await templated.aclose()
    assert seen == [
        ("POST", "/session/a.b/prompt_async"),
        ("POST", "/session/a.b/abort"),
        ("GET", "/session/a.b/message?limit=500"),
        ("POST", "/session/ses%20x%25y/prompt_async"),
        ("POST", "/agents/ws/a.b/session/a.b/prompt_async"),
    ]


@pytest.mark.parametrize("bad", ["..", ".", "", "a/b", "../x", "s?x=1", "s#frag"])
def test_a_target_that_is_not_one_path_segment_is_refused_up_front(bad: str) -> None:
    with pytest.raises(InvalidTarget, match="not one path segment"):
        static_targets({(WS, "s1"): OpencodeTarget("http://127.0.0.1:1", bad)})
    with pytest.raises(InvalidTarget):  # a session template that yields it
        template_targets("http://127.0.0.1:1", bad + "{session}" if "/" in bad else bad)


# -- workspaces apart: a mapping that lets two meet in one opencode session is refused ---------


@pytest.mark.parametrize(
    ("url", "session"),
    [
        ("http://127.0.0.1:4096", "{session}"),  # the old default: acme/ses_x = acme2/ses_x
        ("http://127.0.0.1:4096/{session}", "{session}"),  # a path per session, not tenant
        ("http://127.0.0.1:4096", "{workspace}-{session}"),  # a-b/c and a/b-c: one ID
        ("http://127.0.0.1:4096/{workspace}{session}", "main"),  # a/bc and ab/c: one path
    ],
)
def test_a_template_that_lets_two_workspaces_meet_is_refused(url: str, session: str) -> None:
    """The finding: by default acme/ses_x and acme2/ses_x went to one opencode session, so
    a tenant that learned another's session ID wrote into that agent conversation. Such a
    mapping is refused when it is built, saying how to keep workspaces apart, unless
    allowed (one tenant). The old code took every one of these."""
    with pytest.raises(
        SharedTarget, match=r"two workspaces reach one opencode session.*\{workspace\}"
    ):
        template_targets(url, session)
    resolve = template_targets(url, session, allow_shared_sessions=True)
    assert resolve("acme", "ses_x") is not None


@pytest.mark.parametrize(
    ("url", "session"),
    [
        ("http://127.0.0.1:4096/{workspace}", "{session}"),  # a proxy path per workspace
        ("http://{workspace}.agents.internal:4096", "{session}"),  # a server per workspace
        ("http://127.0.0.1:4096/{workspace}-{session}", "{session}"),  # the ID pins session
        ("http://127.0.0.1:4096/{workspace}/{session}", "main"),
        ("http://127.0.0.1:4096", "{workspace}:{session}"),
    ],
)
def test_a_template_that_keeps_workspaces_apart_is_taken(url: str, session: str) -> None:
    resolve = template_targets(url, session)
    a, b = resolve("acme", "ses_x"), resolve("acme2", "ses_x")
    assert a != b


@pytest.mark.parametrize(
    ("url", "session", "why"),
    [
        ("http://h/{workspace!r}", "{session}", "plain"),
        ("http://h/{workspace:.0}", "{session}", "plain"),  # fills in nothing
        ("http://h/{workspace[0]}", "{session}", "plain"),  # a and ab: one letter
        ("http://h/{tenant}", "{session}", "plain"),
        ("http://h/{workspace", "{session}", "expected"),
        ("http://h/{workspace}/..", "{session}", "dot segment"),  # removes the workspace
        ("http://h/?ws={workspace}", "{session}", "query"),
        ("http://{workspace}@h", "{session}", "user"),
        ("ftp://h/{workspace}", "{session}", "http"),
        ("http://h/{workspace}", "{session!s}", "plain"),
    ],
)
def test_a_template_of_other_fields_or_no_server_url_is_refused(
    url: str, session: str, why: str
) -> None:
    with pytest.raises(InvalidTarget, match=why):
        template_targets(url, session)


async def test_two_workspaces_with_one_session_id_reach_two_servers() -> None:
    """The finding's case through the deliverer: acme/ses_x and acme2/ses_x, with the
    workspace in the URL, go to two paths (two servers behind a proxy)."""
    with recording_agent() as (url, seen):
        deliverer = OpencodeDeliverer(template_targets(url + "/{workspace}"))
        try:
            await deliverer("acme", "ses_x", _entry())
            await deliverer("acme2", "ses_x", _entry())
        finally:
            await deliverer.aclose()
    assert seen == [
        ("POST", "/acme/session/ses_x/prompt_async"),
        ("POST", "/acme2/session/ses_x/prompt_async"),
    ]


def test_a_static_map_giving_two_workspaces_one_target_is_refused(tmp_path: Path) -> None:
    """One (server, session) for two workspaces' keys is refused naming both, however the
    server's URL is spelled; within one workspace two keys may share a target."""
    url = "http://127.0.0.1:4096"
    shared = {
        ("acme", "s1"): OpencodeTarget(url, "ses_x"),
        ("acme", "s2"): OpencodeTarget(url + "/", "ses_x"),  # one tenant's: allowed
        ("acme2", "s1"): OpencodeTarget("HTTP://127.0.0.1:4096/", "ses_x"),
    }
    with pytest.raises(SharedTarget, match="acme/s1 and acme2/s1 both name opencode session"):
        static_targets(shared)
    assert static_targets(shared, allow_shared_sessions=True)("acme2", "s1").session_id == "ses_x"
    static_targets({k: v for k, v in shared.items() if k[0] == "acme"})
    path = tmp_path / "targets.json"
    path.write_text(
        json.dumps(
            {
                f"{ws}/{ses}": {"url": t.base_url, "session": t.session_id}
                for (ws, ses), t in shared.items()
            }
        )
    )
    with pytest.raises(SharedTarget, match=f"{path}: acme/s1 and acme2/s1"):
        load_targets(str(path))
    assert load_targets(str(path), allow_shared_sessions=True)("acme", "s2").session_id == "ses_x"


def test_a_targets_file_with_a_dots_session_is_refused_with_its_key(tmp_path: Path) -> None:
    path = tmp_path / "targets.json"
    path.write_text('{"ws/s1": {"url": "http://127.0.0.1:1", "session": ".."}}')
    with pytest.raises(InvalidTarget, match="ws/s1"):
        load_targets(str(path))


async def test_dots_ids_never_reach_the_agent(client: valkey_async.Valkey) -> None:
    outbox = Outbox(client, TUNABLES)
    for bad in (".", "..", "..."):  # our own IDs: refused at the door
        with pytest.raises(InvalidId):
            await outbox.accept(WS, bad, "u", "c1", "hi")
        with pytest.raises(InvalidId):
            await outbox.accept(bad, "s1", "u", "c1", "hi")
    with recording_agent() as (url, seen):

        async def resolver(ws: str, ses: str) -> OpencodeTarget:  # a caller's own mapping
            return OpencodeTarget(url, "..")

        deliverer = OpencodeDeliverer(resolver)
        try:
            await outbox.accept(WS, "s1", "u", "c1", "hi")
            assert await outbox.deliver_once(WS, "s1", deliverer)
        finally:
            await deliverer.aclose()
    # A definitive failure that says why; nothing reached the agent (the code before the path
    # segments were encoded POSTed to /message, the ID's segment normalised away).
    [entry] = await outbox.list(WS, "s1")
    assert (entry.attempts, "not one path segment" in entry.last_error) == (1, True)
    assert seen == []
