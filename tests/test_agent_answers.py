"""What the deliverers read from agents is bounded (docs/security.md, "The deliverers and the
agent"): a webhook receiver, a verify URL or an opencode server answering 200 MB, or trickling a
byte at a time, neither grows the worker nor holds it, and the outcome class stays the one the
status gives.

Every agent is a real HTTP server on loopback (``tests.standin``) that streams its body in
chunks and records how much of it got onto the wire before the client hung up; the client's
transport counts the bytes it read. The code before this change read every body whole."""

from __future__ import annotations

import asyncio
import json
import logging
import zlib
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import httpx
import pytest

from prompt_outbox import Entry, Outbox, Status, Verdict
from prompt_outbox.core.errors import AmbiguousError
from prompt_outbox.deliver import OpencodeDeliverer, WebhookDeliverer, template_targets
from prompt_outbox.deliver.answer import (
    DETAIL_CHARS,
    AnswerTimeout,
    KiB,
    MalformedAnswer,
    MiB,
    bounded_request,
    plain_detail,
)
from prompt_outbox.deliver.opencode import ABORT_ANSWER_BYTES, SEND_ANSWER_BYTES, message_id
from prompt_outbox.deliver.webhook import SEND_ANSWER_BYTES as HOOK_SEND_BYTES
from prompt_outbox.deliver.webhook import VERIFY_ANSWER_BYTES
from tests.standin import CHUNK, CountingTransport, Reply, StandIn, counting_client, stand_in

WS, SES = "ws", "s1"
HUGE = 200 * 1000 * 1000  # what a broken agent answers; the old code read all of it
SECRET = b"test-secret"
Counted = tuple[httpx.AsyncClient, CountingTransport]


@pytest.fixture
def agent() -> Iterator[StandIn]:
    with stand_in() as a:
        yield a


@pytest.fixture
async def counted() -> AsyncIterator[Counted]:  # a client, and what it read
    client, transport = counting_client()
    yield client, transport
    await client.aclose()


def _entry(text: str = "hi") -> Entry:
    now = datetime.now(UTC)
    return Entry("e1", "c1", "u", text, now, last_attempt_at=now)


def assert_bounded(agent: StandIn, transport: CountingTransport, bound: int) -> None:
    """The client read at most one network read past ``bound``, and hung up on the agent
    long before it could send its body (the old code read it to the end)."""
    served = agent.last()
    assert transport.read <= bound + CHUNK, transport.read
    assert served.cut and served.sent < served.length // 2, (served.sent, served.length)


# -- webhook ---------------------------------------------------------------------------------


def hook(agent: StandIn, counted: Counted, outbox: Outbox | None = None) -> WebhookDeliverer:
    """The deliverer on the counting client; with ``outbox``, also its verifier there (so an
    ambiguous send shows as verifying)."""
    deliverer = WebhookDeliverer(
        agent.url + "/hook",
        secret=SECRET,
        verify_url=agent.url + "/verify",
        timeout=10.0,
        client=counted[0],
    )
    if outbox is not None:
        outbox.set_verifier(deliverer.verify)
    return deliverer


async def test_a_2xx_with_a_200_mb_body_is_delivered_reading_a_few_kib(
    manual_outbox: Outbox, agent: StandIn, counted: Counted
) -> None:
    agent.replies["POST /hook"] = Reply(200, head=b"ok", pad=HUGE)
    await manual_outbox.accept(WS, SES, "u", "c1", "hello")
    assert await manual_outbox.deliver_once(WS, SES, hook(agent, counted, manual_outbox))
    assert await manual_outbox.list(WS, SES) == []  # delivered
    assert_bounded(agent, counted[1], HOOK_SEND_BYTES)


async def test_a_5xx_with_a_200_mb_body_is_ambiguous_with_its_first_bytes_as_detail(
    manual_outbox: Outbox, agent: StandIn, counted: Counted
) -> None:
    agent.replies["POST /hook"] = Reply(500, head=b"boom: ", pad=HUGE, fill=b"x")
    await manual_outbox.accept(WS, SES, "u", "c1", "hello")
    assert await manual_outbox.deliver_once(WS, SES, hook(agent, counted, manual_outbox))
    [e] = await manual_outbox.list(WS, SES)
    assert e.status is Status.VERIFYING
    # Cut to DETAIL_CHARS, the last an ellipsis.
    assert e.last_error == "webhook answered 500: boom: " + "x" * 193 + "\u2026"
    assert_bounded(agent, counted[1], HOOK_SEND_BYTES)


