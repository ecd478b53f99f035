"""The per-session event log behind SSE: written by the same scripts as the changes, capped,
and resumable after the last event a reader saw."""

from __future__ import annotations

import dataclasses

import pytest
import valkey.asyncio as valkey_async

from prompt_outbox import Duplicate, IdempotencyKeyReused, Outbox, OutboxFull, Status
from prompt_outbox.core.errors import InvalidEventId
from prompt_outbox.core.events import (
    EventLogState,
    QueueEvent,
    QueueReset,
    missed_events,
    parse_event_id,
)
from prompt_outbox.core.keys import session_keys
from tests.agents import ScriptedAgent
from tests.support.clock import ManualClock
from tests.support.events import ARABIC_INDIC, SES, WS, take
from tests.support.tunables import FAST

pytestmark = pytest.mark.cluster_too


def kinds(items: list[QueueEvent | QueueReset]) -> list[str]:
    return [i.kind if isinstance(i, QueueEvent) else "reset" for i in items]


async def test_every_transition_is_logged_in_order(
    manual_outbox: Outbox, clock: ManualClock, client: valkey_async.Valkey
) -> None:
    outbox = manual_outbox
    a = await outbox.accept(WS, SES, "u", "c1", "one")
    b = await outbox.accept(WS, SES, "u", "c2", "two")
    agent = ScriptedAgent([RuntimeError("no")] * FAST.max_attempts)
    for _ in range(FAST.max_attempts + 1):  # a fails definitively until error; then b goes
        assert await outbox.deliver_once(WS, SES, agent)
        clock.advance(1)
    [failed] = await outbox.list(WS, SES)
    assert failed.id == a.id and failed.status is Status.ERROR
    await outbox.retry(WS, SES, a.id)
    await outbox.dismiss(WS, SES, a.id)
    [now] = await take(outbox, 1)  # a fresh reader: the whole (now empty) queue
    assert isinstance(now, QueueReset) and now.entries == []
    rows = await client.xrange(session_keys(WS, SES).events)
    tail = [(f[b"kind"].decode(), f[b"id"].decode()) for _, f in rows]
    assert tail[:2] == [("accepted", a.id), ("accepted", b.id)]
    # a: staged and failed max_attempts times (the last one to error), retried, dismissed.
    assert tail[2 : 2 + 2 * FAST.max_attempts] == [("delivering", a.id), ("pending", a.id)] * (
        FAST.max_attempts - 1
    ) + [("delivering", a.id), ("error", a.id)]
    assert tail[2 + 2 * FAST.max_attempts :] == [
        ("delivering", b.id),
        ("sent", b.id),
        ("pending", a.id),
        ("dismissed", a.id),
    ]
    # A reader resuming before the second accept sees the rest as QueueEvents, entries decoded.
    events = await take(outbox, len(rows) - 1, last=rows[0][0].decode())
    assert all(isinstance(e, QueueEvent) for e in events)
    assert isinstance(events[0], QueueEvent) and events[0].entry is not None
    assert events[0].entry.text == "two"
    sent = next(e for e in events if isinstance(e, QueueEvent) and e.kind == "sent")
    assert sent.entry is None


async def test_resume_after_the_last_seen_event_replays_exactly_the_rest(outbox: Outbox) -> None:
    [reset] = await take(outbox, 1)
    assert isinstance(reset, QueueReset)
    await outbox.accept(WS, SES, "u", "c1", "one")
    [first] = await take(outbox, 1, last=reset.event_id)
    assert isinstance(first, QueueEvent) and first.kind == "accepted"
    # The reader goes away; things happen; it comes back with the last ID it saw.
    second = await outbox.accept(WS, SES, "u", "c2", "two")
    await outbox.dismiss(WS, SES, second.id)
    resumed = await take(outbox, 2, last=first.event_id)
    assert [(e.kind, e.entry_id) for e in resumed if isinstance(e, QueueEvent)] == [
        ("accepted", second.id),
        ("dismissed", second.id),
    ]


