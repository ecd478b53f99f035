"""A loopback TCP proxy that injects network faults between Valkey clients and the server.

Faults, each applied to the connections open at that moment:
  stall(s)       hold every byte in both directions for s seconds (a frozen network path)
  drop()         close both sides with a FIN (a peer or middlebox going away cleanly)
  reset()        close with a RST (SO_LINGER 0: a crashed peer, a firewall)
  cut_replies(s) for s seconds, forward requests but swallow the server's replies and close
                 the connection once one was swallowed: the command RAN, the client never
                 learns its result (the hardest case for a non-idempotent protocol)

It binds 127.0.0.1 only and forwards to one upstream port on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections import Counter
from dataclasses import dataclass, field


@dataclass(eq=False)
class _Pair:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class FaultyProxy:
    """``async with FaultyProxy(upstream_port) as proxy:`` then connect to ``proxy.url``
    (which carries ``password``, the upstream server's, if it has one)."""

    def __init__(self, upstream_port: int, password: str = "") -> None:
        self.upstream_port = upstream_port
        self.password = password
        self.port = 0
        self.faults: Counter[str] = Counter()
        self._pairs: set[_Pair] = set()
        self._server: asyncio.Server | None = None
        self._stalled_until = 0.0
        self._cut_until = 0.0

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}"

    async def __aenter__(self) -> FaultyProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for pair in list(self._pairs):
            self._close(pair, rst=False)
        await self._server.wait_closed()

    # -- faults ----------------------------------------------------------------------------

    def stall(self, seconds: float) -> None:
        self.faults["net stall"] += 1
        self._stalled_until = time.monotonic() + seconds

    def drop(self) -> None:
        self.faults["net drop"] += 1
        for pair in list(self._pairs):
            self._close(pair, rst=False)

    def reset(self) -> None:
        self.faults["net reset"] += 1
        for pair in list(self._pairs):
            self._close(pair, rst=True)

    def cut_replies(self, seconds: float) -> None:
        self.faults["net cut reply"] += 1
        self._cut_until = time.monotonic() + seconds

    # -- plumbing --------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()  # the server is down: so is the path to it
            return
        pair = _Pair(writer, up_writer)
        self._pairs.add(pair)
        pair.tasks = [
            asyncio.create_task(self._pump(reader, up_writer, pair, replies=False)),
            asyncio.create_task(self._pump(up_reader, writer, pair, replies=True)),
        ]

    async def _pump(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        pair: _Pair,
        *,
        replies: bool,
    ) -> None:
        try:
            while data := await src.read(65536):
                if (wait := self._stalled_until - time.monotonic()) > 0:
                    await asyncio.sleep(wait)  # a stall begun meanwhile holds the next chunk
                if replies and time.monotonic() < self._cut_until:
                    self.faults["reply swallowed"] += 1
                    self._close(pair, rst=True)
                    return
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._close(pair, rst=False)

    def _close(self, pair: _Pair, *, rst: bool) -> None:
        if pair not in self._pairs:
            return
        self._pairs.discard(pair)
        for w in (pair.client, pair.server):
            if rst:
                sock = w.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
            w.close()
        for task in pair.tasks:
            if task is not asyncio.current_task():
                task.cancel()
