"""Entry, its statuses, and the JSON codec that keeps the caller's ``model`` JSON byte for byte."""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from .timeutil import format_time, parse_time
from .tracing import checked_traceparent, tracing


class Status(StrEnum):
    """Where an entry stands. Only PENDING and VERIFYING (and DELIVERING) block the session."""

    PENDING = "pending"
    DELIVERING = "delivering"
    VERIFYING = "verifying"
    ERROR = "error"
    PARKED = "parked"


@dataclass(frozen=True, slots=True)
class Entry:
    """One accepted prompt. Attributes are the contract's fields in snake_case.

    ``model`` is the caller's raw JSON text, stored and returned unchanged. ``blocked_by_in_flight``
    and ``in_flight_for`` (seconds) are set by ``Outbox.list`` only and never stored; so is
    ``in_turn_for``, on entries waiting for the agent's turn on a delivered one to end, and
    ``turn_why``, why that turn is still held when the agent could not be asked.

    ``trace`` is the prompt's W3C trace context (``traceparent``, core/tracing.py), kept in the
    stored form only, so that any worker continues the accept's trace; '' without tracing.
    """

    id: str
    client_message_id: str
    user_id: str
    text: str
    accepted_at: datetime
    status: Status = Status.PENDING
    model: str | None = None
    attempts: int = 0
    last_attempt_at: datetime | None = None
    verify_attempts: int = 0
    transient_fails: int = 0
    next_attempt_at: datetime | None = None
    last_error: str = ""
    blocked_by_in_flight: bool = field(default=False, compare=False)
    in_flight_for: float = field(default=0.0, compare=False)
    in_turn_for: float = field(default=0.0, compare=False)
    turn_why: str = field(default="", compare=False)
    trace: str = field(default="", compare=False)

    def to_json(self) -> str:
        """The stored form: the contract's field names, ``model`` spliced in as raw JSON, and the
        trace context (``traceparent``) when there is one."""
        return encode_entry(self, with_list_fields=False, stored=True)

    def traced(self) -> Entry:
        """This entry with the trace context an accept gives it (itself when tracing is off)."""
        parent = checked_traceparent(tracing().traceparent())
        return replace(self, trace=parent) if parent else self

    def to_list_json(self) -> str:
        """The List form: also carries blockedByInFlight / inFlightFor (integer nanoseconds)."""
        return encode_entry(self, with_list_fields=True)

    @classmethod
    def from_json(cls, raw: str) -> Entry:
        """Decode a stored entry; raises ValueError on anything that is not one."""
        return decode_entry(raw)


class EntryDecodeError(ValueError):
    """A stored or seeded string is not a valid entry."""


def encode_entry(e: Entry, *, with_list_fields: bool, stored: bool = False) -> str:
    """An entry's JSON: the public form (a webhook's body, List with ``with_list_fields``), or
    the ``stored`` one, which alone carries the trace context."""
    model = "" if e.model is None else f',"model":{e.model}'
    text = json.dumps(e.text, ensure_ascii=False)
    trace = f',"traceparent":{json.dumps(e.trace)}' if stored and e.trace else ""
    return f'{{{_head(e)},"text":{text}{model},{_tail(e, with_list_fields)}{trace}}}'


def _head(e: Entry) -> str:
    """The fields before the text (IDs: short)."""
    dump = json.dumps
    return (
        f'"id":{dump(e.id)},"clientMessageID":{dump(e.client_message_id)},'
        f'"userID":{dump(e.user_id)}'
    )


