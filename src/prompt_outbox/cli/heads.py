"""The HTTP edge of ``serve``: uvicorn's two HTTP/1.1 protocols with the request head capped
and timed, and the connections counted (a request head cannot take unbounded memory or time).

uvicorn reads a request's head whole before the app sees it, with no bound of its own on the
httptools side: one 100 MB header line took 23 s of the event loop (which the delivery
workers share), each fragment appended to the last. These subclasses of uvicorn's two
HTTP/1.1 protocols refuse a head over ``MAX_HEAD_BYTES`` in all, a header line over
``MAX_LINE_BYTES`` (431 ``headers_too_large``) or a request target over ``MAX_LINE_BYTES``
(414 ``uri_too_long``), with the API's JSON error shape, and close the connection:

- a head still incomplete is cut once the bytes received for it pass ``MAX_HEAD_BYTES``
  (httptools: counted here, after each read; h11: its ``max_incomplete_event_size``);
- a complete head is measured by ``head_refusal`` before the app is called.

Anything else the parser refuses gets a JSON 400 ``bad_request`` instead of uvicorn's text.

Slow clients (slowloris). uvicorn has no bound on the time a head takes: a connection that
never sends a byte is held forever (its keep-alive timer is armed only after a response), and
one that sends a byte every few seconds cancels that timer with each byte. Here, from the
moment the server waits on the client (the connection made, or the previous answer sent), the
next head must be whole within ``Edge.head_timeout``: a total bound (``HeadClock``), not an
idle timer. Past it the connection is closed, after a 408 ``request_timeout`` if part of a
head had come (a silent connection gets no answer: it may be an idle keep-alive connection
whose client is sending a request right now, and would read the 408 as that request's
answer). The time after the head (the body, the answer) belongs to the app, whose deadline
(``api/deadline.py``) covers it, body included. The rest of a body the app did not read,
sent after the answer, counts against the next head's bound.

The connections one serve holds at once are capped (``Edge.max_connections``): one past it
is answered 503 ``too_many_connections`` with ``Retry-After`` and closed as it is accepted,
before it costs more than its socket, so that slow or idle clients cannot take the process's
file descriptors (at which point accepts stall for everyone, the health probes included).

Clients that stop reading. Each connection's transport stops
the writer (uvicorn's flow control) past ``TRANSPORT_HIGH_WATER`` (16 KiB, set here on every
connection: asyncio's default is 64), and a connection whose client takes none of what serve
wrote it for ``Edge.send_timeout`` is aborted, with a reset (``stalls.StallWatch``).
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import logging
import resource
import socket
import struct
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, NoReturn, cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from ..api.answers import TRANSPORT_HIGH_WATER
from ..api.errors import UNAVAILABLE_RETRY_AFTER
from .stalls import SEND_TIMEOUT, HeadClock, StallWatch

log = logging.getLogger("prompt_outbox.cli")

MAX_HEAD_BYTES = 32 * 1024
"""A request head in all (request line and headers): what nginx takes by default, and twice
what h11 does. Ours carry a token, an Idempotency-Key (at most 258 bytes) and what a browser
adds (cookies of other apps on localhost among them)."""
MAX_LINE_BYTES = 8 * 1024
"""One header line, or the request target: nginx's default buffer, the length RFC 9112 asks
a server to take at least."""
HEAD_TIMEOUT = 10.0
"""Seconds a client has for a whole request head. A head of ours is one packet (under 1 KiB:
a token, a key); even one at ``MAX_HEAD_BYTES`` takes 3 s at 10 KB/s, a poor mobile link.
nginx's ``client_header_timeout`` is 60 s, but as an idle timer between reads; this is a
total, so a slowloris holds a connection 10 s at most, whatever it trickles."""
CONNECTIONS_BEYOND_STREAMS = 2000
"""The default connection cap is ``--max-streams`` plus this: room for every event stream and
as many keep-alive clients besides (a reverse proxy in front holds a few dozen)."""
FILES_BEYOND_CONNECTIONS = 512
"""File descriptors serve wants besides its HTTP connections: Valkey connections (one per
cluster node and pool slot), the embedded server's pipes, logs."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """What a refused head is answered."""

    status: int
    code: str
    detail: str
    headers: tuple[tuple[bytes, bytes], ...] = ()

    def response(self, default_headers: Iterable[tuple[bytes, bytes]]) -> bytes:
        """The whole answer, JSON as the API's refusals are, closing the connection."""
        body = json.dumps({"error": self.code, "detail": self.detail}).encode()
        phrase = http.HTTPStatus(self.status).phrase
        head = [f"HTTP/1.1 {self.status} {phrase}\r\n".encode()]
        head += [name + b": " + value + b"\r\n" for name, value in default_headers]
        head += [name + b": " + value + b"\r\n" for name, value in self.headers]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
        ]
        return b"".join(head) + body


