"""The entry codec: the contract's field names, and the caller's model JSON kept byte for byte."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import valkey.asyncio as valkey_async
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prompt_outbox import Entry, Status
from prompt_outbox.core.entry import EntryDecodeError
from prompt_outbox.core.timeutil import format_time, parse_time, to_ms
from prompt_outbox.storage.scripts import LogBounds, prelude
from tests.support.entries import MODELS

T0 = datetime(2026, 12, 2, 12, 0, 0, 123456, tzinfo=UTC)


@pytest.mark.parametrize("model", MODELS)
def test_model_round_trips_byte_for_byte(model: str) -> None:
    e = Entry(id="e1", client_message_id="c", user_id="u", text="hi", accepted_at=T0, model=model)
    raw = e.to_json()
    assert json.loads(raw)["text"] == "hi"  # still one valid JSON document
    assert Entry.from_json(raw).model == model


def test_seed_field_names_and_omitempty() -> None:
    e = Entry(id="e1", client_message_id="c", user_id="u", text="t", accepted_at=T0)
    assert json.loads(e.to_json()) == {
        "id": "e1",
        "clientMessageID": "c",
        "userID": "u",
        "text": "t",
        "acceptedAt": "2026-12-02T12:00:00.123456Z",
        "attempts": 0,
        "status": "pending",
    }
    full = Entry(
        id="e1", client_message_id="c", user_id="u", text="t", accepted_at=T0, model="[]",
        attempts=2, last_attempt_at=T0, verify_attempts=1, transient_fails=3,
        next_attempt_at=T0 + timedelta(seconds=5), last_error="boom", status=Status.VERIFYING,
        blocked_by_in_flight=True, in_flight_for=1.5,
    )  # fmt: skip
    stored = json.loads(full.to_json())
    assert set(stored) == {
        "id", "clientMessageID", "userID", "text", "model", "acceptedAt", "attempts",
        "lastAttemptAt", "verifyAttempts", "transientFails", "nextAttemptAt", "lastError", "status",
    }  # fmt: skip
    listed = json.loads(full.to_list_json())
    assert listed["blockedByInFlight"] is True
    assert listed["inFlightFor"] == 1_500_000_000  # Go's time.Duration: integer nanoseconds
    assert Entry.from_json(full.to_json()) == full


def test_decodes_go_written_entries() -> None:
    raw = (
        '{"id":"x","clientMessageID":"c","userID":"u","text":"t","model":[],'
        '"acceptedAt":"2026-08-15T10:00:00.123456789Z","attempts":1,'
        '"lastAttemptAt":"0001-01-01T00:00:00Z","nextAttemptAt":"2026-08-15T12:00:00+02:00",'
        '"status":"error","lastError":"x"}'
    )
    e = Entry.from_json(raw)
    assert e.model == "[]"
    assert e.accepted_at == datetime(2026, 8, 15, 10, 0, 0, 123456, tzinfo=UTC)
    assert e.last_attempt_at is None  # Go's zero time means unset
    assert e.next_attempt_at == datetime(2026, 8, 15, 10, 0, 0, tzinfo=UTC)
    assert e.status is Status.ERROR


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "[]",
        '{"id":"x"}',  # no acceptedAt
        '{"acceptedAt":"2026-01-01T00:00:00Z"}',  # no id
        '{"id":"x","acceptedAt":"2026-01-01T00:00:00Z","status":"lost"}',
        '{"id":"x","acceptedAt":"2026-01-01T00:00:00Z","attempts":"1"}',
        '{"id":"x","acceptedAt":"yesterday"}',
        '{"id":"x","acceptedAt":"2026-01-01T00:00:00Z"} trailing',
        '{"id":"x",}',
    ],
)
def test_rejects_what_is_not_an_entry(raw: str) -> None:
    with pytest.raises(EntryDecodeError):
        Entry.from_json(raw)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.datetimes(
        min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
    ),
    st.sampled_from(["Z", "+00:00", "+05:30", "-08:00"]),
    st.integers(min_value=0, max_value=9),
)
async def test_lua_time_parsing_matches_python(
    client: valkey_async.Valkey, t: datetime, zone: str, digits: int
) -> None:
    # The scripts compare due times in ms they parse themselves: they must agree with Python.
    from datetime import timezone

    hours, minutes = (0, 0) if zone == "Z" else (int(zone[1:3]), int(zone[4:6]))
    offset = timedelta(hours=hours, minutes=minutes) * (-1 if zone.startswith("-") else 1)
    local = t.astimezone(timezone(offset))
    frac = f"{local.microsecond:06d}{'789'}"[:digits]
    text = local.strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac}" if digits else "") + zone
    script = prelude(LogBounds()) + "\nreturn parse_ms(ARGV[1])"
    lua_ms = await client.eval(script, 0, text)
    parsed = parse_time(text)
    assert parsed is not None
    assert lua_ms == to_ms(parsed), text
    assert parse_time(format_time(parsed)) == parsed
