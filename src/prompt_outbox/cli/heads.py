"""The request head, capped by the HTTP protocol ``serve`` runs (issue 22, finding 2).

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
"""

from __future__ import annotations

import asyncio
import http
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NoReturn

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEAD_BYTES = 32 * 1024
"""A request head in all (request line and headers): what nginx takes by default, and twice
what h11 does. Ours carry a token, an Idempotency-Key (at most 258 bytes) and what a browser
adds (cookies of other apps on localhost among them)."""
MAX_LINE_BYTES = 8 * 1024
"""One header line, or the request target: nginx's default buffer, the length RFC 9112 asks
a server to take at least."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """What a refused head is answered."""

    status: int
    code: str
    detail: str

    def response(self, default_headers: Iterable[tuple[bytes, bytes]]) -> bytes:
        """The whole answer, JSON as the API's refusals are, closing the connection."""
        body = json.dumps({"error": self.code, "detail": self.detail}).encode()
        phrase = http.HTTPStatus(self.status).phrase
        head = [f"HTTP/1.1 {self.status} {phrase}\r\n".encode()]
        head += [name + b": " + value + b"\r\n" for name, value in default_headers]
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


class _Refused(Exception):
    """Raised in a parser callback: the parser stops, uvicorn calls ``send_400_response``."""


class CappedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with the head capped."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unparsed: int | None = 0  # bytes read while a head is incomplete; None in a body
        self._refusal: Refusal | None = None

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

    def on_headers_complete(self) -> None:
        refusal = head_refusal(len(self.url), self.headers)
        if refusal is not None:
            self._refuse(refusal)
        self._unparsed = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._unparsed = 0  # the next message's head

    def _refuse(self, refusal: Refusal) -> NoReturn:
        self._refusal = refusal
        raise _Refused(refusal.detail)

    def send_400_response(self, msg: str) -> None:
        refusal = self._refusal or Refusal(400, "bad_request", msg)
        self.transport.write(refusal.response(self.server_state.default_headers))
        self.transport.close()


class _CappedConnection(h11.Connection):
    """h11's connection, refusing a complete head past the caps (h11 bounds only an
    incomplete one, by ``max_incomplete_event_size``)."""

    refusal: Refusal | None = None

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
        return event


class CappedH11(H11Protocol):
    """uvicorn's h11 protocol with the head capped."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _CappedConnection(h11.SERVER, MAX_HEAD_BYTES)
        self._capped = self.conn

    def send_400_response(self, msg: str) -> None:
        refusal = self._capped.refusal or Refusal(400, "bad_request", msg)
        self.transport.write(refusal.response(self.server_state.default_headers))
        self.transport.close()


def capped_protocol(http_parser: str) -> type[asyncio.Protocol]:
    """The protocol class for ``serve --http`` (``auto``: httptools, a dependency)."""
    return CappedH11 if http_parser == "h11" else CappedHttpTools