@pytest.mark.parametrize(
    "reply",
    [
        # The old code stripped the spaces and answered DELIVERED, after reading 200 MB.
        Reply(200, head=b"delivered", pad=HUGE, content_type="text/plain"),
        Reply(200, head=b'{"status": "delivered", "pad": "', pad=HUGE, tail=b'"}'),
    ],
    ids=["text", "json"],
)
async def test_a_verify_answer_past_its_bound_is_inconclusive_never_a_verdict(
    agent: StandIn,
    counted: Counted,
    reply: Reply,
    caplog: pytest.LogCaptureFixture,
) -> None:
    deliverer = hook(agent, counted)
    agent.replies["GET /verify"] = Reply(
        200, head=reply.head + reply.tail, content_type=reply.content_type
    )
    assert await deliverer.verify(WS, SES, _entry()) is Verdict.DELIVERED  # short, it is heard
    agent.replies["GET /verify"] = reply
    with caplog.at_level(logging.WARNING, "prompt_outbox.webhook"):
        assert await deliverer.verify(WS, SES, _entry()) is Verdict.INCONCLUSIVE
    assert f"longer than {VERIFY_ANSWER_BYTES} bytes" in caplog.text
    assert_bounded(agent, counted[1], VERIFY_ANSWER_BYTES)


async def test_a_verify_answer_nested_too_deep_is_inconclusive(
    agent: StandIn, counted: Counted
) -> None:
    # json.loads raised RecursionError, out of the verifier.
    agent.replies["GET /verify"] = Reply(200, head=b'{"status": ' + b"[" * 3000)
    assert await hook(agent, counted).verify(WS, SES, _entry()) is Verdict.INCONCLUSIVE


async def test_a_compressed_error_answer_is_not_decompressed(
    manual_outbox: Outbox, agent: StandIn, counted: Counted
) -> None:
    """A gzip bomb: ~200 KB on the wire, 200 MB once inflated (the old code inflated it for
    ``response.text``). An agent may compress only if asked; the deliverer asks for identity."""
    agent.replies["POST /hook"] = Reply(503, head=gzip_of_zeros(HUGE), encoding="gzip")
    await manual_outbox.accept(WS, SES, "u", "c1", "hello")
    assert await manual_outbox.deliver_once(WS, SES, hook(agent, counted, manual_outbox))
    [e] = await manual_outbox.list(WS, SES)
    assert e.status is Status.VERIFYING
    assert e.last_error == "webhook answered 503: (gzip-encoded answer, not decompressed)"
    assert counted[1].read <= HOOK_SEND_BYTES + CHUNK


