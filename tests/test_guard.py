"""The HTTP edge (docs/security.md, findings 1, 2, 11 and the request deadline): what a request
must be before anything reads it (api/guard.py), the request head's caps (cli/heads.py), the API
docs off by default, and the deadline on every answer (api/deadline.py).

Through ``create_app`` on httpx's ASGI transport where that shows the rule; against a real
``prompt-outbox serve`` for what only the real HTTP stack shows: the head caps, a body refused
before it is sent, the connection closed, and the deadline while Valkey is frozen or gone."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import select
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from prompt_outbox import Outbox
from prompt_outbox.api import TokenTable, create_app
from prompt_outbox.api.deadline import Deadline
from prompt_outbox.api.guard import SMALL_BODY_BYTES, is_loopback_authority
from prompt_outbox.api.prompts import MAX_BODY_BYTES
from prompt_outbox.api.streams import DEFAULT_PER_PROCESS
from prompt_outbox.cli.heads import (
    CONNECTIONS_BEYOND_STREAMS,
    FILES_BEYOND_CONNECTIONS,
    MAX_HEAD_BYTES,
    MAX_LINE_BYTES,
)
from prompt_outbox.cli.stalls import HeadClock
from prompt_outbox.embedded import EmbeddedValkey, free_port
from tests.replication import ReplicatedPair
from tests.support.agent import SECRET, Agent
from tests.support.api import ALICE, OPS, TOKENS, URL
from tests.support.serve import BIN, service, wait_healthy

pytest_plugins = ["tests.replication_fixtures"]

NO_AUTH = TokenTable({}, disabled=True)
JSON = {"Content-Type": "application/json"}
DEV_URL = "/v1/workspaces/dev/sessions/main/prompts"
DISMISS = "/v1/workspaces/dev/errors/dismiss"
PROMPT = b'{"clientMessageID":"m1","text":"run rm -rf ~"}'

Client = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def asgi(outbox: Outbox) -> Client:
    """An httpx client on ``create_app(outbox, tokens, **options)``, no socket between."""

    def make(
        tokens: TokenTable = TOKENS, host: str = "127.0.0.1:8080", **options: Any
    ) -> AbstractAsyncContextManager[httpx.AsyncClient]:
        transport = httpx.ASGITransport(app=create_app(outbox, tokens, **options))
        return httpx.AsyncClient(transport=transport, base_url=f"http://{host}")

    return make


# -- finding 1: --no-auth serves loopback clients only ---------------------------------------


async def test_no_auth_refuses_the_cross_site_requests_of_the_finding(
    asgi: Client, outbox: Outbox
) -> None:
    # The finding's request: a page of evil.example reached through DNS rebinding (its name
    # now resolves to 127.0.0.1), posting text/plain, which needs no CORS preflight.
    evil = {"Origin": "https://evil.example", "Content-Type": "text/plain"}
    async with asgi(NO_AUTH) as http:
        for path in (DEV_URL, DISMISS):
            rebound = await http.post(
                path, content=PROMPT, headers={**evil, "Host": "rebind.evil.example"}
            )
            assert (rebound.status_code, rebound.json()["error"]) == (403, "host_not_allowed")
            assert rebound.headers["connection"] == "close"
            # From the developer's own browser: the Host is loopback, the Origin gives it away.
            cross = await http.post(path, content=PROMPT, headers=evil)
            assert (cross.status_code, cross.json()["error"]) == (403, "origin_not_allowed")
            # Not a page, but not JSON: 415, auth or no auth.
            plain = await http.post(path, content=PROMPT, headers={"Content-Type": "text/plain"})
            assert (plain.status_code, plain.json()["error"]) == (415, "unsupported_media_type")
        assert await outbox.list("dev", "main") == []  # nothing was queued
        # The same requests from a loopback page (or curl) with JSON go through.
        mine = {**JSON, "Origin": "http://127.0.0.1:8080"}
        assert (await http.post(DEV_URL, content=PROMPT, headers=mine)).status_code == 202
        assert (await http.post(DISMISS, headers={"Origin": "http://localhost:3000"})).json() == {
            "done": 0,
            "busy": [],
        }


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("LocalHost:8080", True),
        ("127.0.0.1", True),
        ("127.0.0.1:8080", True),
        ("127.8.9.10:1", True),
        ("[::1]", True),
        ("[::1]:8080", True),
        ("rebind.evil.example", False),
        ("rebind.evil.example:8080", False),
        ("127.0.0.1.evil.example", False),
        ("localhost.evil.example", False),
        ("localhost.", False),
        ("evil.localhost", False),
        ("0.0.0.0:8080", False),
        ("10.0.0.1", False),
        ("127.1", False),
        ("2130706433", False),
        ("[::2]:8080", False),
        ("[::1", False),
        ("[localhost]", False),
        ("::1", False),
        ("localhost:", False),
        ("localhost:80x", False),
        ("localhost:\xb2", False),
        ("", False),
    ],
)
def test_loopback_names(host: str, loopback: bool) -> None:
    assert is_loopback_authority(host) is loopback


async def test_no_auth_takes_loopback_hosts_only(asgi: Client) -> None:
    async with asgi(NO_AUTH) as http:
        for host in ("localhost", "localhost:9", "127.0.0.1", "127.0.0.2:80", "[::1]:8080"):
            r = await http.get("/healthz", headers={"Host": host})
            assert r.status_code == 200, host
        for host in ("rebind.evil.example", "0.0.0.0", "[::2]"):
            r = await http.get("/healthz", headers={"Host": host})
            assert (r.status_code, r.json()["error"]) == (403, "host_not_allowed"), host


async def test_no_auth_takes_loopback_origins_and_the_listed_ones(asgi: Client) -> None:
    listed = "https://app.example"
    allowed = [
        "http://localhost:3000",
        "http://127.0.0.1:8080",
        "https://127.0.0.1",
        "http://[::1]:5173",
        listed,
    ]
    refused = [
        "null",
        "https://evil.example",
        "http://localhost.evil.example",
        "http://localhost@evil.example",
        "http://localhost:3000/path",
        "file://",
        "https://app.example:8443",  # not the listed origin
        "http://app.example",
        "*",
        "",
    ]
    async with asgi(NO_AUTH, cors_origins=[listed, "*"]) as http:
        for origin in allowed:
            r = await http.post(DISMISS, headers={"Origin": origin})
            assert r.status_code == 200, (origin, r.text)
        for origin in refused:
            r = await http.post(DISMISS, headers={"Origin": origin})
            assert (r.status_code, r.json().get("error")) == (403, "origin_not_allowed"), origin


async def test_with_auth_on_the_token_decides_not_the_host(asgi: Client, outbox: Outbox) -> None:
    # Behind a TLS proxy the Host is the public name, and a page of another origin needs the
    # token (which a browser never adds by itself) and a CORS grant: no host rule with auth.
    async with asgi(TOKENS, host="outbox.example") as http:
        headers = {**ALICE, **JSON, "Origin": "https://evil.example"}
        assert (await http.post(URL, content=PROMPT, headers=headers)).status_code == 202
        no_token = await http.post(URL, content=PROMPT, headers=JSON)
        assert no_token.status_code == 401
        plain = await http.post(
            URL, content=PROMPT, headers={**ALICE, "Content-Type": "text/plain"}
        )
        assert (plain.status_code, plain.json()["error"]) == (415, "unsupported_media_type")
    assert len(await outbox.list("acme", "chat-1")) == 1


@pytest.mark.parametrize("tokens", [TOKENS, NO_AUTH], ids=["auth", "no-auth"])
async def test_a_body_must_be_json(asgi: Client, outbox: Outbox, tokens: TokenTable) -> None:
    refused = [
        None,  # no Content-Type at all
        "text/plain",
        "text/plain; charset=utf-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonx",
        "application/json-patch+json",
        "application/javascript",
        "json",
    ]
    taken = ["application/json", "application/json; charset=utf-8", "Application/JSON ;q=1"]
    async with asgi(tokens) as http:
        for n, kind in enumerate(refused + taken):
            body = b'{"clientMessageID":"m%d","text":"t"}' % n
            headers = {**ALICE} if kind is None else {**ALICE, "Content-Type": kind}
            r = await http.post(URL, content=body, headers=headers)
            if kind in taken:
                assert r.status_code == 202, (kind, r.text)
            else:
                assert (r.status_code, r.json()["error"]) == (415, "unsupported_media_type"), kind
        # A request without a body needs no content type: a Content-Length of 0, or no chunks.
        for body in (b"", _chunks()):
            r = await http.post(
                f"{URL[: -len('/prompts')]}/errors/dismiss", content=body, headers=ALICE
            )
            assert r.status_code == 200, r.text
        park = await http.post("/v1/workspaces/acme/park", content=b"", headers=OPS)
        assert park.status_code == 422  # past the guard: the route wants its reason
    assert len(await outbox.list("acme", "chat-1")) == len(taken)


async def test_a_chunked_body_is_counted_and_typed_as_it_comes(
    asgi: Client, outbox: Outbox
) -> None:
    async with asgi() as http:
        ok = await http.post(
            URL, content=_chunks(PROMPT[:10], PROMPT[10:]), headers={**ALICE, **JSON}
        )
        assert ok.status_code == 202, ok.text
        plain = await http.post(
            URL, content=_chunks(PROMPT), headers={**ALICE, "Content-Type": "text/plain"}
        )
        assert (plain.status_code, plain.json()["error"]) == (415, "unsupported_media_type")
        # Past the limit: 413 before auth (no token), judged on the count alone.
        piece = b" " * 4096
        park = await http.post(
            "/v1/workspaces/acme/park", content=_chunks(*[piece] * 5), headers=JSON
        )
        assert (park.status_code, park.json()["error"]) == (413, "body_too_large")
        big = [b" " * 65536] * (MAX_BODY_BYTES // 65536 + 1)
        accept = await http.post(URL, content=_chunks(*big), headers={**ALICE, **JSON})
        assert (accept.status_code, accept.json()["error"]) == (413, "body_too_large")
    assert [e.id for e in await outbox.list("acme", "chat-1")] == [ok.json()["id"]]


async def test_each_route_has_its_body_limit_judged_before_auth(asgi: Client) -> None:
    async with asgi() as http:
        # The finding: a big body to park without a token was read whole, then 401.
        park = await http.post(
            "/v1/workspaces/acme/park", content=b" " * (SMALL_BODY_BYTES + 1), headers=JSON
        )
        assert (park.status_code, park.json()["error"]) == (413, "body_too_large")
        assert park.headers["connection"] == "close"
        at_limit = b'{"reason":"x"}'.ljust(SMALL_BODY_BYTES)
        park = await http.post("/v1/workspaces/acme/park", content=at_limit, headers=JSON)
        assert park.status_code == 401  # at the limit: on to auth
        # Accept and edit take MAX_BODY_BYTES: a text at its limit, JSON-escaped.
        for method, path in (("POST", URL), ("PATCH", URL + "/some-entry")):
            over = await http.request(
                method, path, content=b" " * (MAX_BODY_BYTES + 1), headers=JSON
            )
            assert (over.status_code, over.json()["error"]) == (413, "body_too_large"), method
            under = await http.request(method, path, content=b" " * MAX_BODY_BYTES, headers=JSON)
            assert under.status_code == 401, method  # past the guard, refused by auth
        # Another route of the same shape takes the small limit.
        listed = await http.request("GET", URL, content=b" " * (SMALL_BODY_BYTES + 1), headers=JSON)
        assert listed.status_code == 413


async def test_the_api_docs_are_off_unless_asked_for(asgi: Client) -> None:
    async with asgi() as http:
        for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            assert (await http.get(path)).status_code == 404, path
        spec = (await http.get("/openapi.json")).json()  # the client's types come from it
    async with asgi(api_docs=True) as http:
        docs = await http.get("/docs")
        assert docs.status_code == 200 and "swagger-ui" in docs.text
        assert (await http.get("/redoc")).status_code == 200
    # Every /v1 route declares the guard's refusals.
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            if path.startswith("/v1"):
                assert {"413", "415"} <= set(operation["responses"]), (method, path)


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    """A body httpx sends chunked (no Content-Length): ``parts`` as they are."""
    for part in parts:
        yield part


# -- finding 2 on the real stack: heads capped, bodies refused before they are sent ------------


@pytest.fixture(scope="module", params=["httptools", "h11"])
def real(
    request: pytest.FixtureRequest,
    valkey_server: EmbeddedValkey,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[int]:
    """A serve (auth on) on each HTTP stack; its port."""
    tokens = tmp_path_factory.mktemp("guard") / "tokens.json"
    tokens.write_text(
        json.dumps({"tokens": [{"token": "alice-token", "user": "alice", "workspaces": ["acme"]}]})
    )
    port = free_port()
    args = ["--tokens", str(tokens), "--port", str(port), "--valkey-url", valkey_server.url]
    with service([*args, "--http", request.param]):
        wait_healthy(port)
        yield port


def exchange(port: int, head: bytes, pieces: Iterable[bytes] = ()) -> tuple[dict[str, Any], int]:
    """Send ``head``, then ``pieces`` until the server answers; read the answer, then check
    that the server closed the connection. The answer (status, headers, json) and the bytes
    sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        sent = len(head)
        sock.setblocking(False)
        for piece in pieces:
            if _readable(sock):
                break  # answered: a polite client stops sending
            try:
                sock.sendall(piece)  # non-blocking: a full buffer raises, and we look again
            except BlockingIOError:
                _readable(sock, 0.05)
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
        sock.settimeout(10)
        answer = read_answer(sock, f"after {sent} bytes")
        try:
            answer["closed"] = sock.recv(65536) == b""
        except ConnectionResetError:
            answer["closed"] = True
        return answer, sent


