"""Clients that stop reading (docs/security.md: a stalled client kept whole answers): what an
answer holds for its client is written an entry at a time and counted against budgets per token
and per process (api/answers.py), and a connection whose client takes nothing for --send-timeout
is aborted (cli/heads.py).

In process for the accounting, the pieces and the send timeout's clock; against a real
``prompt-outbox serve`` with raw sockets (a small receive buffer, and no read after the
answer's head: a stalled phone) for what only the real HTTP stack shows: the abort, the
slot and the budget given back, the refusals per token and per process, and that a client
reading slowly but steadily, or a quiet stream, is never cut."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from prompt_outbox import Entry
from prompt_outbox.api.answers import (
    MAX_PIECE_BYTES,
    RESERVE,
    AnswerBuffers,
    AnswerLimits,
    charge,
    held_size,
    list_body,
)
from prompt_outbox.api.auth import Principal
from prompt_outbox.api.errors import ApiError
from prompt_outbox.api.sse import Item, event_stream, format_item
from prompt_outbox.cli.stalls import StallWatch
from prompt_outbox.core.entry import encode_list
from prompt_outbox.core.events import QueueEvent, QueueReset
from prompt_outbox.embedded import EmbeddedValkey, free_port
from tests.support.events import RAW_MODEL
from tests.support.serve import service, wait_healthy

ALICE = Principal("alice", frozenset({"acme"}))
BOB = Principal("bob", frozenset({"other"}))
NOW = datetime.now(UTC)
CTRL = "\x01" * 34_000
"""The red team's text: 34 000 characters that JSON escapes to six each (204 KB, under the
200 KiB body limit); 25 of them make a 5.1 MB list or reset."""


def _entries(n: int, text: str = CTRL, model: str | None = None) -> list[Entry]:
    return [Entry(f"e{i}", f"c{i}", "u", text, NOW, model=model) for i in range(n)]


# -- the account ------------------------------------------------------------------------------


def test_past_the_tokens_bound_429_past_the_process_bound_503() -> None:
    account = AnswerBuffers(AnswerLimits(per_process=1000, per_token=600))
    first = account.take(ALICE, 400)
    second = account.take(ALICE, 200)  # 600: at the token's bound, not past it
    with pytest.raises(ApiError) as token:
        account.take(ALICE, 1)
    assert (token.value.status, token.value.code) == (429, "answers_buffer_full")
    assert token.value.headers == {"Retry-After": "5"}
    with pytest.raises(ApiError):
        account.admit(ALICE)  # already at its bound: refused before anything is read
    bobs = account.take(BOB, 400)
    with pytest.raises(ApiError) as process:  # bob is within his own bound; the process is not
        account.take(BOB, 1)
    assert (process.value.status, process.value.code) == (503, "answers_buffer_full")
    bobs.close()
    second.close()
    account.admit(ALICE)
    first.release(300)  # alice's answer wrote most of its part
    assert (account.held, account.holding(ALICE)) == (100, 100)
    first.close()
    first.close()  # idempotent
    assert (account.held, account.holding(ALICE)) == (0, 0)


def test_one_answer_larger_than_a_bound_is_served_alone() -> None:
    # A session past the defaults (Tunables.cap raised) is still listed: one at a time.
    account = AnswerBuffers(AnswerLimits(per_process=1000, per_token=100))
    big = account.take(ALICE, 5000)
    with pytest.raises(ApiError) as second:
        account.take(ALICE, 1)
    assert second.value.status == 429
    with pytest.raises(ApiError) as other:
        account.take(BOB, 5000)
    assert other.value.status == 503
    big.close()
    account.take(BOB, 5000).close()


def test_answer_limits_refuse_nonsense() -> None:
    for bad in ({"per_token": 0}, {"per_process": -1}, {"per_token": True}):
        with pytest.raises(ValueError, match="AnswerLimits"):
            AnswerLimits(**bad)  # type: ignore[arg-type]


# -- the pieces -------------------------------------------------------------------------------


async def _body(chunks: AsyncIterator[bytes]) -> list[bytes]:
    return [chunk async for chunk in chunks]


async def test_a_list_is_written_an_entry_at_a_time_each_released_as_it_goes() -> None:
    entries = _entries(25) + _entries(3, "é😀\n" * 5000, RAW_MODEL)
    whole = encode_list(entries)
    account = AnswerBuffers(AnswerLimits())
    hold = account.take(ALICE, charge(entries))
    assert hold.left == RESERVE + sum(held_size(e) for e in entries)
    body = list_body(entries, hold)
    seen: list[tuple[int, int]] = []
    chunks = []
    async for chunk in body:
        chunks.append(chunk)
        seen.append((len(entries), account.held))
    assert b"".join(chunks).decode() == whole  # the same JSON, byte for byte
    assert max(len(c) for c in chunks) <= MAX_PIECE_BYTES and chunks[-1] == b""
    # The list empties and the charge falls as the answer goes (it held the whole answer as
    # one string, and its entries, until the client took it all).
    left, held = zip(*seen, strict=True)
    assert list(left) == sorted(left, reverse=True) and left[-1] == 0 and left[0] >= 27
    assert list(held) == sorted(held, reverse=True) and held[-2] == RESERVE
    assert account.held == 0


async def test_the_reset_goes_out_as_format_item_whole_with_line_breaks_in_models() -> None:
    reset = QueueReset("7-0", _entries(4, "a\r\nb" * 3000, RAW_MODEL))
    whole = format_item(reset)
    update = QueueEvent("7-1", "edited", "e0", _entries(1, CTRL, RAW_MODEL)[0])
    account = AnswerBuffers(AnswerLimits())
    purse = account.purse(ALICE)
    hold = purse.take(charge(reset))

    async def one_update() -> AsyncIterator[Item]:
        yield update

    async def connected() -> bool:
        return False

    chunks = [c async for c in event_stream(reset, one_update(), connected, purse, hold)]
    text = "".join(c if isinstance(c, str) else c.decode() for c in chunks)
    assert text == f"retry: 2000\n\n{whole}{format_item(update)}"
    assert account.held == 0


async def test_a_message_over_the_budget_ends_the_stream_cleanly() -> None:
    account = AnswerBuffers(AnswerLimits(per_process=10 * RESERVE, per_token=2 * RESERVE))
    stalled = account.take(ALICE, RESERVE + 1)  # another of alice's answers, not taken
    update = QueueEvent("7-1", "edited", "e0", _entries(1)[0])
    after = QueueEvent("7-2", "edited", "e0", _entries(1)[0])

    async def updates() -> AsyncIterator[Item]:
        yield update
        yield after

    async def connected() -> bool:
        return False

    chunks = [c async for c in event_stream(None, updates(), connected, account.purse(ALICE))]
    assert chunks == ["retry: 2000\n\n"]  # ended before the update: it resumes by its last ID
    bobs = [c async for c in event_stream(None, updates(), connected, account.purse(BOB))]
    assert len(bobs) > 2  # bob's stream is not alice's budget
    stalled.close()
    assert account.held == 0


# -- the send timeout's clock -----------------------------------------------------------------


async def test_the_stall_watch_cuts_a_client_that_takes_nothing_never_one_that_takes() -> None:
    buffered = [100_000]
    stalled: list[bool] = []
    watch = StallWatch(
        asyncio.get_running_loop(), 0.4, lambda: buffered[0], lambda: stalled.append(True)
    )
    watch.paused()
    for _ in range(12):  # 1.2 s, three times the bound: the client takes a little each 0.1 s
        await asyncio.sleep(0.1)
        buffered[0] -= 10
    assert stalled == []
    await asyncio.sleep(0.4 + 0.1 + 0.2)  # then nothing: cut within the bound plus a step
    assert stalled == [True]
    # Resumed (the client took the buffer under its low mark): not watched.
    watch.paused()
    watch.resumed()
    await asyncio.sleep(0.7)
    assert stalled == [True]
    # Closing with the answer's end still buffered: watched whatever the marks, until taken.
    watch.closing()
    watch.resumed()
    buffered[0] = 0
    await asyncio.sleep(0.7)
    assert stalled == [True]
    buffered[0] = 5
    watch.closing()
    await asyncio.sleep(0.7)
    assert stalled == [True, True]
    watch.paused()
    watch.cancel()  # the connection is gone
    await asyncio.sleep(0.7)
    assert stalled == [True, True]


# -- against a real serve ---------------------------------------------------------------------

SEND_S = 1.0  # --send-timeout in these tests
BOUND = 8.0  # "cut before this": generous, the bound being 1 s (and a quarter more)
TOKENS = {
    "tokens": [
        {"token": "alice-token", "user": "alice", "workspaces": ["acme"]},
        {"token": "bob-token", "user": "bob", "workspaces": ["other"]},
    ]
}
AS_ALICE = {"Authorization": "Bearer alice-token"}
AS_BOB = {"Authorization": "Bearer bob-token"}


def _fill(port: int, session: str, n: int, headers: dict[str, str] | None = None) -> None:
    for i in range(n):
        body = {"clientMessageID": f"big{i}", "text": CTRL}
        r = httpx.post(f"http://127.0.0.1:{port}{session}/prompts", json=body, headers=headers)
        assert r.status_code == 202, r.text


def _stalled(
    port: int, path: str, headers: dict[str, str] | None = None
) -> tuple[socket.socket, dict[str, Any]]:
    """A request whose client reads its answer's head and then nothing (a small receive
    buffer, as a stalled phone): the socket, and the answer's status and head (with the JSON
    of a refusal)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    sock.settimeout(10)
    raw = b""
    while b"\r\n\r\n" not in raw:
        got = sock.recv(1024)
        assert got, "closed without an answer"
        raw += got
    head, _, rest = raw.partition(b"\r\n\r\n")
    status_line, *fields = head.decode("latin-1").split("\r\n")
    answer: dict[str, Any] = {"status": int(status_line.split()[1])}
    answer["headers"] = dict(f.lower().split(": ", 1) for f in fields)
    if answer["status"] != 200:  # a refusal: small, with its length
        while len(rest) < int(answer["headers"]["content-length"]):
            rest += sock.recv(1024)
        answer["json"] = json.loads(rest)
    return sock, answer