def _tail(e: Entry, with_list_fields: bool) -> str:
    """The fields after the model (times, counts, a bounded lastError, the status)."""
    dump = json.dumps
    parts = [f'"acceptedAt":{dump(format_time(e.accepted_at))}', f'"attempts":{e.attempts}']
    if e.last_attempt_at is not None:
        parts.append(f'"lastAttemptAt":{dump(format_time(e.last_attempt_at))}')
    if e.verify_attempts:
        parts.append(f'"verifyAttempts":{e.verify_attempts}')
    if e.transient_fails:
        parts.append(f'"transientFails":{e.transient_fails}')
    if e.next_attempt_at is not None:
        parts.append(f'"nextAttemptAt":{dump(format_time(e.next_attempt_at))}')
    if e.last_error:
        parts.append(f'"lastError":{dump(e.last_error, ensure_ascii=False)}')
    parts.append(f'"status":{dump(str(e.status))}')
    if with_list_fields and e.blocked_by_in_flight:
        parts.append('"blockedByInFlight":true')
    if with_list_fields and e.in_flight_for:
        parts.append(f'"inFlightFor":{round(e.in_flight_for * 1e9)}')
    if with_list_fields and e.in_turn_for:
        parts.append(f'"inTurnFor":{round(e.in_turn_for * 1e9)}')
    if with_list_fields and e.turn_why:
        parts.append(f'"turnWhy":{dump(e.turn_why, ensure_ascii=False)}')
    return ",".join(parts)


_escape = json.encoder.encode_basestring  # what json.dumps(s, ensure_ascii=False) does to a str


def entry_pieces(e: Entry, *, with_list_fields: bool, size: int) -> Iterator[str]:
    """``encode_entry``'s JSON in pieces that join to it: the text and the model (the fields
    a caller makes large) in slices of at most ``size`` characters of their own (a text slice
    escaped alone: at most 6 x ``size``), so that an answer never holds an entry's JSON whole.
    JSON escapes a string character by character, so escaped slices join to the escaped
    text."""
    yield f'{{{_head(e)},"text":"'
    for part in _slices(e.text, size):
        yield _escape(part)[1:-1]
    yield '"'
    if e.model is not None:
        yield ',"model":'
        yield from _slices(e.model, size)
    yield f",{_tail(e, with_list_fields)}}}"


def _slices(text: str, size: int) -> Iterator[str]:
    start = 0
    while start < len(text):
        end = start + size
        if text[end - 1 : end] == "\r":  # a CRLF (in a model's whitespace) stays in one piece:
            end += 1  # a reader splitting each piece into lines (SSE) sees one line break
        yield text[start:end]
        start = end


def list_pieces(entries: Iterable[Entry], size: int) -> Iterator[str]:
    """The List JSON, ``{"entries":[...]}``, in pieces (``entry_pieces``), an entry at a time."""
    yield '{"entries":['
    for n, entry in enumerate(entries):
        if n:
            yield ","
        yield from entry_pieces(entry, with_list_fields=True, size=size)
    yield "]}"


def encode_list(entries: Iterable[Entry]) -> str:
    """The List JSON, ``{"entries":[...]}``: the API's list answer, SSE's ``queue.reset`` data
    and ``list --json``. Spliced from the entries' List form so each ``model`` stays byte for
    byte (what ``list_pieces`` gives, joined)."""
    return "".join(list_pieces(entries, sys.maxsize))


_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _not_json(name: str) -> Any:
    raise EntryDecodeError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


_STRICT_DECODER = json.JSONDecoder(parse_constant=_not_json)