def read_answer(sock: socket.socket, where: str = "") -> dict[str, Any]:
    """One answer (with a Content-Length) off ``sock``: status, headers, json (or None)."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        got = sock.recv(65536)
        assert got, f"closed without an answer {where}"
        raw += got
    head_part, _, body = raw.partition(b"\r\n\r\n")
    lines = head_part.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    parsed = json.loads(body) if headers.get("content-type") == "application/json" else None
    return {"status": int(lines[0].split()[1]), "headers": headers, "json": parsed}


def _readable(sock: socket.socket, wait: float = 0.0) -> bool:
    return bool(select.select([sock], [], [], wait)[0])


def _flood(piece: bytes, total: int) -> Iterator[bytes]:
    for _ in range(total // len(piece)):
        yield piece


def test_a_huge_header_is_cut_at_the_cap(real: int) -> None:
    # The finding: one 100 MB header on /healthz was read whole (23 s of the event loop).
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
    answer, sent = exchange(real, head, _flood(b"a" * 65536, 64 * 1024 * 1024))
    assert (answer["status"], answer["json"]["error"]) == (431, "headers_too_large")
    assert answer["closed"]
    assert sent < 16 * 1024 * 1024  # answered long before the rest was sent
    assert httpx.get(f"http://127.0.0.1:{real}/healthz").status_code == 200  # still serving


@pytest.mark.parametrize(
    ("extra", "status", "code"),
    [
        ([b"X-Line: " + b"a" * (MAX_LINE_BYTES + 1)], 431, "headers_too_large"),
        (
            [b"X-H%d: %s" % (n, b"a" * 1000) for n in range(MAX_HEAD_BYTES // 1000 + 1)],
            431,
            "headers_too_large",
        ),
    ],
    ids=["one-long-line", "many-lines"],
)
def test_a_complete_head_over_the_caps_is_refused(
    real: int, extra: list[bytes], status: int, code: str
) -> None:
    head = b"\r\n".join([b"GET /healthz HTTP/1.1", b"Host: 127.0.0.1", *extra]) + b"\r\n\r\n"
    answer, _ = exchange(real, head)
    assert (answer["status"], answer["json"]["error"], answer["closed"]) == (status, code, True)


def test_a_long_target_is_414_and_heads_within_the_caps_pass(real: int) -> None:
    path = b"/healthz?" + b"a" * MAX_LINE_BYTES
    answer, _ = exchange(real, b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert (answer["status"], answer["json"]["error"], answer["closed"]) == (
        414,
        "uri_too_long",
        True,
    )
    big = {"X-Cookie-Like": "c" * (MAX_LINE_BYTES - 100)}
    assert httpx.get(f"http://127.0.0.1:{real}/healthz", headers=big).status_code == 200


def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(real: int) -> None:
    # The finding: a 100 MB body to park without a token: 401 after reading it all.
    head = (
        b"POST /v1/workspaces/acme/park HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 104857600\r\n\r\n"
    )
    answer, sent = exchange(real, head)  # not a byte of the body
    assert (answer["status"], answer["json"]["error"]) == (413, "body_too_large")
    assert answer["closed"] and sent == len(head)
    # With a token, an accept of 300 MB: the same, before the token is even looked at.
    accept = head.replace(b"/v1/workspaces/acme/park", URL.encode()).replace(
        b"104857600", b"314572800"
    )
    accept = accept.replace(b"Host:", b"Authorization: Bearer alice-token\r\nHost:")
    answer, _ = exchange(real, accept)
    assert (answer["status"], answer["json"]["error"], answer["closed"]) == (
        413,
        "body_too_large",
        True,
    )


def test_a_chunked_body_is_cut_once_its_count_passes_the_limit(real: int) -> None:
    head = (
        URL.encode().join([b"POST ", b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"])
        + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    piece = b"10000\r\n" + b" " * 65536 + b"\r\n"
    answer, sent = exchange(real, head, _flood(piece, 64 * 1024 * 1024))
    assert (answer["status"], answer["json"]["error"]) == (413, "body_too_large")  # no token
    assert answer["closed"] and sent < 16 * 1024 * 1024


# -- a header sent twice (red-team note): the guard read the last, the routes the first -------

ONCE = ["Host", "Origin", "Content-Type", "Content-Length", "Transfer-Encoding"]
ONCE += ["Authorization", "Idempotency-Key"]


@pytest.mark.parametrize("tokens", [TOKENS, NO_AUTH], ids=["auth", "no-auth"])
async def test_a_header_the_guard_or_a_route_reads_may_not_come_twice(
    asgi: Client, outbox: Outbox, tokens: TokenTable
) -> None:
    usual = {
        "host": "127.0.0.1:8080",
        "origin": "http://127.0.0.1:8080",
        "content-type": "application/json",
        "content-length": str(len(PROMPT)),
        "authorization": ALICE["Authorization"],
        "idempotency-key": "m1",
    }
    # The red team's request: evil first (what the routes read), loopback last (what the
    # guard read), with auth off; the same shape for every header both sides read.
    evil = {"host": "rebind.evil.example", "origin": "https://evil.example"}
    async with asgi(tokens) as http:
        for name in ONCE:
            key = name.lower()
            first = evil.get(key, "chunked" if key == "transfer-encoding" else usual.get(key))
            second = usual.get(key, "chunked")
            headers = [(k, v) for k, v in usual.items() if k != key]
            headers += [(key, str(first)), (key, second)]
            request = http.build_request("POST", URL, content=PROMPT)
            request.headers = httpx.Headers(headers)
            r = await http.send(request)
            assert (r.status_code, r.json()["error"]) == (400, "duplicate_header"), name
            assert key in r.json()["detail"] and r.headers["connection"] == "close"
        # Once each, the same request is taken.
        request = http.build_request("POST", URL, content=PROMPT)
        request.headers = httpx.Headers(list(usual.items()))
        assert (await http.send(request)).status_code == 202
    assert len(await outbox.list("acme", "chat-1")) == 1


def test_a_repeated_header_is_refused_on_both_http_stacks(
    real: int, request: pytest.FixtureRequest
) -> None:
    head = [f"POST {URL} HTTP/1.1", "Host: 127.0.0.1", "Authorization: Bearer alice-token"]
    head += ["Content-Type: application/json", f"Content-Length: {len(PROMPT)}"]
    extra = [
        ("Host", "rebind.evil.example"),
        ("Origin", "https://evil.example"),
        ("Content-Type", "text/plain"),
        ("Content-Length", "5"),
        ("Content-Length", str(len(PROMPT))),
        ("Transfer-Encoding", "chunked"),
        ("Authorization", "Bearer bob-token"),
        ("Idempotency-Key", "m1"),
    ]
    got = []
    for n, (name, value) in enumerate(extra):
        lines = [*head, f"{name}: {value}"]
        body = PROMPT.replace(b'"m1"', b'"r%d"' % n)
        if name in ("Origin", "Idempotency-Key", "Transfer-Encoding"):  # not in the head yet
            lines.append(f"{name}: {value}")
        if name == "Transfer-Encoding":  # twice, in place of the Content-Length
            lines.remove(f"Content-Length: {len(PROMPT)}")
            body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        raw = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
        answer, _ = exchange(real, raw)
        got.append((name, answer["status"], (answer["json"] or {}).get("error")))
    # The parsers differ: httptools passes every repeated name on, as it came, but two
    # Content-Lengths or Transfer-Encodings; h11 refuses a second Host itself, and folds two
    # equal Content-Lengths into one (RFC 9112 allows it: nothing is ambiguous), which is
    # then taken. Either way no request reaches a route with two values of one of these.
    ours, parsers = (400, "duplicate_header"), (400, "bad_request")
    h11 = request.node.callspec.params["real"] == "h11"
    assert got == [
        ("Host", *(parsers if h11 else ours)),
        ("Origin", *ours),
        ("Content-Type", *ours),
        ("Content-Length", *parsers),
        ("Content-Length", *((202, None) if h11 else parsers)),
        ("Transfer-Encoding", *parsers),
        ("Authorization", *ours),
        ("Idempotency-Key", *ours),
    ]


# -- finding 1 on the real stack --------------------------------------------------------------


def test_serve_no_auth_refuses_the_findings_requests(
    tmp_path: Path, valkey_server: EmbeddedValkey
) -> None:
    port = free_port()
    with service(["--no-auth", "--port", str(port), "--valkey-url", valkey_server.url]):
        wait_healthy(port)
        base = f"http://127.0.0.1:{port}"
        evil = {"Origin": "https://evil.example", "Content-Type": "text/plain"}
        for path in (DEV_URL, DISMISS):
            r = httpx.post(
                base + path, content=PROMPT, headers={**evil, "Host": "rebind.evil.example"}
            )
            assert (r.status_code, r.json()["error"]) == (403, "host_not_allowed")
            r = httpx.post(base + path, content=PROMPT, headers=evil)
            assert (r.status_code, r.json()["error"]) == (403, "origin_not_allowed")
        assert httpx.get(base + DEV_URL).json() == {"entries": []}
        assert httpx.get(base + "/docs").status_code == 404


def test_serve_refuses_a_wildcard_origin_without_auth() -> None:
    done = subprocess.run(
        [BIN, "serve", "--no-auth", "--cors-origin", "*"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2 and "any web page" in done.stderr


# -- the deadline ------------------------------------------------------------------------------

DEADLINE = 1.5  # above --durability-timeout 0.5, far below the socket timeout (10 s)


@pytest.fixture
def frozen_valkey(tmp_path: Path) -> Iterator[tuple[EmbeddedValkey, int]]:
    """A serve on a Valkey of its own (the test may SIGSTOP it or kill it); its port."""
    with EmbeddedValkey(tmp_path / "valkey") as server:
        port = free_port()
        args = ["--no-auth", "--port", str(port), "--valkey-url", server.url]
        timing = ["--durability-timeout", "0.5", "--request-deadline", str(DEADLINE)]
        with service([*args, *timing]):
            wait_healthy(port)
            try:
                yield server, port
            finally:
                assert server.proc is not None
                server.proc.send_signal(signal.SIGCONT)


ROUTES = [
    ("GET", "/readyz"),
    ("GET", DEV_URL),
    ("POST", DEV_URL),
    ("GET", "/v1/workspaces/dev/sessions/main/events"),
    ("GET", "/v1/workspaces"),
    ("POST", DISMISS),
    ("POST", "/v1/workspaces/dev/park"),
]


def _call(port: int, method: str, path: str, n: int) -> httpx.Response:
    body = {"clientMessageID": f"d{n}", "text": "t"} if path == DEV_URL else {"reason": "r"}
    return httpx.request(
        method,
        f"http://127.0.0.1:{port}{path}",
        json=body if method == "POST" and path != DISMISS else None,
        timeout=8,  # under the socket timeout: only the deadline can answer in time
    )


def test_while_valkey_is_frozen_every_route_answers_503_at_the_deadline(
    frozen_valkey: tuple[EmbeddedValkey, int],
) -> None:
    server, port = frozen_valkey
    assert server.proc is not None
    server.proc.send_signal(signal.SIGSTOP)
    for n, (method, path) in enumerate(ROUTES):
        r = _call(port, method, path, n)
        assert (r.status_code, r.json()["error"]) == (503, "deadline_exceeded"), (path, r.text)
        assert r.headers["retry-after"] == "2"
    assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200  # no Valkey in it
    server.proc.send_signal(signal.SIGCONT)
    # Valkey back: the accept cut by the deadline may have been written; sending it again
    # with its clientMessageID gets it (a replay) or writes it now, never twice.
    again = _call(port, "POST", DEV_URL, 2)
    assert again.status_code in (200, 202), again.text
    entries = httpx.get(f"http://127.0.0.1:{port}{DEV_URL}").json()["entries"]
    assert [e["clientMessageID"] for e in entries] == ["d2"]


def test_while_valkey_is_gone_every_route_answers_503_with_retry_after(
    frozen_valkey: tuple[EmbeddedValkey, int],
) -> None:
    server, port = frozen_valkey
    server.kill()
    for n, (method, path) in enumerate(ROUTES):
        r = _call(port, method, path, n)
        assert (r.status_code, r.json()["error"]) == (503, "storage_unavailable"), (path, r.text)
        assert r.headers["retry-after"] == "2"


def test_an_open_stream_outlives_the_deadline(frozen_valkey: tuple[EmbeddedValkey, int]) -> None:
    _, port = frozen_valkey
    base = f"http://127.0.0.1:{port}"
    with httpx.stream(
        "GET", base + "/v1/workspaces/dev/sessions/main/events", timeout=10
    ) as events:
        assert events.status_code == 200
        lines = events.iter_lines()
        while not next(lines).startswith("data:"):  # the reset: the answer has begun
            pass
        time.sleep(DEADLINE + 0.5)  # past the deadline, the stream is still open
        assert _call(port, "POST", DEV_URL, 7).status_code == 202
        update = next(line for line in lines if line.startswith("data:"))
        assert '"d7"' in update


def test_an_accept_waiting_for_durability_answers_not_durable_before_the_deadline(
    replicated_pair: ReplicatedPair,
) -> None:
    # accept_durability replica, the replica frozen: WAITAOF waits durability_timeout and the
    # accept answers not_durable with its entry's ID, inside the default deadline (5 s + 2 s).
    port = free_port()
    args = ["--no-auth", "--port", str(port), "--valkey-url", replicated_pair.primary_url]
    with service([*args, "--accept-durability", "replica"]):
        wait_healthy(port)
        replicated_pair.freeze_replica()
        try:
            r = _call(port, "POST", DEV_URL, 1)  # waits 5 s
        finally:
            replicated_pair.thaw_replica()
        assert (r.status_code, r.json()["error"]) == (503, "not_durable"), r.text
        assert r.json()["id"]


def test_a_deadline_at_or_under_the_durability_timeout_is_refused(tmp_path: Path) -> None:
    r = subprocess.run(
        [BIN, "serve", "--no-auth",
         "--data-dir", str(tmp_path), "--durability-timeout", "3", "--request-deadline", "3"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and "must exceed durability_timeout" in r.stderr


def test_a_delivery_outlasting_the_deadline_is_not_cut(tmp_path: Path) -> None:
    # Deliveries run in the run loop, not under a request: an agent slower than the deadline
    # (this one answers after 2 s) still gets its prompt delivered, once.
    port = free_port()
    args = ["--no-auth", "--port", str(port), "--data-dir", str(tmp_path / "data")]
    timing = ["--durability-timeout", "0.5", "--request-deadline", "1"]
    with Agent() as agent:
        agent.actions.append("hang")
        hook = ["--webhook-url", agent.url]
        with service([*args, *timing, *hook], {"PROMPT_OUTBOX_WEBHOOK_SECRET": SECRET.decode()}):
            wait_healthy(port)
            assert _call(port, "POST", DEV_URL, 1).status_code == 202
            deadline = time.monotonic() + 30
            while httpx.get(f"http://127.0.0.1:{port}{DEV_URL}").json()["entries"]:
                assert time.monotonic() < deadline, "not delivered"
                time.sleep(0.1)
        assert len(agent.ids()) == 1


async def test_the_deadline_cuts_only_an_answer_not_yet_started() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] == "/slow":
            await asyncio.sleep(60)  # a call to a frozen Valkey
        if scope["path"] == "/broken":
            raise TimeoutError("the app's own")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await asyncio.sleep(0.3)  # a stream, past the deadline once begun
        await send({"type": "http.response.body", "body": b"all of it"})

    transport = httpx.ASGITransport(app=Deadline(app, seconds=0.1), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        slow = await http.get("/slow")
        assert (slow.status_code, slow.json()["error"]) == (503, "deadline_exceeded")
        assert slow.headers["retry-after"] == "2"
        assert (await http.get("/stream")).text == "all of it"
        assert (await http.get("/broken")).status_code == 500  # not taken for the deadline's


# -- slow clients: the head's bound, the body's, the connection cap ----------------------------

HEAD_S = 1.0  # --head-timeout in these tests
BODY_S = 1.5  # --request-deadline: above --durability-timeout 0.5
BOUND = 8.0  # "cut before this": generous, the bounds above being 1-1.5 s
TRICKLE = 0.2  # a byte (or a chunk) every 0.2 s: an idle timer of 1 s would never fire


@pytest.fixture(scope="module", params=["httptools", "h11"])
def slow_edge(request: pytest.FixtureRequest, valkey_server: EmbeddedValkey) -> Iterator[int]:
    """A serve (no auth) on each HTTP stack with short head and body bounds; its port."""
    port = free_port()
    args = ["--no-auth", "--port", str(port), "--valkey-url", valkey_server.url]
    timing = ["--head-timeout", str(HEAD_S), "--durability-timeout", "0.5"]
    timing += ["--request-deadline", str(BODY_S)]
    with service([*args, *timing, "--http", request.param]):
        wait_healthy(port)
        yield port


def _trickled(piece: bytes, *, for_s: float = BOUND + 2) -> Iterator[bytes]:
    """``piece`` byte by byte, one every ``TRICKLE`` s, repeated for ``for_s`` seconds."""
    end = time.monotonic() + for_s
    while True:
        for byte in piece:
            if time.monotonic() >= end:
                return
            time.sleep(TRICKLE)
            yield bytes([byte])


def _closed_within(sock: socket.socket, seconds: float) -> bytes:
    """What the server sends until it closes ``sock``; fails when it is open after ``seconds``."""
    sock.settimeout(seconds)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError(f"still open after {seconds} s") from None
    return got


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"


def _session(port: int, name: str) -> str:
    """A session of this serve's own (the two stacks share one Valkey)."""
    return f"/v1/workspaces/dev/sessions/{name}-{port}"


