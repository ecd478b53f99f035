"""The opencode servers a deliverer reaches, and their HTTP clients (docs/opencode-turns.md,
"Connections"): what it keeps does not grow with the base URLs its targets name.

A server (a base URL, spelled one way: ``Server``) is kept while it is in use (a request in
flight, a turn watched there) and ``idle_timeout`` after; then it is let go: its event stream
stopped, and once no server of its origin (scheme, host, port) is kept, that origin's
clients are closed. Every server of one origin shares one client for requests (a pool of
``connections``) and one for event streams (one connection each). At most ``max_servers``
are kept: a new one lets the idlest idle one go, and when every one is in use it is refused
(``ServersFull``, which the deliverer fails transient: nothing was sent) rather than kept
beyond the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import httpx

from .opencode_targets import Server, server_of

MakeClient = Callable[[httpx.Limits], httpx.AsyncClient]
"""A new HTTP client with these pool limits (the deliverer's timeouts, auth and TLS)."""

StopStream = Callable[[Server], "asyncio.Task[None] | None"]
"""Stop the server's event stream (a server let go is idle: no turn is watched there); the
task to wait for before its origin's clients close, if one ran."""


class ServersFull(RuntimeError):
    """Every one of the ``max_servers`` opencode servers kept is in use: a request to another
    waits until one is idle (the deliverer fails the send transient: nothing was sent)."""


class _Origin:
    __slots__ = ("requests", "servers", "streams")

    def __init__(self) -> None:
        self.requests: httpx.AsyncClient | None = None
        self.streams: httpx.AsyncClient | None = None
        self.servers = 0


class _Kept:
    __slots__ = ("idle_since", "timer", "users")

    def __init__(self) -> None:
        self.users = 0  # requests in flight and turns watched
        self.idle_since = time.monotonic()
        self.timer: asyncio.TimerHandle | None = None


class Servers:
    """The servers kept, their origins' clients, and the bound on both.

    ``make_client`` builds each origin's clients (None: ``borrowed`` is used for every
    server, and never closed here); ``connections`` sizes an origin's request pool."""

    def __init__(
        self,
        make_client: MakeClient | None,
        *,
        borrowed: httpx.AsyncClient | None = None,
        connections: int,
        max_servers: int,
        idle_timeout: float,
    ) -> None:
        if max_servers < 1:
            raise ValueError("max_servers must be at least 1")
        if idle_timeout < 0:
            raise ValueError("idle_timeout must not be negative")
        self._make = make_client
        self._borrowed = borrowed
        self._connections = connections
        self._max = max_servers
        self._idle_timeout = idle_timeout
        self._kept: dict[Server, _Kept] = {}
        self._idle: dict[Server, None] = {}  # the idle ones, idlest first
        self._origins: dict[tuple[str, str, int], _Origin] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._stop_stream: StopStream | None = None

    def on_let_go(self, stop_stream: StopStream) -> None:
        """Call ``stop_stream(server)`` when a server is let go (the event streams' owner)."""
        self._stop_stream = stop_stream

    @property
    def kept(self) -> int:
        """How many servers (distinct base URLs) are kept now."""
        return len(self._kept)

    @property
    def clients(self) -> int:
        """How many HTTP clients made here are open (at most two per origin)."""
        return sum(
            (o.requests is not None) + (o.streams is not None) for o in self._origins.values()
        )

    def hold(self, base: str) -> Server:
        """Count one use of the server ``base`` names (a request, a watched turn) until
        ``release``. ServersFull when it is not kept and every kept one is in use;
        InvalidTarget when ``base`` is no server's URL."""
        server = server_of(base)
        kept = self._kept.get(server)
        if kept is None:
            full = len(self._kept) >= self._max
            if full and not self._idle:
                raise ServersFull(
                    f"{server}: the opencode deliverer's {self._max} servers (base URLs) are "
                    "all in use; sent once one is idle (raise max_servers, "
                    "--opencode-max-servers)"
                )
            # Counted on its origin first: the idlest let go there leaves its clients open.
            self._origins.setdefault(server.origin, _Origin()).servers += 1
            kept = self._kept[server] = _Kept()
            if full:
                self._let_go(next(iter(self._idle)))
        kept.users += 1
        self._idle.pop(server, None)
        return server

    def release(self, server: Server) -> None:
        """One use of ``server`` ended; the last one starts its idle time."""
        kept = self._kept.get(server)
        if kept is None:
            return  # let go by aclose meanwhile
        kept.users -= 1
        if kept.users == 0:
            kept.idle_since = time.monotonic()
            self._idle[server] = None
            if kept.timer is None:
                self._expire_later(server, kept, self._idle_timeout)

    @contextlib.asynccontextmanager
    async def request(self, base: str) -> AsyncIterator[httpx.AsyncClient]:
        """The client for one request to ``base``, the server held while it runs."""
        server = self.hold(base)
        try:
            yield self._client(server, streams=False)
        finally:
            self.release(server)

    def stream_client(self, server: Server) -> httpx.AsyncClient:
        """The client for ``server``'s event stream (one connection of its own, outside the
        request pool); the server must be kept (its stream stops when it is let go)."""
        return self._client(server, streams=True)

    def _client(self, server: Server, *, streams: bool) -> httpx.AsyncClient:
        if self._make is None:
            assert self._borrowed is not None
            return self._borrowed
        origin = self._origins.get(server.origin)
        if origin is None:
            raise RuntimeError(f"{server}: let go (the deliverer is closing)")
        if streams:
            if origin.streams is None:
                # One connection per stream, never reused: a stream ends with its connection.
                limits = httpx.Limits(max_connections=self._max, max_keepalive_connections=0)
                origin.streams = self._make(limits)
            return origin.streams
        if origin.requests is None:
            limits = httpx.Limits(
                max_connections=self._connections, max_keepalive_connections=self._connections
            )
            origin.requests = self._make(limits)
        return origin.requests

    def _expire_later(self, server: Server, kept: _Kept, delay: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop to wait in: the bound or aclose lets it go
        kept.timer = loop.call_later(delay, self._expire, server, kept)

    def _expire(self, server: Server, kept: _Kept) -> None:
        kept.timer = None
        if self._kept.get(server) is not kept or kept.users:
            return  # let go already, or in use again (its next release waits anew)
        left = kept.idle_since + self._idle_timeout - time.monotonic()
        if left > 0:
            self._expire_later(server, kept, left)
        else:
            self._let_go(server)

    def _let_go(self, server: Server) -> None:
        kept = self._kept.pop(server)
        self._idle.pop(server, None)
        if kept.timer is not None:
            kept.timer.cancel()
        stream = self._stop_stream(server) if self._stop_stream is not None else None
        origin = self._origins[server.origin]
        origin.servers -= 1
        clients: list[httpx.AsyncClient] = []
        if origin.servers == 0:
            del self._origins[server.origin]  # a new server there gets new clients
            clients = [c for c in (origin.requests, origin.streams) if c is not None]
        if stream is not None or clients:
            task = asyncio.get_running_loop().create_task(self._close(stream, clients))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close(stream: asyncio.Task[None] | None, clients: list[httpx.AsyncClient]) -> None:
        if stream is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await stream
        for client in clients:
            await client.aclose()

    async def aclose(self) -> None:
        """Let every server go and close every client made here (after ``stop_stream``'s
        owner stopped its streams)."""
        for server in list(self._kept):
            self._let_go(server)
        while self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