HEAD_TOO_LARGE = Refusal(
    431, "headers_too_large", f"the request head is over {MAX_HEAD_BYTES} bytes"
)
LINE_TOO_LONG = Refusal(431, "headers_too_large", f"a header line is over {MAX_LINE_BYTES} bytes")
URI_TOO_LONG = Refusal(414, "uri_too_long", f"the request target is over {MAX_LINE_BYTES} bytes")


def head_refusal(target: int, headers: Iterable[tuple[bytes, bytes]]) -> Refusal | None:
    """The refusal of a complete head (its target's length, its header lines), or None."""
    if target > MAX_LINE_BYTES:
        return URI_TOO_LONG
    total = target
    for name, value in headers:
        line = len(name) + len(value)
        if line > MAX_LINE_BYTES:
            return LINE_TOO_LONG
        total += line + 4  # ": " and CRLF
    return HEAD_TOO_LARGE if total > MAX_HEAD_BYTES else None


_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset, drops the queue


class _Tally:
    """Events logged once a minute at most, with how many came since (a flood of refused or
    aborted connections would flood the log too)."""

    EVERY = 60.0

    def __init__(self, message: str) -> None:
        self._message = message
        self._count = 0
        self._logged_at: float | None = None

    def add(self, *args: object) -> None:
        """Count one; log the count (and ``args``, for the message) when a minute has passed."""
        self._count += 1
        now = time.monotonic()
        if self._logged_at is None or now - self._logged_at >= self.EVERY:
            log.warning(self._message, self._count, *args)
            self._count, self._logged_at = 0, now


class Edge:
    """What the connections of one serve share: the head timeout, the send timeout, and the
    connection cap (None: no cap). ``capped_protocol`` binds one to the protocol class
    uvicorn runs. ``stalled``: called for each connection aborted by the send timeout (a
    metric)."""

    def __init__(
        self,
        head_timeout: float = HEAD_TIMEOUT,
        max_connections: int | None = None,
        send_timeout: float = SEND_TIMEOUT,
        stalled: Callable[[], None] | None = None,
    ) -> None:
        if not head_timeout > 0:
            raise ValueError(f"the head timeout must be > 0 s, got {head_timeout!r}")
        if not send_timeout > 0:
            raise ValueError(f"the send timeout must be > 0 s, got {send_timeout!r}")
        if max_connections is not None and max_connections < 1:
            raise ValueError(f"the connection cap must be >= 1, got {max_connections!r}")
        self.head_timeout = head_timeout
        self.send_timeout = send_timeout
        self.max_connections = max_connections
        self._stalled = stalled
        self.timed_out = Refusal(
            408, "request_timeout", f"the request head did not arrive within {head_timeout:g} s"
        )
        retry = UNAVAILABLE_RETRY_AFTER["Retry-After"].encode()
        self.too_many = Refusal(
            503,
            "too_many_connections",
            f"this server holds its most connections ({max_connections}): retry shortly",
            ((b"retry-after", retry),),
        )
        self._refused = _Tally("%d connection(s) refused: %d open, --max-connections %d")
        self._aborted = _Tally(
            "%d connection(s) aborted: their client took nothing of the answer for %g s "
            "(--send-timeout)"
        )

    def admit(
        self,
        connections: Collection[object],
        transport: asyncio.Transport,
        default_headers: Iterable[tuple[bytes, bytes]],
    ) -> bool:
        """Whether a connection just made (counted in ``connections``) may stay; if not, it
        is answered 503 and closed."""
        if self.max_connections is None or len(connections) <= self.max_connections:
            return True
        transport.write(self.too_many.response(default_headers))
        transport.close()
        self._refused.add(len(connections) - 1, self.max_connections)
        return False

    def abort_stalled(self, transport: asyncio.Transport) -> None:
        """Abort a connection whose client took nothing for ``send_timeout``: its buffer is
        dropped (a close would wait to flush it), and uvicorn ends its answer. A reset, not a
        close: the kernel drops what its socket still holds too (up to megabytes on loopback)
        instead of keeping it, orphaned, for a client that does not read."""
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # already gone: nothing left to drop
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        transport.abort()
        self._aborted.add(self.send_timeout)
        if self._stalled is not None:
            self._stalled()

    def time_out(
        self,
        transport: asyncio.Transport,
        default_headers: Iterable[tuple[bytes, bytes]],
        *,
        begun: bool,
    ) -> None:
        """Close a connection whose head is late: after a 408 if part of a head had come."""
        if transport.is_closing():
            return
        if begun:
            transport.write(self.timed_out.response(default_headers))
        transport.close()