def _post_head(port: int, name: str) -> bytes:
    return f"POST {_session(port, name)}/prompts HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()


def test_a_connection_that_sends_nothing_is_closed_at_the_head_timeout(slow_edge: int) -> None:
    # uvicorn arms its keep-alive timer only after an answer: such a connection was held forever.
    with socket.create_connection(("127.0.0.1", slow_edge)) as sock:
        assert _closed_within(sock, BOUND) == b""  # nothing came: no answer, only the close


def test_a_head_trickled_byte_by_byte_is_cut_at_its_bound(slow_edge: int) -> None:
    # Each byte used to reset nothing at all; an idle timer would be reset by each: the bound
    # is a total.
    started = time.monotonic()
    answer, _ = exchange(slow_edge, HEALTHZ, _trickled(b"X-Slow: a\r\n"))
    assert (answer["status"], answer["json"]["error"]) == (408, "request_timeout")
    assert answer["closed"] and time.monotonic() - started < BOUND


def test_a_trickled_chunked_body_is_cut_at_the_deadline(slow_edge: int) -> None:
    # The guard reads a chunked body itself, and it ran before the deadline: unbounded.
    head = _post_head(slow_edge, "chunked")
    head += b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    started = time.monotonic()
    answer, _ = exchange(slow_edge, head, (b"1\r\n \r\n" for _ in _trickled(b"x" * 1000)))
    assert (answer["status"], answer["json"]["error"]) == (408, "request_timeout")
    assert answer["closed"] and time.monotonic() - started < BOUND


