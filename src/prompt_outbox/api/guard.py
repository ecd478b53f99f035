"""What a request must be before anything reads it (its head and body bounded, so no request
makes serve read or hold more than it allows).

``RequestGuard`` is ASGI middleware in front of every route, the hot accept path included
(``create_app`` installs it outside ``AcceptFastPath``, inside CORS). It reads the head only,
and refuses, in this order, with the JSON error shape of ``errors`` and ``Connection: close``
(the rest of a refused body is never read):

0. A head that repeats ``Host``, ``Origin``, ``Content-Type``, ``Content-Length``,
   ``Transfer-Encoding``, ``Authorization`` or ``Idempotency-Key``: 400 ``duplicate_header``,
   before anything else. The checks below would read one copy and the routes (Starlette's
   ``request.headers``) another: two Hosts, say, evil first and loopback last, passed the
   host check and reached the routes as evil (red-team note). RFC 9110 allows none of these
   twice (a Host twice is a 400 by RFC 9112).
1. In no-auth mode (a disabled ``TokenTable``: ``serve --no-auth``), a ``Host`` that is not
   loopback (``localhost``, 127/8, ``[::1]``, any port): 403 ``host_not_allowed``. This is
   what stops DNS rebinding, where a web page's own name resolves to 127.0.0.1.
2. In no-auth mode, an ``Origin`` that is neither loopback nor listed with ``--cors-origin``
   (``null`` and anything odd included): 403 ``origin_not_allowed``. Browsers send ``Origin``
   on every cross-site POST, so no other page can put prompts into the developer's agent.
   ``*`` listed for CORS matches no origin here. Clients with no ``Origin`` (curl, the CLI,
   httpx) pass: they are not a web page.
3. A body that is not ``application/json`` (parameters allowed: ``; charset=utf-8``): 415
   ``unsupported_media_type``, auth on or off. A cross-site page can send ``text/plain``
   without a CORS preflight; it cannot send JSON without one. A request with no body
   (no ``Content-Length`` or 0, and no chunks) needs no content type.
4. A body over the route's limit: 413 ``body_too_large``, judged on ``Content-Length``
   before a byte of it is read, or on the running count of a chunked body (read here, up to
   the limit, then handed on; under the request deadline, which ``create_app`` installs
   outside this middleware, so a body that never ends is cut: 408 ``request_timeout``).
   Both come before auth: a flood without a token costs what its head costs. The accept
   and edit routes take ``MAX_BODY_BYTES`` (a text at its limit, JSON-escaped); every other
   route ``SMALL_BODY_BYTES``.

The head itself (its lines and its size) is capped earlier, by the HTTP protocol serve runs
(``cli/heads.py``). Cost on the hot path: one pass over the header list, no await of its own
for a body sent with ``Content-Length`` (bench/http.py measures the accept with it).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Collection

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import error_response
from .params import route_pattern
from .prompts import MAX_BODY_BYTES, SESSION

SMALL_BODY_BYTES = 16 * 1024
"""The body limit of every route but accept and edit: the largest such body is a park reason
(500 characters, at most 12 bytes each JSON-escaped), far below it."""

_LARGE_BODIES = (
    ("POST", route_pattern(SESSION + "/prompts")),
    ("PATCH", route_pattern(SESSION + "/prompts/{entry_id}")),
)
# What a browser sends as Origin: a scheme and an authority, nothing else (no path, no user).
_ORIGIN = re.compile(r"https?://([^/?#@\s]+)")


def is_loopback_host(host: str) -> bool:
    """``localhost``, or an IP address of the loopback range (127/8, ::1); no port."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@functools.lru_cache(maxsize=256)  # bounded: a client choosing new values only churns it
def is_loopback_authority(authority: str) -> bool:
    """A ``Host`` header's value (``host``, ``host:port``, ``[v6]:port``) naming loopback."""
    if authority.startswith("["):  # an IPv6 literal, as in [::1]:8080
        end = authority.find("]")
        host, rest = authority[1:end], authority[end + 1 :]
        if end < 0 or ":" not in host:
            return False
    else:
        host, colon, port = authority.partition(":")
        rest = colon + port
    port = rest[1:]
    if rest and not (rest[0] == ":" and port.isascii() and port.isdigit()):
        return False
    return is_loopback_host(host)


