"""The spans of a prompt's delivery (core/tracing.py; docs/observability.md, "Traces"): each a
child of the accept span, through the trace context the entry (or its turn's record) keeps,
in whichever worker runs it. The engine and the turns call these around what they already
do; with tracing off each is the call itself."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import TypeVar

from ..core import machine
from ..core.callbacks import Hook, Turn, Verdict
from ..core.entry import Entry
from ..core.keys import SessionKeys
from ..core.tracing import NOOP, about, tracing
from ..storage.turnstore import EndedTurn

T = TypeVar("T")

SEND = "prompt_outbox.send"
VERIFY = "prompt_outbox.verify"
ON_DELIVERED = "prompt_outbox.on_delivered"
TURN = "prompt_outbox.turn"


async def send(
    k: SessionKeys, entry: Entry, call: Awaitable[tuple[T | None, BaseException | None]]
) -> tuple[T | None, BaseException | None]:
    """One send attempt (``call``: the bounded deliverer call, current under the span, so a
    deliverer's own requests carry it): its outcome class, and why it failed."""
    t = tracing()
    if t is NOOP:
        return await call
    attributes = about(k.ws, k.ses, entry.id)
    attributes["prompt_outbox.attempts"] = entry.attempts
    attributes["prompt_outbox.transient_fails"] = entry.transient_fails
    with t.span(SEND, entry.trace, attributes, client=True) as span:
        result, failure = await call
        span.set("prompt_outbox.outcome", machine.classify(failure).value)
        if isinstance(result, Turn):
            span.set("prompt_outbox.turn", result.id)
        if failure is not None:
            span.fail(machine.describe(failure))
        return result, failure


async def verify(k: SessionKeys, entry: Entry, call: Awaitable[Verdict]) -> Verdict:
    """The verification of an ambiguous send: the verifier's verdict (what it raised is the
    span's error)."""
    t = tracing()
    if t is NOOP:
        return await call
    with t.span(VERIFY, entry.trace, about(k.ws, k.ses, entry.id), client=True) as span:
        verdict = await call
        span.set("prompt_outbox.verdict", verdict.name.lower())
        return verdict


def hook(on_delivered: Hook) -> Hook:
    """The OnDelivered hook, each call a span (what it raises is the span's error)."""
    if tracing() is NOOP:
        return on_delivered

    async def traced(ws: str, ses: str, entry: Entry) -> None:
        with tracing().span(ON_DELIVERED, entry.trace, about(ws, ses, entry.id)):
            await on_delivered(ws, ses, entry)

    return traced


def turn_ended(k: SessionKeys, turn_id: str, ended: EndedTurn, why: str, seconds: float) -> None:
    """The turn, as a span from its start to now, written when its end is learned (by any
    worker, or the end route)."""
    t = tracing()
    if t is NOOP:
        return
    attributes = about(k.ws, k.ses, ended.entry)
    attributes.update({"prompt_outbox.turn": turn_id, "prompt_outbox.turn.why": why})
    attributes["prompt_outbox.turn.seconds"] = seconds
    began = time.time_ns() // 1_000_000 - round(seconds * 1000)  # the outbox's clock may differ
    with t.span(TURN, ended.trace, attributes, start_ms=began):
        pass