@pytest.mark.parametrize("trickle", [False, True], ids=["stalled", "trickled"])
def test_a_content_length_body_that_never_completes_is_cut(slow_edge: int, trickle: bool) -> None:
    # It was under the deadline already, but answered 503 deadline_exceeded ("Valkey is
    # slow", retry) and kept the connection, whose bytes kept coming.
    name = f"slow{trickle:d}"
    head = _post_head(slow_edge, name)
    head += b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    pieces = _trickled(b" " * 1000) if trickle else iter(())
    answer, _ = exchange(slow_edge, head + b'{"clientMessageID": "slow", ', pieces)
    assert (answer["status"], answer["json"]["error"]) == (408, "request_timeout")
    assert answer["closed"]
    listed = httpx.get(f"http://127.0.0.1:{slow_edge}{_session(slow_edge, name)}/prompts")
    assert listed.json() == {"entries": []}


def test_a_body_sent_after_its_answer_is_cut_at_the_head_timeout(slow_edge: int) -> None:
    # /healthz answers without reading a body: each byte of it, trickled afterwards, cancelled
    # uvicorn's keep-alive timer, which is armed again only by the next answer.
    head = HEALTHZ + b"Content-Type: application/json\r\nContent-Length: 10000\r\n\r\n"
    with socket.create_connection(("127.0.0.1", slow_edge), timeout=10) as sock:
        sock.sendall(head)
        assert read_answer(sock)["status"] == 200
        started = time.monotonic()
        sock.setblocking(False)
        for byte in _trickled(b" " * 10000):
            if _readable(sock):
                break
            try:
                sock.send(byte)
            except (BrokenPipeError, ConnectionResetError):
                break
        assert _closed_within(sock, 1) == b""
        assert time.monotonic() - started < BOUND


