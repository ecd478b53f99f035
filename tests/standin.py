"""A stand-in agent: a real HTTP server on loopback that answers what a test scripts (a status,
a body of any size streamed in chunks, or trickled a byte at a time, an encoding) and records
how much of each body it got onto the wire before the client hung up; and an httpx transport
that counts the body bytes the client read. Neither side ever holds a large body whole."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

CHUNK = 64 * 1024


@dataclass(frozen=True)
class Reply:
    """One scripted answer: ``head``, then ``pad`` bytes of ``fill``, then ``tail``."""

    status: int = 200
    head: bytes = b""
    pad: int = 0
    fill: bytes = b" "
    tail: bytes = b""
    content_type: str = "application/json"
    encoding: str | None = None  # a Content-Encoding header, whatever the body is
    trickle: float = 0.0  # seconds between single bytes of the pad (0: 64 KiB writes)

    @property
    def length(self) -> int:
        return len(self.head) + self.pad + len(self.tail)


@dataclass
class Served:
    """One request as the stand-in saw it: what it sent of the body, and whether the client
    closed the connection before the whole body was on the wire."""

    method: str
    path: str
    port: int  # the client's port: a new one means a new connection
    length: int
    sent: int = 0
    cut: bool = False
    done: threading.Event = field(default_factory=threading.Event)

    def finished(self) -> Served:
        assert self.done.wait(60), "the stand-in is still sending"
        return self


@dataclass
class StandIn:
    """Scripted replies by ``"METHOD /path"`` (the query ignored); unscripted: 200 ``{}``."""

    port: int = 0
    replies: dict[str, Reply] = field(default_factory=dict)
    served: list[Served] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def last(self) -> Served:
        return self.served[-1].finished()


def _send(handler: BaseHTTPRequestHandler, reply: Reply, seen: Served) -> None:
    handler.send_response(reply.status)
    handler.send_header("Content-Type", reply.content_type)
    handler.send_header("Content-Length", str(reply.length))
    if reply.encoding:
        handler.send_header("Content-Encoding", reply.encoding)
    handler.end_headers()

    def write(data: bytes) -> None:
        handler.wfile.write(data)
        seen.sent += len(data)

    write(reply.head)
    left, chunk = reply.pad, (reply.fill * CHUNK)[:CHUNK]
    while left:
        if reply.trickle:
            write(reply.fill[:1])
            left -= 1
            time.sleep(reply.trickle)
        else:
            write(chunk[: min(left, CHUNK)])
            left -= min(left, CHUNK)
    write(reply.tail)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hung up on a kept-alive connection is what these tests make happen.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextlib.contextmanager
def stand_in() -> Iterator[StandIn]:
    agent = StandIn()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a reused connection shows in the port

        def log_message(self, *args: object) -> None:
            pass

        def answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            key = f"{self.command} {self.path.partition('?')[0]}"
            reply = agent.replies.get(key, Reply(head=b"{}"))
            seen = Served(self.command, self.path, self.client_address[1], reply.length)
            agent.served.append(seen)
            try:
                _send(self, reply, seen)
            except (BrokenPipeError, ConnectionResetError):
                seen.cut = True
                self.close_connection = True
            finally:
                seen.done.set()

        do_GET = do_POST = answer

    server = _Server(("127.0.0.1", 0), Handler)
    agent.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield agent
    finally:
        server.shutdown()
        server.server_close()


class _Counted(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, owner: CountingTransport) -> None:
        self.inner, self.owner = inner, owner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.owner.read += len(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class CountingTransport(httpx.AsyncBaseTransport):
    """httpx's own transport, counting the body bytes the client read off the network (what
    it can have buffered, as received: before any decompression)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.read = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _Counted(response.stream, self)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def counting_client(timeout: float = 10.0) -> tuple[httpx.AsyncClient, CountingTransport]:
    transport = CountingTransport()
    return httpx.AsyncClient(transport=transport, timeout=timeout), transport
