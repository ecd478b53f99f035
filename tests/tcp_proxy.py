"""A loopback TCP proxy a test can cut: every connection through it can be closed at once,
new ones refused for a while, or the upstream's answers swallowed (a request that reaches the
agent, and an answer that never comes back). It runs in the test's own event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class TcpProxy:
    """``url`` forwards to ``127.0.0.1:upstream_port``; ``cut()`` closes every connection,
    ``refusing`` closes new ones at once, ``swallow`` drops what the upstream answers."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.refusing = False
        self.swallow = False
        self.connections = 0  # accepted and forwarded, in total
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)

    def cut(self) -> None:
        """Close every connection now open (both sides)."""
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self.connections += 1
        self._open.update((writer, up_writer))
        pumps = [
            asyncio.get_running_loop().create_task(self._pump(reader, up_writer, False)),
            asyncio.get_running_loop().create_task(self._pump(up_reader, writer, True)),
        ]
        self._tasks.update(pumps)
        for pump in pumps:
            pump.add_done_callback(self._tasks.discard)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answers: bool
    ) -> None:
        try:
            while data := await reader.read(65536):
                if answers and self.swallow:
                    continue
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._open.discard(writer)
            writer.transport.abort()


@contextlib.asynccontextmanager
async def tcp_proxy(upstream_port: int) -> AsyncIterator[TcpProxy]:
    proxy = TcpProxy(upstream_port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()
