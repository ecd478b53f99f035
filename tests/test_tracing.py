"""Traces (docs/observability.md, "Traces"; core/tracing.py): one trace per prompt, from the HTTP
accept (the caller's W3C traceparent its parent) through every send attempt, the verification
of an ambiguous send, the OnDelivered call and the turn's end, in another Outbox (as another
process would be), because the entry keeps the accept span's context. With OpenTelemetry's SDK
and its in-memory exporter; tests/test_tracing_process.py has the processes (console exporter,
and nothing imported without the extra)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from prompt_outbox import AmbiguousError, Entry, Outbox, Turn, Verdict
from prompt_outbox.core.entry import decode_entry, encode_entry
from prompt_outbox.core.keys import session_keys
from prompt_outbox.core.tracing import NOOP, tracing, use_provider
from prompt_outbox.core.turns import TurnHold, decode_turn
from prompt_outbox.storage.client import Client
from tests.support.tunables import FAST

pytestmark = pytest.mark.cluster_too

URL = "/v1/workspaces/acme/sessions/chat-1/prompts"
ALICE = {"Authorization": "Bearer alice-token"}
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on for this test, into memory (a provider of the outbox's own: the process's
    global one stays unset, so no other test is traced)."""
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    use_provider(provider)
    try:
        yield exporter
    finally:
        use_provider(None)
        provider.shutdown()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def ids(span: ReadableSpan) -> tuple[str, str, str]:
    """(trace ID, span ID, parent span ID) in hex."""
    assert span.context is not None
    parent = f"{span.parent.span_id:016x}" if span.parent is not None else ""
    return f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}", parent


async def stored(client: Client, ws: str = "acme", ses: str = "chat-1") -> list[str]:
    """The raw JSON of the session's queued entries, as Valkey holds them."""
    raw = await client.lrange(session_keys(ws, ses).queue, 0, -1)
    return [r.decode() if isinstance(r, bytes) else str(r) for r in raw]


class Agent:
    """Ambiguous at its first send (the prompt may have landed), then takes the prompt and
    starts a turn; its transcript says the first send did not land."""

    def __init__(self) -> None:
        self.sends = 0

    async def __call__(self, ws: str, ses: str, entry: Entry) -> Turn:
        self.sends += 1
        if self.sends == 1:
            raise AmbiguousError(TimeoutError("cut mid-send"))
        return Turn("turn-1")


async def test_one_trace_from_the_http_accept_through_a_workers_delivery_to_the_turns_end(
    spans: InMemorySpanExporter, http: httpx.AsyncClient, outbox: Outbox, client: Client
) -> None:
    r = await http.post(
        URL,
        json={"clientMessageID": "m1", "text": "hi"},
        headers={**ALICE, "traceparent": TRACEPARENT},
    )
    assert r.status_code == 202, r.text
    entry_id = r.json()["id"]
    (accept,) = named(spans, "prompt_outbox.accept")
    trace_id, accept_id, parent = ids(accept)
    assert (trace_id, parent) == (TRACE_ID, CALLER_SPAN)  # the caller's trace, its child
    assert accept.attributes is not None and accept.attributes["prompt_outbox.entry"] == entry_id

    # The entry keeps the accept span's context; the public forms do not show it.
    (raw,) = await stored(client)
    assert json.loads(raw)["traceparent"] == f"00-{TRACE_ID}-{accept_id}-01"
    assert "traceparent" not in (await http.get(URL, headers=ALICE)).text

    # A worker of its own, as another process would be: the trace goes on from the entry.
    worker, agent, hooked = Outbox(client, FAST), Agent(), []
    worker.set_verifier(lambda ws, ses, e: _verdict(Verdict.ABSENT))

    async def on_delivered(ws: str, ses: str, e: Entry) -> None:
        hooked.append(e.id)

    worker.set_on_delivered(on_delivered)
    for _ in range(6):  # ambiguous send, its verification (absent), the second send
        if hooked:
            break
        await _deliver_when_due(worker, agent)
    assert hooked == [entry_id] and agent.sends == 2
    ended = await Outbox(client, FAST).end_turn("acme", "chat-1", "turn-1")  # the end route's
    assert ended.ended

    sends = named(spans, "prompt_outbox.send")
    (verify,) = named(spans, "prompt_outbox.verify")
    (hook,) = named(spans, "prompt_outbox.on_delivered")
    (turn,) = named(spans, "prompt_outbox.turn")
    assert len(sends) == 2  # the retry is an attempt span of its own
    for span in [*sends, verify, hook, turn]:
        assert ids(span)[0] == trace_id and ids(span)[2] == accept_id, span.name
        assert span.attributes is not None and span.attributes["prompt_outbox.entry"] == entry_id
    assert [s.attributes and s.attributes["prompt_outbox.outcome"] for s in sends] == [
        "ambiguous",
        "delivered",
    ]
    assert verify.attributes is not None and verify.attributes["prompt_outbox.verdict"] == "absent"
    assert turn.attributes is not None and turn.attributes["prompt_outbox.turn"] == "turn-1"
    assert turn.attributes["prompt_outbox.turn.why"] == "ended"


