"""How ``serve`` and ``worker`` run: the event loop, the signals that stop them, and the
uvicorn server that stops on them (with the event streams ended first)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

import click
import uvicorn

from ..core.stopping import begin_stop

LOOPS = ("auto", "uvloop", "asyncio")
HTTP_PARSERS = ("auto", "httptools", "h11")


class Server(uvicorn.Server):
    """uvicorn re-raises a captured SIGTERM once it has stopped, which would kill the process
    before the workers are joined and the embedded Valkey is stopped: we handle signals.

    ``on_exit`` runs once, when asked to stop: ``serve`` ends its open event streams there.
    uvicorn waits for open connections before it stops, and an event stream never ends by
    itself: without it, every stop waited out the graceful timeout and printed the cancelled
    streams' tracebacks."""

    def __init__(
        self, config: uvicorn.Config, on_exit: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        super().__init__(config)
        self._on_exit = on_exit
        self._exiting: asyncio.Future[None] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def request_exit(self) -> None:
        self.should_exit = True
        if self._on_exit is not None and self._exiting is None:
            self._exiting = asyncio.ensure_future(self._on_exit())


def loop_factory(loop: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop to run on: uvloop (``auto``: when it is installed), or asyncio's own
    (None). uvloop takes CPU off every request (bench/http.py, docs/performance.md)."""
    if loop == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if loop == "uvloop":
            raise click.UsageError("--loop uvloop: uvloop is not installed") from None
        return None
    return uvloop.new_event_loop


def run_on(loop: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """``asyncio.run(main())`` on the chosen loop: serve runs uvicorn inside its own loop, so
    uvicorn's ``loop`` setting would never apply."""
    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        runner.run(main())


def on_signals(stop: asyncio.Event | Server) -> None:
    """SIGINT and SIGTERM set ``stop`` (or ask the server to exit), after marking the process
    as stopping: the same signal may stop the embedded Valkey before we close our side."""
    loop = asyncio.get_running_loop()
    asked = stop.set if isinstance(stop, asyncio.Event) else stop.request_exit

    def handler() -> None:
        begin_stop()
        asked()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, handler)
