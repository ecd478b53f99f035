"""How long a request may wait for its answer to start: a per-request deadline.

Without one, a request waits for Valkey as long as its client's socket timeout: while Valkey
is frozen (SIGSTOP, a stalled disk, a partition), 10 s per call at serve's defaults
(``cli/storage.py``: ``max(10, durability_timeout + 5)``; a new connection may add its 5 s
connect timeout), more on a cluster, whose client retries. ``Deadline`` is ASGI middleware
that cuts the request at ``seconds`` and answers 503 ``deadline_exceeded`` with
``Retry-After`` instead, on every route, the hot accept path included.

The deadline covers the time until the response starts: an event stream is bound until its
first bytes (the reset), never after. Deliveries are not under it: they run detached in the
run loop, not under a request. It covers the request's body too (``create_app`` installs it
outside the request guard, which reads a chunked body itself): when it passes while the app
waits on the body, the client is the slow party, and the answer is 408 ``request_timeout``,
closing the connection (a client trickling its body holds a connection that long at most).
The head has its own bound, in the HTTP protocol ``serve`` runs (``cli/heads.py``).

An accept cut by it may have been written: the client sends it again with the same
``clientMessageID`` and gets the first accept's ID (a replay), so the default stays above
``Tunables.durability_timeout``, past which an accept answers ``not_durable`` with its
entry's ID by itself (``request_deadline_for``).
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core.settings import Tunables
from .errors import UNAVAILABLE_RETRY_AFTER, error_response

DEADLINE_MARGIN = 2.0
"""Seconds the default deadline leaves after ``durability_timeout``: the accept's own round
trips around its WAITAOF, so that a slow fsync answers ``not_durable`` (with the ID)."""


def request_deadline_for(tunables: Tunables, given: float | None = None) -> float:
    """The deadline: ``given``, or ``durability_timeout`` + ``DEADLINE_MARGIN`` (7 s at the
    defaults). ValueError when ``given`` is not above ``durability_timeout``: a slow accept
    would lose its ``not_durable`` answer, which carries its entry's ID."""
    if given is None:
        return tunables.durability_timeout + DEADLINE_MARGIN
    if not given > tunables.durability_timeout:
        raise ValueError(
            f"the request deadline ({given:g} s) must exceed durability_timeout "
            f"({tunables.durability_timeout:g} s): a slow accept answers not_durable, with "
            "its entry's ID, at durability_timeout"
        )
    return given


class Deadline:
    """ASGI middleware: 503 ``deadline_exceeded`` when the app has not started its answer
    within ``seconds`` (408 ``request_timeout`` when it is still waiting on the body)."""

    def __init__(self, app: ASGIApp, *, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"the request deadline must be > 0 s, got {seconds!r}")
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # A timer handle and two flags rather than asyncio.timeout: the same cancel, and a
        # third of its cost on the hot path (4 us against 7 us a request, bench in process).
        task = asyncio.current_task()
        assert task is not None
        started = fired = False
        # The app waits on the client when it is in receive() before the body's last part
        # (a request with no body has its one message waiting, so only a body can be late).
        reading = body_done = body_late = False

        def fire() -> None:
            nonlocal fired, body_late
            if not started:
                fired = True
                body_late = reading and not body_done
                task.cancel()

        timer = asyncio.get_running_loop().call_later(self.seconds, fire)

        async def send_started(message: Message) -> None:
            nonlocal started
            if not started and message["type"] == "http.response.start":
                if fired:  # the deadline won the race: its 503 (or 408) is the answer
                    raise asyncio.CancelledError
                started = True
                timer.cancel()  # the answer has begun: a stream may run on
            await send(message)

        async def receive_seen() -> Message:
            nonlocal reading, body_done
            reading = True
            try:
                message = await receive()
            finally:
                reading = False
            if not message.get("more_body", False):
                body_done = True
            return message

        try:
            await self.app(scope, receive_seen, send_started)
        except asyncio.CancelledError:
            if not fired or task.uncancel() > 0:
                raise  # not ours, or cancelled for another reason too (a shutdown)
        else:
            if not fired:
                return
            task.uncancel()  # the app swallowed our cancel and returned without an answer
        finally:
            timer.cancel()
        if body_late:
            await _body_late(scope, receive, send, self.seconds)
            return
        response = error_response(
            503,
            "deadline_exceeded",
            f"no answer within {self.seconds:g} s (Valkey is slow or unreachable): retry "
            "later. An accept may have been written: send it again with the same "
            "clientMessageID, and a replay answers with its ID",
            headers=UNAVAILABLE_RETRY_AFTER,
        )
        await response(scope, receive, send)


async def _body_late(scope: Scope, receive: Receive, send: Send, seconds: float) -> None:
    # Connection: close: the rest of the body must not be read as the next request.
    detail = f"the request body did not arrive within {seconds:g} s"
    response = error_response(408, "request_timeout", detail, headers={"Connection": "close"})
    await response(scope, receive, send)