def test_a_keep_alive_client_sending_back_to_back_is_never_cut(slow_edge: int) -> None:
    # One connection, three times the head bound, requests with short pauses between: each
    # head and body comes at once, so none is cut, however long the connection lives.
    body = b'{"clientMessageID": "k%d", "text": "t"}'
    post = _post_head(slow_edge, "keep-alive") + b"Content-Type: application/json\r\n"
    with socket.create_connection(("127.0.0.1", slow_edge), timeout=10) as sock:
        end, n = time.monotonic() + 3 * HEAD_S, 0
        while time.monotonic() < end:
            sock.sendall(HEALTHZ + b"\r\n")
            assert read_answer(sock, f"for request {n}")["status"] == 200
            prompt = body % n
            length = b"Content-Length: %d\r\n\r\n" % len(prompt)
            sock.sendall(post + length + prompt)
            assert read_answer(sock, f"for request {n}")["status"] == 202
            n += 1
            time.sleep(HEAD_S / 3)
    assert n >= 3


def test_an_open_event_stream_is_never_cut(slow_edge: int) -> None:
    base = f"http://127.0.0.1:{slow_edge}" + _session(slow_edge, "stream")
    with httpx.stream("GET", base + "/events", timeout=10) as events:
        assert events.status_code == 200
        lines = events.iter_lines()
        while not next(lines).startswith("data:"):  # the reset: the answer has begun
            pass
        time.sleep(HEAD_S + BODY_S + 1)  # past both bounds, the stream is still open
        accept = {"clientMessageID": "s1", "text": "t"}
        r = httpx.post(base + "/prompts", json=accept)
        assert r.status_code == 202
        update = next(line for line in lines if line.startswith("data:"))
        assert '"s1"' in update


