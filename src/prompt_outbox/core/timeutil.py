"""UTC time helpers: the RFC 3339 form entries store, and the milliseconds scripts compare."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

Clock = Callable[[], datetime]
"""Returns the current time as an aware UTC datetime. Tests pass a controllable one."""

# Go writes the zero time.Time for an unset omitempty time; treat it as "unset".
_GO_ZERO_YEAR = 1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_FRACTION = re.compile(r"\.([0-9]+)")
_OWN_LENGTH = len("2026-12-02T18:13:35.123456Z")


def utcnow() -> datetime:
    """The real clock."""
    return datetime.now(UTC)


def format_time(t: datetime) -> str:
    """RFC 3339 UTC with a fixed six-digit fraction, e.g. ``2026-12-02T18:13:35.123456Z``."""
    if t.tzinfo is not UTC:
        t = t.astimezone(UTC)
    # Not strftime: this runs twice per delivered prompt, and %-formatting is twice as fast.
    return "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ" % (  # noqa: UP031
        t.year,
        t.month,
        t.day,
        t.hour,
        t.minute,
        t.second,
        t.microsecond,
    )


def parse_time(s: str) -> datetime | None:
    """Parse any RFC 3339 time (Go writes up to nine fraction digits); Go's zero time is None."""
    if len(s) == _OWN_LENGTH and s[-1] == "Z" and s[19] == ".":
        return _utc(datetime.fromisoformat(s))  # our own form (format_time): no fix-up needed
    # datetime.fromisoformat takes at most six fraction digits: truncate, never round up.
    s = _FRACTION.sub(lambda m: "." + m.group(1)[:6].ljust(6, "0"), s, count=1)
    t = datetime.fromisoformat(s.replace("z", "Z"))
    if t.tzinfo is None:
        raise ValueError(f"time without a zone: {s!r}")
    return _utc(t)


def _utc(t: datetime) -> datetime | None:
    if t.year == _GO_ZERO_YEAR:
        return None
    return t.astimezone(UTC)


def to_ms(t: datetime) -> int:
    """Milliseconds since the epoch (floored, exact): the unit the Lua scripts compare.

    Integer arithmetic, not ``timestamp() * 1000``: float rounding made Python and the
    scripts disagree by a millisecond on whether an entry was due.
    """
    return (t - _EPOCH) // _MS