async def test_a_resume_point_trimmed_from_the_capped_log_gets_a_reset(
    client: valkey_async.Valkey,
) -> None:
    outbox = Outbox(client, dataclasses.replace(FAST, event_log_len=3))
    [reset] = await take(outbox, 1)
    first = await outbox.accept(WS, SES, "u", "c0", "zero")
    [accepted] = await take(outbox, 1, last=reset.event_id)
    assert isinstance(accepted, QueueEvent) and accepted.entry_id == first.id
    for i in range(1, 5):
        await outbox.accept(WS, SES, "u", f"c{i}", f"text {i}")
    assert await client.xlen(session_keys(WS, SES).events) == 3
    [again] = await take(outbox, 1, last=accepted.event_id)
    assert isinstance(again, QueueReset) and len(again.entries) == 5


async def test_refused_accepts_log_nothing(client: valkey_async.Valkey) -> None:
    outbox = Outbox(client, dataclasses.replace(FAST, cap=1))
    await outbox.accept(WS, SES, "u", "c1", "one")
    with pytest.raises(Duplicate):
        await outbox.accept(WS, SES, "u", "c1", "one")
    with pytest.raises(IdempotencyKeyReused):
        await outbox.accept(WS, SES, "u", "c1", "one again")
    with pytest.raises(OutboxFull):
        await outbox.accept(WS, SES, "u", "c2", "two")
    assert await client.xlen(session_keys(WS, SES).events) == 1


async def test_the_log_expires_and_cleanup_removes_it(client: valkey_async.Valkey) -> None:
    outbox = Outbox(client, dataclasses.replace(FAST, event_log_ttl=30.0))
    await outbox.accept(WS, SES, "u", "c1", "one")
    key = session_keys(WS, SES).events
    assert 0 < await client.pttl(key) <= 30_000
    await outbox.cleanup_workspace(WS)
    assert not await client.exists(key)


async def test_bad_event_ids_are_refused(outbox: Outbox) -> None:
    with pytest.raises(ValueError, match="event ID"):
        await take(outbox, 1, last="not-an-id")


def test_missed_events_is_conservative() -> None:
    now, ttl = 10_000, 1_000
    log = EventLogState(first="9500-0", last="9900-3", length=10, added=10, now_ms=now)
    assert not missed_events("9500-0", log, ttl) and not missed_events("9900-3", log, ttl)
    assert missed_events("9499-9", log, ttl)  # trimmed away
    assert missed_events("8999-0", EventLogState("8000-0", "9900-0", 5, 5, now), ttl)  # too old
    gone = EventLogState("", "", 0, 0, now)
    assert missed_events("9800-0", gone, ttl)  # the log was deleted under this reader
    assert not missed_events("0-9800", gone, ttl)  # it was missing then, and still is
    assert not missed_events("0-9800", log, ttl)  # begun since, nothing trimmed
    assert missed_events("0-9800", EventLogState("9500-0", "9900-3", 10, 11, now), ttl)
    assert missed_events("0-0", log, ttl)
    assert gone.position() == f"0-{now}" and log.position() == "9900-3"
    assert missed_events("9900-4", log, ttl)  # past the log's last event: made up, a reset
    # A log that began again past its bytes names where the one before ended: a reader that
    # stood there missed nothing, however long ago; one further back did.
    again = EventLogState("9950-0", "9990-0", 3, 40, now, first_after="9940-2")
    assert not missed_events("9940-2", again, ttl)
    assert not missed_events("8000-0", dataclasses.replace(again, first_after="8000-0"), ttl)
    assert missed_events("9940-1", again, ttl)


@pytest.mark.parametrize(
    "bad", ["18446744073709551616-0", "0-18446744073709551616", "9" * 20 + "-0"]
)
def test_event_ids_past_64_bits_are_refused(bad: str) -> None:
    with pytest.raises(InvalidEventId, match="2\\^64"):
        parse_event_id(bad)
    assert parse_event_id("18446744073709551615-18446744073709551615") == (2**64 - 1, 2**64 - 1)


FULLWIDTH = str.maketrans("0123456789", "".join(chr(0xFF10 + d) for d in range(10)))


@pytest.mark.parametrize(
    "digits",
    [
        "1700000000000-0".translate(ARABIC_INDIC),
        "1700-0".translate(FULLWIDTH),
        "1".translate(FULLWIDTH) + "-0",
    ],
)
def test_event_ids_are_ascii_digits_only(digits: str) -> None:
    # int() reads any script's digits and \d matched them: they reached XREAD (a 500).
    with pytest.raises(InvalidEventId):
        parse_event_id(digits)