@pytest.mark.parametrize("http_parser", ["httptools", "h11"])
def test_connections_past_the_cap_are_answered_503_and_closed(
    valkey_server: EmbeddedValkey, http_parser: str
) -> None:
    port = free_port()
    args = ["--no-auth", "--port", str(port), "--valkey-url", valkey_server.url]
    with service([*args, "--max-streams", "1", "--max-connections", "3", "--http", http_parser]):
        wait_healthy(port)
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
                answer = read_answer(extra)  # sent as it is accepted, before any request
                assert (answer["status"], answer["json"]["error"]) == (503, "too_many_connections")
                assert answer["headers"]["retry-after"] == "2"
                assert _closed_within(extra, BOUND) == b""
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 10  # the server sees the closes in a moment
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
                break
            except (httpx.HTTPError, AssertionError):
                assert time.monotonic() < deadline, "not serving again after the closes"
                time.sleep(0.05)


def test_the_connection_cap_must_exceed_the_stream_cap() -> None:
    done = subprocess.run(
        [BIN, "serve", "--no-auth", "--max-streams", "5", "--max-connections", "5"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2 and "must exceed --max-streams" in done.stderr


def _open_files_soft(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-files line")


def test_serve_raises_its_open_files_limit_to_hold_its_connections(
    valkey_server: EmbeddedValkey,
) -> None:
    # Services often start at 1024 open files, below --max-streams alone (2000): past it
    # accepts fail with EMFILE (and asyncio stops accepting for a second) before any cap.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    port = free_port()
    command = [BIN, "serve", "--no-auth", "--port", str(port), "--valkey-url", valkey_server.url]
    proc = subprocess.Popen(
        command,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)),
        start_new_session=True,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_healthy(port)
        wanted = DEFAULT_PER_PROCESS + CONNECTIONS_BEYOND_STREAMS + FILES_BEYOND_CONNECTIONS
        expected = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        assert _open_files_soft(proc.pid) == expected
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# -- in process: the deadline's 408, the head clock's one timer ---------------------------------


async def test_the_deadline_answers_408_when_the_body_is_what_is_late() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        while (await receive()).get("more_body"):  # the whole body, then a frozen Valkey
            pass
        await asyncio.sleep(60)

    async def call(parts: list[bytes], *, whole: bool) -> list[Message]:
        """The answer's messages when the body is ``parts``, then (unless ``whole``) nothing:
        a stalled client."""
        sent: list[Message] = []

        async def receive() -> Message:
            if not parts:
                await asyncio.sleep(60)  # the rest of the body never comes
            part = parts.pop(0)
            return {"type": "http.request", "body": part, "more_body": bool(parts) or not whole}

        async def send(message: Message) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/", "headers": []}
        await Deadline(app, seconds=0.1)(scope, receive, send)
        return sent

    late = await call([b'{"a":'], whole=False)
    assert late[0]["status"] == 408 and (b"connection", b"close") in late[0]["headers"]
    assert json.loads(late[1]["body"])["error"] == "request_timeout"
    whole = await call([b'{"a":', b"1}"], whole=True)  # all of it came: the wait is on Valkey
    assert whole[0]["status"] == 503
    assert json.loads(whole[1]["body"])["error"] == "deadline_exceeded"


async def test_the_head_clock_arms_one_timer_per_connection_not_per_request() -> None:
    loop = asyncio.get_running_loop()
    armed: list[float] = []

    class Counting:  # the running loop, its timers counted
        def time(self) -> float:
            return loop.time()

        def call_at(self, when: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
            armed.append(when)
            return loop.call_at(when, callback)

    expired: list[bool] = []
    clock = HeadClock(
        cast(asyncio.AbstractEventLoop, Counting()), 0.2, lambda: expired.append(True)
    )
    clock.start()  # the connection made
    for _ in range(1000):  # requests back to back: each head comes, each answer ends
        clock.stop()
        clock.start()
    assert len(armed) == 1
    await asyncio.sleep(0.5)  # the last start's bound passed without a head
    assert expired == [True] and len(armed) <= 2  # fired, re-armed once for the later due
    clock.start()
    clock.stop()  # the head came in time
    await asyncio.sleep(0.5)
    assert expired == [True]
    clock.start()
    clock.cancel()  # the connection went away
    await asyncio.sleep(0.5)
    assert expired == [True]