def _metric(port: int, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    line = next(line for line in text.splitlines() if line.startswith(name + " "))
    return float(line.split()[1])


def _until(check: Callable[[], bool], within: float = BOUND) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "not within the bound"
        time.sleep(0.05)


def _read_to_the_end(sock: socket.socket) -> int:
    """The bytes left to read on ``sock`` once the server is gone from it (the abort): it
    must end (a reset, or an end of file) within 10 s, not go on with the answer."""
    sock.settimeout(10)
    got = 0
    try:
        while chunk := sock.recv(65536):
            got += len(chunk)
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError("still open") from None
    return got


WHOLE = 25 * 6 * len(CTRL)  # the answer's size on the wire, about


@pytest.mark.parametrize("http_parser", ["httptools", "h11"])
def test_a_stalled_stream_and_list_are_aborted_and_give_back_their_slot_and_bytes(
    valkey_server: EmbeddedValkey, http_parser: str
) -> None:
    # The red team's case: 24 such streams took serve from 69 to 327 MB, held for as long as
    # their clients kept the connections (every stream slot too).
    port = free_port()
    args = ["--no-auth", "--port", str(port), "--valkey-url", valkey_server.url]
    args += ["--http", http_parser, "--send-timeout", str(SEND_S), "--max-streams-per-token", "1"]
    with service(args):
        wait_healthy(port)
        session = f"/v1/workspaces/dev/sessions/big-{port}"
        _fill(port, session, 25)
        stream, opened = _stalled(port, session + "/events")
        listed, answered = _stalled(port, session + "/prompts")
        assert opened["status"] == answered["status"] == 200
        full = httpx.get(f"http://127.0.0.1:{port}{session}/events")
        assert (full.status_code, full.json()["error"]) == (429, "too_many_streams")  # its slot
        _until(lambda: _metric(port, "prompt_outbox_connections_stalled_total") == 2)
        for sock in (stream, listed):
            with sock:
                assert _read_to_the_end(sock) < WHOLE // 2  # cut, far from the whole answer
        assert _metric(port, "prompt_outbox_answer_buffer_bytes") == 0
        with httpx.stream("GET", f"http://127.0.0.1:{port}{session}/events", timeout=10) as r:
            assert r.status_code == 200  # the slot is free again


@pytest.fixture
def budgets(valkey_server: EmbeddedValkey, tmp_path: Path) -> Iterator[int]:
    """A serve whose answers may hold 8 MiB per token, 10 MiB in all, with the send timeout
    far away; its port, with acme (alice's) and other (bob's) sessions ``big`` full of the
    red team's prompts. Each stalled answer of such a session holds about 0.9 MiB, and a read
    of it is charged the 5.1 MB the entries take in Valkey until it settles (the reply's
    bytes, escaped six to a character, are what the read holds while it decodes them)."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    port = free_port()
    args = ["--tokens", str(tokens), "--port", str(port), "--valkey-url", valkey_server.url]
    args += ["--answers-buffer-mib-per-token", "8", "--answers-buffer-mib", "10"]
    args += ["--send-timeout", "120"]
    with service(args):
        wait_healthy(port)
        _fill(port, "/v1/workspaces/acme/sessions/big", 25, AS_ALICE)
        _fill(port, "/v1/workspaces/other/sessions/big", 25, AS_BOB)
        yield port


def _stall_until_refused(
    port: int, workspace: str, headers: dict[str, str], held: list[socket.socket]
) -> dict[str, Any]:
    """Stalled lists and streams of ``workspace``'s big session, one after the other, until
    one is refused: the refusal (each admitted one's socket kept in ``held``)."""
    for n in range(12):
        kind = "prompts" if n % 2 == 0 else "events"
        sock, answer = _stalled(port, f"/v1/workspaces/{workspace}/sessions/big/{kind}", headers)
        held.append(sock)
        if answer["status"] != 200:
            return answer
        time.sleep(0.2)  # the writer stops at the transport's mark
    raise AssertionError("12 stalled answers of one token, none refused")


def test_one_tokens_stalled_answers_are_refused_past_its_budget_while_another_is_served(
    budgets: int,
) -> None:
    port, held = budgets, []
    try:
        alice = _stall_until_refused(port, "acme", AS_ALICE, held)
        assert (alice["status"], alice["json"]["error"]) == (429, "answers_buffer_full")
        # A few held (up to 0.9 MiB each: what the socket took is released), then a read
        # whose 5.1 MB would pass the token's 8 MiB.
        assert alice["headers"]["retry-after"] == "5" and 3 <= len(held) <= 10
        # Bob is served meanwhile, whole: a list and a stream's reset of the same size.
        base = f"http://127.0.0.1:{port}/v1/workspaces/other/sessions/big"
        listed = httpx.get(base + "/prompts", headers=AS_BOB, timeout=30)
        assert listed.status_code == 200 and len(listed.json()["entries"]) == 25
        with httpx.stream("GET", base + "/events", headers=AS_BOB, timeout=30) as events:
            data = next(line for line in events.iter_lines() if line.startswith("data:"))
            assert len(json.loads(data.removeprefix("data: "))["entries"]) == 25
        # Bob's own stalled answers fill the process's budget: 503, whoever asks next.
        bob = _stall_until_refused(port, "other", AS_BOB, held)
        assert (bob["status"], bob["json"]["error"]) == (503, "answers_buffer_full")
        assert _metric(port, "prompt_outbox_answer_buffer_bytes") > 2 * 1024 * 1024
    finally:
        for sock in held:
            sock.close()
    # Clients that go away give their bytes back at once: alice is served again.
    _until(lambda: _metric(port, "prompt_outbox_answer_buffer_bytes") == 0)
    again = httpx.get(
        f"http://127.0.0.1:{port}/v1/workspaces/acme/sessions/big/prompts", headers=AS_ALICE
    )
    assert again.status_code == 200 and len(again.json()["entries"]) == 25


def test_slow_steady_readers_and_quiet_streams_are_never_cut(valkey_server: EmbeddedValkey) -> None:
    port = free_port()
    args = ["--no-auth", "--port", str(port), "--valkey-url", valkey_server.url]
    with service([*args, "--send-timeout", str(SEND_S)]):
        wait_healthy(port)
        base = f"http://127.0.0.1:{port}/v1/workspaces/dev/sessions"
        big, slow = (
            f"/v1/workspaces/dev/sessions/big-{port}",
            f"/v1/workspaces/dev/sessions/slow-{port}",
        )
        small = f"quiet-{port}"
        _fill(port, big, 25)  # more than the kernel's buffers take in: the writer waits
        _fill(port, slow, 8)
        quiet: dict[str, Any] = {}

        def listen() -> None:  # a phone with the queue page open, nothing happening
            with httpx.stream("GET", f"{base}/{small}/events", timeout=30) as events:
                lines = events.iter_lines()
                quiet["reset"] = next(line for line in lines if line.startswith("data:"))
                quiet["keepalive"] = next(line for line in lines if line == ": keepalive")
                quiet["posted"].wait(30)
                quiet["update"] = next(line for line in lines if line.startswith("data:"))

        quiet["posted"] = threading.Event()
        listener = threading.Thread(target=listen)
        listener.start()
        # Stalled: cut at the bound, while the others below go on.
        stalled, opened = _stalled(port, big + "/prompts")
        assert opened["status"] == 200
        # A slow reader: 8 KiB every 50 ms through a 16 KiB window, about 3 s for 1.6 MB
        # (three send timeouts): it takes something in each, and gets all of it.
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        sock.sendall(f"GET {slow}/prompts HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        raw, started = b"", time.monotonic()
        while not raw.endswith(b"\r\n0\r\n\r\n"):
            select.select([sock], [], [], 10)
            chunk = sock.recv(8192)
            assert chunk, f"cut after {len(raw)} bytes"
            raw += chunk
            time.sleep(0.05)
        sock.close()
        assert time.monotonic() - started > 2 * SEND_S
        body = b"".join(_dechunked(raw.partition(b"\r\n\r\n")[2]))
        assert len(json.loads(body)["entries"]) == 8
        with stalled:
            assert _read_to_the_end(stalled) < WHOLE // 2
        assert _metric(port, "prompt_outbox_connections_stalled_total") == 1
        # The quiet stream, past fifteen send timeouts: its keepalive, then an update.
        _until(lambda: "keepalive" in quiet, within=25)
        r = httpx.post(f"{base}/{small}/prompts", json={"clientMessageID": "q1", "text": "t"})
        assert r.status_code == 202
        quiet["posted"].set()
        listener.join(timeout=10)
        assert '"q1"' in quiet["update"] and json.loads(quiet["reset"][6:]) == {"entries": []}


def _dechunked(body: bytes) -> Iterator[bytes]:
    while True:
        size, _, body = body.partition(b"\r\n")
        n = int(size, 16)
        if not n:
            return
        yield body[:n]
        body = body[n + 2 :]
