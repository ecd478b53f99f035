"""The queue's event stream: the events URL, two SSE readers, and odd inputs for it."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx

from prompt_outbox import (
    Outbox,
)
from prompt_outbox.core.events import (
    QueueEvent,
    QueueReset,
)
from tests.support.api import URL

EVENTS = URL.removesuffix("/prompts") + "/events"


class Sse:
    """Reads one SSE response message by message."""

    def __init__(self, response: httpx.Response) -> None:
        self._lines = response.aiter_lines()

    async def next(self, within: float = 5.0) -> dict[str, Any]:
        message: dict[str, Any] = {}
        async with asyncio.timeout(within):
            async for line in self._lines:
                if not line:
                    if "event" in message:
                        return message
                    message = {}
                    continue
                name, _, value = line.partition(":")
                message[name] = value.removeprefix(" ")
        raise AssertionError(f"stream ended; partial message {message}")


def data(message: dict[str, Any]) -> Any:
    return json.loads(message["data"])


class SpecSse:
    """Reads an SSE response as the spec (and a browser's EventSource, and eventsource-parser)
    does: lines end at CRLF, LF or CR, and only there; a message's ``data`` lines are joined
    with LF. (httpx's ``aiter_lines`` also splits at U+2028 and the like, which a JSON string
    may hold raw.) ``ended`` once the server closed the stream."""

    def __init__(self, response: httpx.Response) -> None:
        self._chunks = response.aiter_text()
        self._pending = ""
        self.ended = False

    async def _line(self) -> str | None:
        while True:
            found = re.search(r"\r\n|\r|\n", self._pending)
            # A CR at the very end may be the first half of a CRLF: wait for more.
            if found and not (found.group() == "\r" and found.end() == len(self._pending)):
                line, self._pending = self._pending[: found.start()], self._pending[found.end() :]
                return line
            try:
                self._pending += await anext(self._chunks)
            except StopAsyncIteration:
                self.ended = True
                return None

    async def next(self, within: float = 5.0) -> dict[str, Any] | None:
        """The next message with an event name, or None once the stream ended."""
        message: dict[str, Any] = {}
        data: list[str] = []
        async with asyncio.timeout(within):
            while (line := await self._line()) is not None:
                if not line:
                    if "event" in message:
                        return {**message, "data": "\n".join(data)}
                    message, data = {}, []
                    continue
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "data":
                    data.append(value)
                elif name:
                    message[name] = value
        return None


RAW_MODEL = '{"a":\n1,\r\n"b":[2,\r3],\n"c":"\u2028"}'  # line breaks in the JSON's whitespace


WS, SES = "ws", "s1"  # the session take() watches


async def take(outbox: Outbox, n: int, last: str | None = None) -> list[QueueEvent | QueueReset]:
    """The first n non-quiet items of a watch (each poll is short, so an absent event fails)."""
    out: list[QueueEvent | QueueReset] = []
    stream: AsyncIterator[QueueEvent | QueueReset | None] = outbox.watch(WS, SES, last, poll=0.05)
    quiet = 0
    async for item in stream:
        if item is None:
            quiet += 1
            assert quiet < 40, f"only {len(out)} of {n} events came: {out}"
            continue
        out.append(item)
        if len(out) == n:
            break
    await stream.aclose()  # type: ignore[attr-defined]
    return out


ARABIC_INDIC = str.maketrans("0123456789", "".join(chr(0x660 + d) for d in range(10)))