def gzip_of_zeros(size: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip container
    block = bytes(MiB)
    out = [packer.compress(block) for _ in range(size // MiB)]
    return b"".join(out) + packer.flush()


async def test_a_trickled_answer_ends_at_the_deliverers_timeout(
    agent: StandIn, counted: Counted
) -> None:
    """One byte per 20 ms never trips httpx's per-read timeout: the old code waited until
    the whole body had come (here, for ever: pytest-timeout ended it). Each request now has
    ``timeout`` in total; past it, the send is ambiguous, like any read timeout."""
    client = counted[0]
    deliverer = WebhookDeliverer(
        agent.url + "/hook",
        secret=SECRET,
        verify_url=agent.url + "/verify",
        timeout=0.5,
        client=client,
    )
    agent.replies["POST /hook"] = Reply(200, pad=MiB, trickle=0.02)
    agent.replies["GET /verify"] = Reply(200, pad=MiB, trickle=0.02)
    async with asyncio.timeout(60):  # a guard against a hang, not a measure
        with pytest.raises(AmbiguousError, match="timeout"):
            await deliverer(WS, SES, _entry())
        assert agent.last().cut
        with pytest.raises(httpx.TimeoutException):  # to the engine: "verifier failed"
            await deliverer.verify(WS, SES, _entry())
        assert agent.last().cut


# -- opencode --------------------------------------------------------------------------------


def opencode(
    agent: StandIn,
    counted: Counted,
    outbox: Outbox | None = None,
    *,
    timeout: float = 10.0,
    max_bytes: int = 64 * MiB,
) -> OpencodeDeliverer:
    """As ``hook``, for opencode: every session ID maps to the same ID on the stand-in."""
    deliverer = OpencodeDeliverer(
        template_targets(agent.url, allow_shared_sessions=True),
        timeout=timeout,
        transcript_max_bytes=max_bytes,
        client=counted[0],
    )
    if outbox is not None:
        outbox.set_verifier(deliverer.verify)
    return deliverer


async def test_opencode_send_with_a_huge_answer_is_delivered_reading_a_few_kib(
    manual_outbox: Outbox, agent: StandIn, counted: Counted
) -> None:
    """prompt_async answers 204 with nothing; a 2xx with 200 MB is delivered all the same
    (the status says the prompt is in), and only SEND_ANSWER_BYTES of it are read."""
    agent.replies[f"POST /session/{SES}/prompt_async"] = Reply(200, head=b"{", pad=HUGE)
    await manual_outbox.accept(WS, SES, "u", "c1", "hello")
    await manual_outbox.deliver_once(WS, SES, opencode(agent, counted, manual_outbox))
    assert await manual_outbox.list(WS, SES) == []  # delivered, its session in turn
    assert_bounded(agent, counted[1], SEND_ANSWER_BYTES)


async def test_opencode_send_answered_with_json_nested_too_deep_is_delivered(
    manual_outbox: Outbox, agent: StandIn, counted: Counted
) -> None:
    """The old code's RecursionError (from ``response.json()``) escaped the deliverer as a
    definitive failure: an attempt minted and the prompt sent again, a second turn."""
    agent.replies[f"POST /session/{SES}/prompt_async"] = Reply(200, head=b"[" * 100_000)
    await manual_outbox.accept(WS, SES, "u", "c1", "hello")
    await manual_outbox.deliver_once(WS, SES, opencode(agent, counted, manual_outbox))
    assert await manual_outbox.list(WS, SES) == []  # delivered, its session in turn
    assert len(agent.served) == 1


async def test_opencode_5xx_with_a_huge_body_is_ambiguous(
    manual_outbox: Outbox, agent: StandIn, counted: Counted
) -> None:
    agent.replies[f"POST /session/{SES}/prompt_async"] = Reply(500, head=b"{", pad=HUGE, fill=b"y")
    await manual_outbox.accept(WS, SES, "u", "c1", "hello")
    assert await manual_outbox.deliver_once(WS, SES, opencode(agent, counted, manual_outbox))
    [e] = await manual_outbox.list(WS, SES)
    detail = "{" + "y" * (DETAIL_CHARS - 2) + "\u2026"
    assert (e.status, e.last_error) == (Status.VERIFYING, "opencode answered 500: " + detail)
    assert_bounded(agent, counted[1], SEND_ANSWER_BYTES)


async def test_opencode_abort_reads_a_few_kib(agent: StandIn, counted: Counted) -> None:
    agent.replies[f"POST /session/{SES}/abort"] = Reply(200, head=b"true", pad=HUGE)
    await opencode(agent, counted).abort(WS, SES)
    assert_bounded(agent, counted[1], ABORT_ANSWER_BYTES)


def transcript(entry: Entry, pad: int) -> Reply:
    """A transcript that holds the entry's message first, then an assistant message of
    ``pad`` bytes: complete, it says DELIVERED; cut anywhere, it must say nothing."""
    created = int(datetime.now(UTC).timestamp() * 1000)
    user = {
        "info": {"id": message_id(entry), "role": "user", "time": {"created": created}},
        "parts": [{"type": "text", "text": entry.text}],
    }
    reply = {
        "info": {"id": "msg_x", "role": "assistant", "time": {"created": created}},
        "parts": [{"type": "text", "text": "<pad>"}],
    }
    head, tail = json.dumps([user, reply]).encode().split(b"<pad>")
    return Reply(200, head=head, pad=pad, tail=tail)


async def test_a_transcript_past_its_bound_is_inconclusive_and_logged(
    agent: StandIn, counted: Counted, caplog: pytest.LogCaptureFixture
) -> None:
    entry = _entry()
    deliverer = opencode(agent, counted, max_bytes=MiB)
    path = f"GET /session/{SES}/message"
    agent.replies[path] = transcript(entry, MiB // 2)
    assert await deliverer.verify(WS, SES, entry) is Verdict.DELIVERED  # under the bound
    agent.replies[path] = transcript(entry, HUGE)
    counted[1].read = 0
    with caplog.at_level(logging.WARNING, "prompt_outbox.opencode"):
        assert await deliverer.verify(WS, SES, entry) is Verdict.INCONCLUSIVE
    assert f"transcript is longer than {MiB} bytes: inconclusive" in caplog.text
    assert "transcript_max_bytes" in caplog.text  # the knob to turn
    assert_bounded(agent, counted[1], MiB)


async def test_a_trickled_transcript_is_inconclusive_at_the_timeout(
    agent: StandIn, counted: Counted
) -> None:
    entry = _entry()
    agent.replies[f"GET /session/{SES}/message"] = Reply(200, pad=MiB, trickle=0.02)
    deliverer = opencode(agent, counted, timeout=0.5)
    async with asyncio.timeout(60):  # a guard against a hang, not a measure
        assert await deliverer.verify(WS, SES, entry) is Verdict.INCONCLUSIVE
    assert agent.last().cut


def test_the_transcript_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="transcript_max_bytes"):
        OpencodeDeliverer(
            template_targets("http://127.0.0.1:1", allow_shared_sessions=True),
            transcript_max_bytes=0,
        )


# -- the helper ------------------------------------------------------------------------------


async def test_a_body_of_the_bound_is_whole_and_one_byte_more_is_cut(
    agent: StandIn, counted: Counted
) -> None:
    client = counted[0]
    agent.replies["GET /a"] = Reply(200, pad=1000, fill=b"a")
    agent.replies["GET /b"] = Reply(200, pad=1001, fill=b"b")
    whole = await bounded_request(client, "GET", agent.url + "/a", limit=1000, deadline=10)
    cut = await bounded_request(client, "GET", agent.url + "/b", limit=1000, deadline=10)
    assert (whole.body, whole.truncated, whole.incomplete) == (b"a" * 1000, False, "")
    assert whole.text() == "a" * 1000
    assert (cut.body, cut.truncated, cut.incomplete) == (
        b"b" * 1000,
        True,
        "longer than 1000 bytes",
    )


async def test_a_half_read_connection_is_closed_never_reused(
    agent: StandIn, counted: Counted
) -> None:
    client = counted[0]
    agent.replies["GET /big"] = Reply(200, pad=HUGE)
    for path in ("/small", "/small", "/big", "/small"):
        await bounded_request(client, "GET", agent.url + path, limit=4 * KiB, deadline=10)
    ports = [s.finished().port for s in agent.served]
    assert ports[0] == ports[1] == ports[2] != ports[3]  # kept alive until a body was left


async def test_past_its_deadline_a_request_is_an_httpx_timeout(
    agent: StandIn, counted: Counted
) -> None:
    agent.replies["GET /slow"] = Reply(200, pad=MiB, trickle=0.02)
    async with asyncio.timeout(60):  # a guard against a hang, not a measure
        with pytest.raises(AnswerTimeout, match=r"0\.3 s timeout") as caught:
            await bounded_request(counted[0], "GET", agent.url + "/slow", limit=MiB, deadline=0.3)
    assert isinstance(caught.value, httpx.TimeoutException)  # classed as a read timeout


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (Reply(200, head=b"[" * 4000), "nested too deep"),
        (Reply(200, head=b"[1, 2]", pad=4 * KiB), "longer than 4096 bytes"),
        (Reply(200, head=b"[1, 2]", encoding="gzip"), "gzip-encoded"),
        (Reply(200, head=b"\xff[]"), "not JSON"),
    ],
    ids=["deep", "cut", "compressed", "not-utf8"],
)
async def test_json_of_what_was_read_is_whole_or_malformed(
    agent: StandIn, counted: Counted, reply: Reply, why: str
) -> None:
    agent.replies["GET /j"] = reply
    answer = await bounded_request(counted[0], "GET", agent.url + "/j", limit=4 * KiB, deadline=10)
    with pytest.raises(MalformedAnswer, match=why):
        answer.json()


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ('{"error": "bad token"}', '{"error": "bad token"}'),  # JSON and plain text stay
        ("a < b, and\r\n\tc > d", "a < b, and c > d"),
        (
            "<p>You need to <b>sign&nbsp;in</b>.</p><!-- secret --><p>Again",
            "You need to sign in. Again",
        ),
        ('<html><body><h1>Forbidden</h1><div class="long', "Forbidden"),  # cut at the bound
        ("&lt;script&gt;alert(1)&lt;/script&gt;ok", "ok"),  # markup spelled in entities
        ("tab\x00nul\x1b[0m\u200bzero\u2028line", "tab nul [0m zero line"),
    ],
)
def test_an_agent_body_becomes_one_line_of_plain_words(body: str, detail: str) -> None:
    assert plain_detail(body) == detail


def test_a_detail_is_cut_to_its_bound() -> None:
    cut = plain_detail("<p>" + "word " * 100 + "</p>")
    assert len(cut) == DETAIL_CHARS and cut.endswith("\u2026")
    assert plain_detail("x" * DETAIL_CHARS) == "x" * DETAIL_CHARS