def is_json(content_type: bytes | None) -> bool:
    """``application/json``, with or without parameters; not ``application/jsonx``."""
    if content_type is None:
        return False
    return content_type.split(b";", 1)[0].strip().lower() == b"application/json"


class RequestGuard:
    """ASGI middleware: the checks above, then the app (see the module docstring)."""

    def __init__(
        self, app: ASGIApp, *, loopback_only: bool = False, origins: Collection[str] = ()
    ) -> None:
        self.app = app
        self.loopback_only = loopback_only
        # CORS's "*" lets any page read answers; here it would let any page act: it lets none.
        self._origins = frozenset(o.encode("latin-1") for o in origins if o != "*")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan (serve has no websocket library)
            await self.app(scope, receive, send)
            return
        heads: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            if name in _ONCE:
                if name in heads:
                    detail = f"the {name.decode()} header is repeated: send it once"
                    await _refuse(scope, receive, send, 400, "duplicate_header", detail)
                    return
                heads[name] = value
        host, origin = heads.get(b"host"), heads.get(b"origin")
        content_type, length = heads.get(b"content-type"), heads.get(b"content-length")
        chunked = heads.get(b"transfer-encoding")
        if self.loopback_only:
            if host is None or not is_loopback_authority(host.decode("latin-1")):
                await _refuse(scope, receive, send, 403, "host_not_allowed", _HOST)
                return
            if origin is not None and not self._origin_allowed(origin):
                await _refuse(scope, receive, send, 403, "origin_not_allowed", _ORIGIN_WHY)
                return
        if chunked is not None:  # a length only the count tells: read it here, up to the limit
            await self._chunked(scope, receive, send, content_type)
            return
        if length is not None and length != b"0":
            try:
                size = int(length)
            except ValueError:
                await _refuse(scope, receive, send, 400, "bad_request", "bad Content-Length")
                return
            if size > 0 and not is_json(content_type):
                await _refuse(scope, receive, send, 415, "unsupported_media_type", _JSON_ONLY)
                return
            if size > SMALL_BODY_BYTES and size > _limit(scope):
                await _too_large(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _origin_allowed(self, origin: bytes) -> bool:
        if origin in self._origins:
            return True
        found = _ORIGIN.fullmatch(origin.decode("latin-1"))
        return found is not None and is_loopback_authority(found[1])

    async def _chunked(
        self, scope: Scope, receive: Receive, send: Send, content_type: bytes | None
    ) -> None:
        limit, json_body = _limit(scope), is_json(content_type)
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away: no one to answer
            part: bytes = message.get("body", b"")
            size += len(part)
            if part and not json_body:
                await _refuse(scope, receive, send, 415, "unsupported_media_type", _JSON_ONLY)
                return
            if size > limit:
                await _too_large(scope, receive, send)
                return
            parts.append(part)
            if not message.get("more_body", False):
                break
        body, handed = b"".join(parts), False

        async def replay() -> Message:
            nonlocal handed
            if handed:
                return await receive()  # after the body: a disconnect, as from the server
            handed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


_ONCE = frozenset(
    (
        b"host",
        b"origin",
        b"content-type",
        b"content-length",
        b"transfer-encoding",
        b"authorization",
        b"idempotency-key",
    )
)
"""The headers a request may carry once (uvicorn gives names in lower case)."""
_HOST = "this server runs without auth (--no-auth): it answers loopback names only"
_ORIGIN_WHY = (
    "this server runs without auth (--no-auth): pages of other origins may not call it "
    "(loopback origins and --cors-origin ones may)"
)
_JSON_ONLY = "a request body must be application/json"


def _limit(scope: Scope) -> int:
    """The body limit of the route ``scope`` asks for (relative to a ``root_path``)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    method = scope["method"]
    for allowed, pattern in _LARGE_BODIES:
        if method == allowed and pattern.fullmatch(path):
            return MAX_BODY_BYTES
    return SMALL_BODY_BYTES


async def _too_large(scope: Scope, receive: Receive, send: Send) -> None:
    limit = _limit(scope)
    await _refuse(scope, receive, send, 413, "body_too_large", f"the body is over {limit} bytes")


async def _refuse(
    scope: Scope, receive: Receive, send: Send, status: int, code: str, detail: str
) -> None:
    # Connection: close: the server stops reading, so the rest of a body is never taken in.
    response = error_response(status, code, detail, headers={"Connection": "close"})
    await response(scope, receive, send)
