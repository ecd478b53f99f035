"""Clients that stop reading (issue 22, red-team hole 1): what an answer holds for its client is
written an entry at a time and counted against budgets per token and per process
(api/answers.py). In process: the accounting, the pieces, a stream's end past its budget."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from prompt_outbox import Entry
from prompt_outbox.api.answers import (
    MAX_PIECE_BYTES,
    RESERVE,
    AnswerBuffers,
    AnswerLimits,
    charge,
    held_size,
    list_body,
)
from prompt_outbox.api.auth import Principal
from prompt_outbox.api.errors import ApiError
from prompt_outbox.api.sse import Item, event_stream, format_item
from prompt_outbox.core.entry import encode_list
from prompt_outbox.core.events import QueueEvent, QueueReset
from tests.test_api_events import RAW_MODEL

ALICE = Principal("alice", frozenset({"acme"}))
BOB = Principal("bob", frozenset({"other"}))
NOW = datetime.now(UTC)
CTRL = "\x01" * 34_000
"""The red team's text: 34 000 characters that JSON escapes to six each (204 KB, under the
200 KiB body limit); 25 of them make a 5.1 MB list or reset."""


def _entries(n: int, text: str = CTRL, model: str | None = None) -> list[Entry]:
    return [Entry(f"e{i}", f"c{i}", "u", text, NOW, model=model) for i in range(n)]


# -- the account ------------------------------------------------------------------------------


def test_past_the_tokens_bound_429_past_the_process_bound_503() -> None:
    account = AnswerBuffers(AnswerLimits(per_process=1000, per_token=600))
    first = account.take(ALICE, 400)
    second = account.take(ALICE, 200)  # 600: at the token's bound, not past it
    with pytest.raises(ApiError) as token:
        account.take(ALICE, 1)
    assert (token.value.status, token.value.code) == (429, "answers_buffer_full")
    assert token.value.headers == {"Retry-After": "5"}
    with pytest.raises(ApiError):
        account.admit(ALICE)  # already at its bound: refused before anything is read
    bobs = account.take(BOB, 400)
    with pytest.raises(ApiError) as process:  # bob is within his own bound; the process is not
        account.take(BOB, 1)
    assert (process.value.status, process.value.code) == (503, "answers_buffer_full")
    bobs.close()
    second.close()
    account.admit(ALICE)
    first.release(300)  # alice's answer wrote most of its part
    assert (account.held, account.holding(ALICE)) == (100, 100)
    first.close()
    first.close()  # idempotent
    assert (account.held, account.holding(ALICE)) == (0, 0)


def test_one_answer_larger_than_a_bound_is_served_alone() -> None:
    # A session past the defaults (Tunables.cap raised) is still listed: one at a time.
    account = AnswerBuffers(AnswerLimits(per_process=1000, per_token=100))
    big = account.take(ALICE, 5000)
    with pytest.raises(ApiError) as second:
        account.take(ALICE, 1)
    assert second.value.status == 429
    with pytest.raises(ApiError) as other:
        account.take(BOB, 5000)
    assert other.value.status == 503
    big.close()
    account.take(BOB, 5000).close()


def test_answer_limits_refuse_nonsense() -> None:
    for bad in ({"per_token": 0}, {"per_process": -1}, {"per_token": True}):
        with pytest.raises(ValueError, match="AnswerLimits"):
            AnswerLimits(**bad)  # type: ignore[arg-type]


# -- the pieces -------------------------------------------------------------------------------


async def _body(chunks: AsyncIterator[bytes]) -> list[bytes]:
    return [chunk async for chunk in chunks]


async def test_a_list_is_written_an_entry_at_a_time_each_released_as_it_goes() -> None:
    entries = _entries(25) + _entries(3, "é😀\n" * 5000, RAW_MODEL)
    whole = encode_list(entries)
    account = AnswerBuffers(AnswerLimits())
    hold = account.take(ALICE, charge(entries))
    assert hold.left == RESERVE + sum(held_size(e) for e in entries)
    body = list_body(entries, hold)
    seen: list[tuple[int, int]] = []
    chunks = []
    async for chunk in body:
        chunks.append(chunk)
        seen.append((len(entries), account.held))
    assert b"".join(chunks).decode() == whole  # the same JSON, byte for byte
    assert max(len(c) for c in chunks) <= MAX_PIECE_BYTES and chunks[-1] == b""
    # The list empties and the charge falls as the answer goes (it held the whole answer as
    # one string, and its entries, until the client took it all).
    left, held = zip(*seen, strict=True)
    assert list(left) == sorted(left, reverse=True) and left[-1] == 0 and left[0] >= 27
    assert list(held) == sorted(held, reverse=True) and held[-2] == RESERVE
    assert account.held == 0


async def test_the_reset_goes_out_as_format_item_whole_with_line_breaks_in_models() -> None:
    reset = QueueReset("7-0", _entries(4, "a\r\nb" * 3000, RAW_MODEL))
    whole = format_item(reset)
    update = QueueEvent("7-1", "edited", "e0", _entries(1, CTRL, RAW_MODEL)[0])
    account = AnswerBuffers(AnswerLimits())
    purse = account.purse(ALICE)
    hold = purse.take(charge(reset))

    async def one_update() -> AsyncIterator[Item]:
        yield update

    async def connected() -> bool:
        return False

    chunks = [c async for c in event_stream(reset, one_update(), connected, purse, hold)]
    text = "".join(c if isinstance(c, str) else c.decode() for c in chunks)
    assert text == f"retry: 2000\n\n{whole}{format_item(update)}"
    assert account.held == 0


async def test_a_message_over_the_budget_ends_the_stream_cleanly() -> None:
    account = AnswerBuffers(AnswerLimits(per_process=10 * RESERVE, per_token=2 * RESERVE))
    stalled = account.take(ALICE, RESERVE + 1)  # another of alice's answers, not taken
    update = QueueEvent("7-1", "edited", "e0", _entries(1)[0])
    after = QueueEvent("7-2", "edited", "e0", _entries(1)[0])

    async def updates() -> AsyncIterator[Item]:
        yield update
        yield after

    async def connected() -> bool:
        return False

    chunks = [c async for c in event_stream(None, updates(), connected, account.purse(ALICE))]
    assert chunks == ["retry: 2000\n\n"]  # ended before the update: it resumes by its last ID
    bobs = [c async for c in event_stream(None, updates(), connected, account.purse(BOB))]
    assert len(bobs) > 2  # bob's stream is not alice's budget
    stalled.close()
    assert account.held == 0
