"""Stalled clients: the clocks of a connection, and what serve grants clients that stop
reading (slow clients, and those that read nothing: docs/security.md).

``HeadClock`` bounds the time a client takes to send its next request head (slowloris);
``StallWatch`` the time it may take none of an answer serve wrote it (``cli/heads.py`` runs
both on every connection). An answer goes to the client through its connection's transport;
past the transport's high-water mark the transport pauses the writer (uvicorn's flow control)
and the answer waits, holding what it has not written (``api/answers.py`` counts that against
budgets, per token and per process). From the pause the watch samples the transport's
buffer: a connection whose client took none of it for the send timeout (nginx's
``send_timeout``, as a bound between two reads of the client, not on the whole answer) is
aborted, not closed (a close waits to flush what the client will never read): the buffer is
freed, the answer (an event stream, its slot) ends, the connection goes. A client that reads
slowly but steadily takes something in every period and is never cut; an event stream whose
client reads keeps its transport under the mark (keepalives are a few bytes).

``reader_options`` are serve's options for both: the send timeout and the answer budgets.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click

from ..api.answers import DEFAULT_PER_PROCESS, DEFAULT_PER_TOKEN, MIB, AnswerLimits

SEND_TIMEOUT = 30.0
"""Seconds a client may take none of what serve wrote it before its connection is aborted. An
event stream sends a keepalive every 15 s or so, and a reading client takes each at once; a
phone on a poor link takes something every second. nginx's ``send_timeout`` is 60 s; half of
it, as a stalled answer holds its memory (within its budget) until then."""


class _Clock:
    """What both clocks share: one timer per connection, armed only when none is (it fires at
    or before the time asked, and the clock looks again then), never one per request or per
    pause."""

    __slots__ = ("_loop", "_seconds", "_timer")

    SLACK = 0.005  # a timer may fire a little early (clock resolution, uvloop's milliseconds)

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float) -> None:
        self._loop, self._seconds = loop, seconds
        self._timer: asyncio.TimerHandle | None = None

    def _arm(self, when: float) -> None:
        if self._timer is None:
            self._timer = self._loop.call_at(when, self._fired)

    def _fired(self) -> None:
        self._timer = None
        self._tick()

    def _tick(self) -> None:
        raise NotImplementedError

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class HeadClock(_Clock):
    """The bound on one connection's next head: one timer per connection, not per request.

    ``start`` (the client's turn) moves a due time; ``stop`` (a head came) clears it. When the
    timer fires early (the due time moved on since), it is armed again for the new due time,
    and when nothing is due it lapses. A keep-alive connection sending requests back to back
    thus costs one timer per ``seconds``, not one per request.
    """

    __slots__ = ("_due", "_expired")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, seconds: float, expired: Callable[[], None]
    ) -> None:
        super().__init__(loop, seconds)
        self._expired = expired
        self._due: float | None = None

    def start(self) -> None:
        """A head is due within ``seconds`` from now."""
        # A due time only grows (now + a constant): an armed timer fires at or before it.
        self._due = self._loop.time() + self._seconds
        self._arm(self._due)

    def stop(self) -> None:
        """The head is whole: nothing is due until ``start``."""
        self._due = None

    def cancel(self) -> None:
        """The connection is gone."""
        self._due = None
        self._disarm()

    def _tick(self) -> None:
        due = self._due
        if due is None:
            return
        if due - self._loop.time() > self.SLACK:
            self._arm(due)
            return
        self._due = None
        self._expired()


class StallWatch(_Clock):
    """The send timeout of one connection. It watches while nothing more can be written: the
    transport holds over its high-water mark (writing paused), or it is closing with some
    of the last answer still in it. It samples the transport's buffer every
    ``seconds / STEPS``; a sample smaller than the last is the client taking something. When
    ``seconds`` pass without that, ``stalled`` is called: between ``seconds`` and ``seconds``
    plus one step after the client last took anything.
    """

    __slots__ = ("_buffered", "_final", "_last", "_quiet_since", "_stalled")

    STEPS = 4

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        seconds: float,
        buffered: Callable[[], int],
        stalled: Callable[[], None],
    ) -> None:
        super().__init__(loop, seconds)
        self._buffered, self._stalled = buffered, stalled
        self._last: int | None = None  # the buffer at the last sample; None: not watching
        self._final = False  # closing: what is buffered is all there will be
        self._quiet_since = 0.0

    def paused(self) -> None:
        """Writing paused: the transport holds over its mark (the client just took something,
        or has not started: the clock starts now)."""
        self._watch()

    def closing(self) -> None:
        """The connection is closing; a close waits until the client took what is buffered:
        watched until it has (or is stalled), whatever the marks."""
        if self._buffered():
            self._final = True
            self._watch()

    def resumed(self) -> None:
        """The client took the transport under its low mark: not watching (the timer lapses),
        unless the connection is closing."""
        if not self._final:
            self._last = None

    def cancel(self) -> None:
        """The connection is gone."""
        self._last = None
        self._disarm()

    def _watch(self) -> None:
        self._last = self._buffered()
        self._quiet_since = self._loop.time()
        self._arm(self._quiet_since + self._seconds / self.STEPS)

    def _tick(self) -> None:
        if self._last is None:
            return
        now, size = self._loop.time(), self._buffered()
        if not size and self._final:
            self._last = None  # all taken: the close completes
            return
        if size < self._last:
            self._quiet_since = now
        self._last = size
        if now - self._quiet_since >= self._seconds - self.SLACK:
            self._last = None
            self._stalled()
            return
        self._arm(now + self._seconds / self.STEPS)


@dataclass(frozen=True, slots=True)
class Readers:
    """What serve grants clients that stop reading: ``send_timeout`` seconds taking nothing of
    an answer, and ``answers``, the bytes answers may hold for them (``api/answers.py``)."""

    send_timeout: float = SEND_TIMEOUT
    answers: AnswerLimits = field(default_factory=AnswerLimits)


def reader_options(command: Callable[..., None]) -> Callable[..., None]:
    """--send-timeout / --answers-buffer-mib / --answers-buffer-mib-per-token, handed to
    ``command`` as one ``readers`` (``Readers``)."""

    @functools.wraps(command)
    def with_readers(
        *args: Any,
        send_timeout: float,
        answers_buffer_mib: int,
        answers_buffer_mib_per_token: int,
        **kwargs: Any,
    ) -> None:
        answers = AnswerLimits(answers_buffer_mib * MIB, answers_buffer_mib_per_token * MIB)
        command(*args, readers=Readers(send_timeout, answers), **kwargs)

    options = [
        click.option(
            "--send-timeout",
            default=SEND_TIMEOUT,
            show_default=True,
            envvar="PROMPT_OUTBOX_SEND_TIMEOUT",
            type=click.FloatRange(min=0, min_open=True),
            help="seconds a client may take none of what serve wrote it (its answer waiting) "
            "before the connection is aborted; a client reading slowly but steadily is never cut",
        ),
        click.option(
            "--answers-buffer-mib",
            default=DEFAULT_PER_PROCESS // MIB,
            show_default=True,
            envvar="PROMPT_OUTBOX_ANSWERS_BUFFER_MIB",
            type=click.IntRange(min=1),
            help="MiB all answers of this process (lists, event-stream messages) may hold that "
            "their clients have not taken (503 answers_buffer_full past it)",
        ),
        click.option(
            "--answers-buffer-mib-per-token",
            default=DEFAULT_PER_TOKEN // MIB,
            show_default=True,
            envvar="PROMPT_OUTBOX_ANSWERS_BUFFER_MIB_PER_TOKEN",
            type=click.IntRange(min=1),
            help="MiB one token's answers may hold that their clients have not taken (429 "
            "answers_buffer_full past it; an open event stream ends, and resumes by its last ID)",
        ),
    ]
    for option in reversed(options):
        with_readers = option(with_readers)
    return with_readers