async def _verdict(v: Verdict) -> Verdict:
    return v


async def _deliver_when_due(worker: Outbox, agent: Agent) -> None:
    """One step, once the entry is due (a verification and a re-send wait their backoffs)."""
    for _ in range(200):
        if await worker.deliver_once("acme", "chat-1", agent):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("nothing became due")


HOSTILE = [
    f'00-{TRACE_ID}-{CALLER_SPAN}-01","x":"y',  # JSON in the header
    f"00-{TRACE_ID}-{CALLER_SPAN}-01-{'a' * 300}",  # version 00 with more after it
    f"00-{'0' * 32}-{CALLER_SPAN}-01",  # an all-zero trace ID is invalid
    f"00-{TRACE_ID[:-1]}g-{CALLER_SPAN}-01",  # not hex
]


@pytest.mark.parametrize("hostile", HOSTILE)
async def test_a_hostile_traceparent_is_never_stored(
    hostile: str, spans: InMemorySpanExporter, http: httpx.AsyncClient, client: Client
) -> None:
    r = await http.post(
        URL, json={"clientMessageID": "m1", "text": "hi"}, headers={**ALICE, "traceparent": hostile}
    )
    assert r.status_code == 202, r.text
    (accept,) = named(spans, "prompt_outbox.accept")
    trace_id, accept_id, parent = ids(accept)
    assert trace_id != TRACE_ID and parent == ""  # a trace of its own
    (raw,) = await stored(client)
    assert json.loads(raw)["traceparent"].startswith(f"00-{trace_id}-{accept_id}-")


def test_a_stored_trace_context_that_is_not_a_traceparent_is_dropped() -> None:
    good = Entry.from_json(
        f'{{"id":"e1","acceptedAt":"2026-01-01T00:00:00Z","traceparent":"{TRACEPARENT}"}}'
    )
    assert good.trace == TRACEPARENT and f'"traceparent":"{TRACEPARENT}"' in good.to_json()
    for bad in [*HOSTILE, 12, None, ["x"], TRACEPARENT.upper()]:
        raw = json.dumps({"id": "e1", "acceptedAt": "2026-01-01T00:00:00Z", "traceparent": bad})
        entry = decode_entry(raw)
        assert entry.trace == "" and "traceparent" not in entry.to_json(), bad
    # Nor does a turn's record keep one.
    hold = TurnHold("t", "e1", 1, 2, trace=TRACEPARENT)
    assert decode_turn(hold.encode()) == hold
    forged = hold.encode().replace(TRACEPARENT, HOSTILE[0].replace('"', "'"))
    assert decode_turn(forged) == TurnHold("t", "e1", 1, 2)


def test_the_trace_context_is_in_the_stored_form_only() -> None:
    entry = Entry("e1", "m1", "u", "hi", decode_entry(
        '{"id":"e1","acceptedAt":"2026-01-01T00:00:00Z"}'
    ).accepted_at, trace=TRACEPARENT)  # fmt: skip
    assert "traceparent" in entry.to_json()
    for public in (encode_entry(entry, with_list_fields=False), entry.to_list_json()):
        assert "traceparent" not in public  # a webhook's body, List, events


def test_tracing_is_off_until_a_provider_is_given() -> None:
    assert tracing() is NOOP  # this process has set no global provider
    entry = decode_entry('{"id":"e1","acceptedAt":"2026-01-01T00:00:00Z"}')
    assert entry.traced() is entry