def is_finite_json(value: Any) -> bool:
    """Whether a decoded JSON value holds only numbers every JSON parser reads as finite: no
    NaN or Infinity (which Python's json takes), and none past a double's range (``1e999``, or
    an integer of 309 digits: JSON.parse makes them Infinity, which JSON.stringify writes as
    null)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float):
            if not math.isfinite(v):
                return False
        elif isinstance(v, int) and v.bit_length() > 1000:  # far below: always finite
            try:
                float(v)
            except OverflowError:
                return False
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return True


def raw_object_fields(raw: str, *, strict: bool = False) -> dict[str, tuple[Any, str]]:
    """Split a JSON object into {key: (decoded value, raw value text)} at the top level only.

    The raw text is what lets ``model`` survive unchanged: json.loads would re-encode it.
    ``strict``: NaN, Infinity and -Infinity (which Python's json takes) are refused anywhere,
    as the JSON they are not (what a client sends; stored entries are read as they are).
    """
    decoder = _STRICT_DECODER if strict else _DECODER
    out: dict[str, tuple[Any, str]] = {}
    i = _WS.match(raw, 0).end()  # type: ignore[union-attr]
    if raw[i : i + 1] != "{":
        raise EntryDecodeError("an entry must be a JSON object")
    i = _WS.match(raw, i + 1).end()  # type: ignore[union-attr]
    if raw[i : i + 1] == "}":
        i += 1
    else:
        while True:
            if raw[i : i + 1] != '"':
                raise EntryDecodeError(f"expected a key at offset {i}")
            key, i = json.decoder.scanstring(raw, i + 1)  # type: ignore[attr-defined]
            i = _WS.match(raw, i).end()  # type: ignore[union-attr]
            if raw[i : i + 1] != ":":
                raise EntryDecodeError(f"expected ':' at offset {i}")
            i = _WS.match(raw, i + 1).end()  # type: ignore[union-attr]
            value, end = decoder.raw_decode(raw, i)
            out[key] = (value, raw[i:end])
            i = _WS.match(raw, end).end()  # type: ignore[union-attr]
            sep = raw[i : i + 1]
            i += 1
            if sep == "}":
                break
            if sep != ",":
                raise EntryDecodeError(f"expected ',' or '}}' at offset {i - 1}")
            i = _WS.match(raw, i).end()  # type: ignore[union-attr]
    if raw[_WS.match(raw, i).end() :]:  # type: ignore[union-attr]
        raise EntryDecodeError("trailing data after the entry object")
    return out


def decode_entry(raw: str) -> Entry:
    # json.loads first (in C; this runs once per delivered prompt); the raw split only for
    # a model, whose bytes json.loads would not keep.
    try:
        fields = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise EntryDecodeError(f"entry is not valid JSON: {exc}") from exc
    if not isinstance(fields, dict):
        raise EntryDecodeError("an entry must be a JSON object")

    def get(name: str, kind: type, default: Any) -> Any:
        value = fields.get(name)
        if value is None:
            return default
        if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
            raise EntryDecodeError(f"entry field {name!r} must be {kind.__name__}")
        return value

    def get_time(name: str) -> datetime | None:
        text = get(name, str, "")
        if not text:
            return None
        try:
            return parse_time(text)
        except ValueError as exc:
            raise EntryDecodeError(f"entry field {name!r} is not an RFC 3339 time") from exc

    entry_id = get("id", str, "")
    if not entry_id:
        raise EntryDecodeError("entry has no id")
    accepted_at = get_time("acceptedAt")
    if accepted_at is None:
        raise EntryDecodeError("entry has no acceptedAt")
    try:
        status = Status(get("status", str, Status.PENDING))
    except ValueError as exc:
        raise EntryDecodeError(f"entry has an unknown status: {exc}") from exc
    model = None if fields.get("model") is None else raw_object_fields(raw)["model"][1]
    if model is not None and not is_finite_json(fields["model"]):
        # Stored before accept refused it (``validate.check_model``): kept, as a JSON string
        # of its raw text, so a List, an event or a webhook body stays JSON every parser reads.
        model = json.dumps(model)
    return Entry(
        id=entry_id,
        client_message_id=get("clientMessageID", str, ""),
        user_id=get("userID", str, ""),
        text=get("text", str, ""),
        model=model,
        accepted_at=accepted_at,
        attempts=get("attempts", int, 0),
        last_attempt_at=get_time("lastAttemptAt"),
        verify_attempts=get("verifyAttempts", int, 0),
        transient_fails=get("transientFails", int, 0),
        next_attempt_at=get_time("nextAttemptAt"),
        last_error=get("lastError", str, ""),
        status=status,
        trace=checked_traceparent(fields.get("traceparent")),  # a bad one is dropped
    )