class _Refused(Exception):
    """Raised in a parser callback: the parser stops, uvicorn calls ``send_400_response``."""


class _Edged(asyncio.Protocol):
    """What both protocols add per connection (first in their bases): the cap when it is
    made, and the clock on its next head. Each protocol says when a head is whole
    (``_clock.stop``), when the client's turn comes (``_clock.start``), and whether part of
    a head has come (``_head_begun``)."""

    edge: ClassVar[Edge] = Edge()
    transport: asyncio.Transport
    server_state: ServerState
    loop: asyncio.AbstractEventLoop

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clock = HeadClock(self.loop, self.edge.head_timeout, self._head_late)
        self._stall = StallWatch(
            self.loop, self.edge.send_timeout, self._write_buffered, self._write_stalled
        )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # The low mark is a quarter of the high one, as asyncio's defaults (16 / 64 KiB).
        self.transport.set_write_buffer_limits(TRANSPORT_HIGH_WATER, TRANSPORT_HIGH_WATER // 4)
        state = self.server_state
        if self.edge.admit(state.connections, self.transport, state.default_headers):
            self._clock.start()

    def connection_lost(self, exc: Exception | None) -> None:
        self._clock.cancel()
        self._stall.cancel()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        self._stall.paused()

    def resume_writing(self) -> None:
        self._stall.resumed()
        super().resume_writing()

    def _write_buffered(self) -> int:
        return self.transport.get_write_buffer_size()

    def _write_stalled(self) -> None:
        self.edge.abort_stalled(self.transport)

    def _head_begun(self) -> bool:
        raise NotImplementedError

    def _head_late(self) -> None:
        begun = self._head_begun()
        self.edge.time_out(self.transport, self.server_state.default_headers, begun=begun)
        self._stall.closing()  # the last answer may still be unread: its close is watched

    def _response_done(self) -> None:
        """An answer is whole in the transport; a connection closing after it (no keep-alive)
        stays until the client took it: that close is watched."""
        if self.transport.is_closing():
            self._stall.closing()


class CappedHttpTools(_Edged, HttpToolsProtocol):
    """uvicorn's httptools protocol with the head capped and timed, connections counted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unparsed: int | None = 0  # bytes read while a head is incomplete; None in a body
        self._refusal: Refusal | None = None
        self._begun = False  # a head's first byte parsed, its end not yet

    def data_received(self, data: bytes) -> None:
        # Whole reads are counted: a read that also ends the previous message counts 0 for
        # the next head, so a head is cut at most one read (64-256 KiB) past the cap.
        if self._unparsed is not None:
            self._unparsed += len(data)
        super().data_received(data)
        if (
            self._unparsed is not None
            and self._unparsed > MAX_HEAD_BYTES
            and not self.transport.is_closing()
        ):
            self._refusal = HEAD_TOO_LARGE
            self.send_400_response(HEAD_TOO_LARGE.detail)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._begun = True

    def on_headers_complete(self) -> None:
        refusal = head_refusal(len(self.url), self.headers)
        if refusal is not None:
            self._refuse(refusal)
        self._unparsed = None
        self._begun = False
        self._clock.stop()  # the app's turn: its deadline takes over
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._unparsed = 0  # the next message's head

    def on_response_complete(self) -> None:
        # The client's turn, unless a pipelined request is already waiting for its answer.
        if not self.pipeline and not self.transport.is_closing():
            self._clock.start()
        self._response_done()
        super().on_response_complete()

    def _head_begun(self) -> bool:
        return self._begun

    def _refuse(self, refusal: Refusal) -> NoReturn:
        self._refusal = refusal
        raise _Refused(refusal.detail)

    def send_400_response(self, msg: str) -> None:
        refusal = self._refusal or Refusal(400, "bad_request", msg)
        self.transport.write(refusal.response(self.server_state.default_headers))
        self.transport.close()


class _CappedConnection(h11.Connection):
    """h11's connection, refusing a complete head past the caps (h11 bounds only an
    incomplete one, by ``max_incomplete_event_size``), and telling when a head is whole."""

    def __init__(self, on_head: Callable[[], None]) -> None:
        super().__init__(h11.SERVER, MAX_HEAD_BYTES)
        self.refusal: Refusal | None = None
        self.on_head = on_head

    def next_event(self) -> Any:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as exc:
            if exc.error_status_hint == 431:  # h11's "Receive buffer too long"
                self.refusal = HEAD_TOO_LARGE
            raise
        if isinstance(event, h11.Request):
            refusal = head_refusal(len(event.target), event.headers)
            if refusal is not None:
                self.refusal = refusal
                raise h11.RemoteProtocolError(refusal.detail, error_status_hint=refusal.status)
            self.on_head()
        return event


class CappedH11(_Edged, H11Protocol):
    """uvicorn's h11 protocol with the head capped and timed, connections counted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A whole head stops the clock: the app's turn, under its deadline.
        self.conn = self._capped = _CappedConnection(on_head=self._clock.stop)

    def on_response_complete(self) -> None:
        # The client's turn; a pipelined request taken at once by super() stops the clock.
        if not self.transport.is_closing():
            self._clock.start()
        self._response_done()
        super().on_response_complete()

    def _head_begun(self) -> bool:
        # h11 buffers a head until it is whole: bytes waiting while no request is open are one.
        return self.conn.their_state is h11.IDLE and bool(self.conn.trailing_data[0])

    def send_400_response(self, msg: str) -> None:
        refusal = self._capped.refusal or Refusal(400, "bad_request", msg)
        self.transport.write(refusal.response(self.server_state.default_headers))
        self.transport.close()


