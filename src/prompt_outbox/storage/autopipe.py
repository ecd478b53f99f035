"""Auto-pipelining on a standalone server: the script calls that tasks make in one turn of
the event loop go to Valkey in one pipeline, as ioredis's ``enableAutoPipelining`` does.

With many sessions in flight, a batch of replies wakes many drains in the same turn, and each
makes its next call at once: one write, one connection taken from the pool, one health check
for all of them, where each call alone costs the client more than the server spends on it
(docs/performance.md). Nothing else changes: each call is still one script, atomic by
itself, and its caller still waits for its own reply before its next call; a call that met
NOSCRIPT did not run, and is sent again after the scripts are loaded; an error reaches the
caller whose call it was, and a lost connection every caller of the pipeline, as it would
have reached each of them alone.

A cluster refuses scripts in a pipeline: there every call goes alone (``Store`` decides).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from valkey.asyncio import Valkey
from valkey.commands.core import AsyncScript
from valkey.exceptions import NoScriptError


@dataclass(slots=True)
class _Call:
    script: AsyncScript
    keys: Sequence[Any]
    args: Sequence[Any]
    reply: asyncio.Future[Any]


class AutoPipeline:
    """Script calls of one turn, sent together. The first caller of a turn sends the batch,
    after one yield so that the tasks woken with it can add theirs."""

    def __init__(self, client: Valkey, load_scripts: Callable[[], Awaitable[None]]) -> None:
        self._client = client
        self._load_scripts = load_scripts
        self._batch: list[_Call] = []
        self._sending: set[asyncio.Task[None]] = set()

    async def call(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run ``script`` with ``keys`` and ``args``; its reply (its error raised)."""
        loop = asyncio.get_running_loop()
        call = _Call(script, keys, args, loop.create_future())
        self._batch.append(call)
        if len(self._batch) == 1:  # the first of this turn: it sends the batch
            try:
                await asyncio.sleep(0)
            except BaseException:  # cancelled: its own call is not sent, the others' are
                self._batch.remove(call)
                self._dispatch()
                raise
            if len(self._batch) == 1:  # alone after all: no pipeline needed
                self._batch = []
                return await script(keys=list(keys), args=list(args))
            self._dispatch()
        return await call.reply

    def _dispatch(self) -> None:
        batch, self._batch = self._batch, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._sending.add(task)  # held: the batch is sent even if its first caller is not
            task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[_Call]) -> None:
        try:
            left = batch
            for attempt in (1, 2):
                pipe = self._client.pipeline(transaction=False)
                for c in left:
                    pipe.evalsha(c.script.sha, len(c.keys), *c.keys, *c.args)
                answers = await pipe.execute(raise_on_error=False)
                retry = []
                for c, answer in zip(left, answers, strict=True):
                    if attempt == 1 and isinstance(answer, NoScriptError):
                        retry.append(c)  # it did not run: safe to send again once loaded
                    elif isinstance(answer, Exception):
                        _settle(c.reply, error=answer)
                    else:
                        _settle(c.reply, answer)
                if not retry:
                    return
                await self._load_scripts()
                left = retry
            raise AssertionError("unreachable")  # attempt 2 settles every call
        except BaseException as exc:
            for c in batch:
                _settle(c.reply, error=exc)
            if not isinstance(exc, Exception):
                raise


def _settle(
    reply: asyncio.Future[Any], value: Any = None, *, error: BaseException | None = None
) -> None:
    if reply.done():
        return
    if isinstance(error, asyncio.CancelledError):
        reply.cancel()
    elif error is not None:
        reply.set_exception(error)
    else:
        reply.set_result(value)