def capped_protocol(http_parser: str, edge: Edge | None = None) -> type[asyncio.Protocol]:
    """The protocol class for ``serve --http`` (``auto``: httptools, a dependency), bound to
    ``edge`` (``Edge()``'s defaults when None: no connection cap)."""
    base: type[CappedHttpTools | CappedH11] = CappedH11 if http_parser == "h11" else CappedHttpTools
    return cast(type[asyncio.Protocol], type(base.__name__, (base,), {"edge": edge or Edge()}))


def raise_open_files(connections: int) -> int:
    """Raise this process's soft limit on open files to hold ``connections`` and what serve
    opens besides (``FILES_BEYOND_CONNECTIONS``), within the hard limit, as Go's runtime does
    at start (many systems start services at 1024, below ``--max-streams``'s default). The
    soft limit now; a warning when it stays short (accepts then stall at the limit, with
    EMFILE, before the cap answers 503)."""
    want = connections + FILES_BEYOND_CONNECTIONS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        soft = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft != resource.RLIM_INFINITY and soft < want:
        log.warning(
            "open files limited to %d (the hard limit): under --max-connections %d plus %d; "
            "raise it (ulimit -n, systemd's LimitNOFILE=)",
            soft,
            connections,
            FILES_BEYOND_CONNECTIONS,
        )
    return soft
