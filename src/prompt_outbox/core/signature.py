"""The webhook signature, scheme ``v2``: what the webhook deliverer signs, and the receiver's
check of it. One canonical string serves both sides (``signed_bytes``)::

    v2\\n<timestamp>\\n<workspace>\\n<session>\\n<entry id>\\n<body>

It is unambiguous: the timestamp is digits and the three IDs match ``keys.ID_PATTERN`` (no
newline), so each field ends at its newline and the body is everything after the fifth. The
header carries ``v2=<hex HMAC-SHA256 of that string>``; a signature over the body alone (the
old ``sha256=`` scheme) let a captured delivery be replayed to another workspace or session.

A receiver ends a turn it handed back (``POST`` ``TURN_END_ROUTE``) signed with the same
secret over a string of its own domain (``turn_end_bytes``)::

    v2-turn-end\n<timestamp>\n<workspace>\n<session>\n<turn id>

Its first line is never a delivery's (``v2``), so a captured delivery's signature never
verifies as an end, and the IDs bind it to one turn of one session of one workspace.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol
from urllib.parse import quote

from .callbacks import Turn
from .errors import InvalidId
from .keys import check_id

SCHEME = "v2"
SIGNATURE_HEADER = "X-Prompt-Outbox-Signature"
TIMESTAMP_HEADER = "X-Prompt-Outbox-Timestamp"
WORKSPACE_HEADER = "X-Prompt-Outbox-Workspace"
SESSION_HEADER = "X-Prompt-Outbox-Session"
ENTRY_ID_HEADER = "Idempotency-Key"
DEFAULT_TOLERANCE = 300.0
"""Seconds a delivery's timestamp may be off the receiver's clock, either way (Stripe's
default): it bounds how long a captured delivery can be replayed; within it, the receiver
dedupes by the entry ID, which the signature covers."""

TURN_END_DOMAIN = "v2-turn-end"
"""The first line of a turn end's signed string: a delivery's is ``v2``."""
TURN_END_ROUTE = "/v1/workspaces/{ws}/sessions/{ses}/turns/{turn}/end"
"""Where a turn is ended (the API's route); ``turn_end_path`` fills it in."""

_TIMESTAMP = re.compile(r"[0-9]{1,15}")  # Unix seconds; bounded so int() never sees 5000 digits
_HEX = re.compile(r"[0-9a-fA-F]{64}")  # a SHA-256 MAC

Failure = Literal["missing_header", "malformed_header", "stale_timestamp", "bad_signature"]


class WebhookSignatureError(ValueError):
    """A delivery that does not verify; refuse it (HTTP 401). ``code`` says what failed, stably:
    ``missing_header``, ``malformed_header`` (a timestamp that is not digits, an ID off the
    pattern, a header sent twice), ``stale_timestamp`` (outside the tolerance window) or
    ``bad_signature`` (no ``v2=`` signature, or none that matches)."""

    def __init__(self, code: Failure, detail: str) -> None:
        super().__init__(detail)
        self.code: Failure = code


@dataclass(frozen=True, slots=True)
class SignedDelivery:
    """What a verified delivery's signature vouches for: act on these values."""

    workspace: str
    session: str
    entry_id: str
    timestamp: int


class HeaderSource(Protocol):
    """Anything with ``items()`` of (name, value): a dict, ``http.server``'s headers,
    Starlette's or httpx's ``Headers``. Names are matched case-insensitively."""

    def items(self) -> Iterable[tuple[str, str]]: ...


def signed_bytes(timestamp: str, workspace: str, session: str, entry_id: str, body: bytes) -> bytes:
    """The canonical string the v2 signature is the HMAC of (module docstring). Raises
    ValueError for a timestamp that is not digits or an ID off the pattern: either would make
    the string ambiguous."""
    if not _TIMESTAMP.fullmatch(timestamp):
        raise ValueError(f"timestamp must be 1-15 digits (Unix seconds), got {timestamp!r}")
    ids = (check_id("workspace", workspace), check_id("session", session))
    fields = (SCHEME, timestamp, *ids, check_id("entry ID", entry_id), "")
    return "\n".join(fields).encode() + body


def sign(
    secret: bytes, *, timestamp: int, workspace: str, session: str, entry_id: str, body: bytes
) -> str:
    """The signature header's value, ``v2=<hex>``, for a delivery sent at ``timestamp``."""
    message = signed_bytes(str(timestamp), workspace, session, entry_id, body)
    return f"{SCHEME}={_mac(secret, message).hex()}"


def verify_signature(
    secret: bytes | str,
    headers: HeaderSource,
    body: bytes,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> SignedDelivery:
    """Check a webhook delivery as received: ``body`` is the raw request body (not re-encoded
    JSON). Returns what the signature covers; raises WebhookSignatureError saying what failed.

    The timestamp must be within ``tolerance`` seconds of ``now`` (default: the clock), either
    way. The MACs are compared in constant time (``hmac.compare_digest``)."""
    key = _key(secret, tolerance, now)
    values = _read(headers, _SIGNED_HEADERS)
    stamp = _fresh(values[TIMESTAMP_HEADER], tolerance, now)
    ws, ses, entry_id = values[WORKSPACE_HEADER], values[SESSION_HEADER], values[ENTRY_ID_HEADER]
    try:
        want = _mac(key, signed_bytes(stamp, ws, ses, entry_id, body))
    except InvalidId as exc:
        raise WebhookSignatureError("malformed_header", str(exc)) from exc
    _match(values[SIGNATURE_HEADER], want)
    return SignedDelivery(ws, ses, entry_id, int(stamp))


def turn_end_bytes(timestamp: str, workspace: str, session: str, turn_id: str) -> bytes:
    """The canonical string a turn end's signature is the HMAC of (module docstring): the
    turn ID as UTF-8, last, so that any printable character may be in it. Raises ValueError
    for a timestamp that is not digits, an ID off the pattern or a turn ID off ``Turn``'s rule
    (1-200 printable characters)."""
    if not _TIMESTAMP.fullmatch(timestamp):
        raise ValueError(f"timestamp must be 1-15 digits (Unix seconds), got {timestamp!r}")
    ids = (check_id("workspace", workspace), check_id("session", session))
    fields = (TURN_END_DOMAIN, timestamp, *ids, Turn(turn_id).id)
    return "\n".join(fields).encode()


def sign_turn_end(
    secret: bytes, *, timestamp: int, workspace: str, session: str, turn_id: str
) -> str:
    """The signature header's value, ``v2=<hex>``, for ending a turn at ``timestamp``."""
    message = turn_end_bytes(str(timestamp), workspace, session, turn_id)
    return f"{SCHEME}={_mac(secret, message).hex()}"


def turn_end_headers(
    secret: bytes | str, workspace: str, session: str, turn_id: str, *, now: float | None = None
) -> dict[str, str]:
    """What a receiver sends to end a turn: the timestamp (``now``, default the clock) and
    the signature headers. POST them, with no body, to ``turn_end_path(...)`` on the API."""
    key = secret.encode() if isinstance(secret, str) else secret
    if not key:
        raise ValueError("an empty secret signs nothing")
    stamp = int(time.time() if now is None else now)
    signature = sign_turn_end(
        key, timestamp=stamp, workspace=workspace, session=session, turn_id=turn_id
    )
    return {TIMESTAMP_HEADER: str(stamp), SIGNATURE_HEADER: signature}


def turn_end_path(workspace: str, session: str, turn_id: str) -> str:
    """``TURN_END_ROUTE`` for this turn: the turn ID percent-encoded whole (a ``/``, ``?``,
    ``%`` or space in it included), the IDs checked."""
    turn = quote(Turn(turn_id).id, safe="")
    ws, ses = check_id("workspace", workspace), check_id("session", session)
    return TURN_END_ROUTE.format(ws=ws, ses=ses, turn=turn)


def verify_turn_end(
    secret: bytes | str,
    headers: HeaderSource,
    workspace: str,
    session: str,
    turn_id: str,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> int:
    """Check a signed turn end for this workspace, session and turn (the route's, from its
    path): the timestamp within ``tolerance`` of ``now``, the ``v2=`` signature over
    ``turn_end_bytes`` compared in constant time. Returns the signed timestamp; raises
    WebhookSignatureError as ``verify_signature`` does, ValueError for IDs off their rules
    (check them first: they are the caller's input, not the signature's)."""
    key = _key(secret, tolerance, now)
    values = _read(headers, (SIGNATURE_HEADER, TIMESTAMP_HEADER))
    stamp = _fresh(values[TIMESTAMP_HEADER], tolerance, now)
    _match(values[SIGNATURE_HEADER], _mac(key, turn_end_bytes(stamp, workspace, session, turn_id)))
    return int(stamp)


def _key(secret: bytes | str, tolerance: float, now: float | None) -> bytes:
    """The secret's bytes, after the checks of a caller's bugs (plain ValueErrors)."""
    if not tolerance >= 0:
        raise ValueError(f"tolerance must be a number of seconds >= 0, got {tolerance!r}")
    if now is not None and not math.isfinite(now):
        raise ValueError(f"now must be finite Unix seconds, got {now!r}")  # NaN passes any window
    key = secret.encode() if isinstance(secret, str) else secret
    if not key:
        raise ValueError("an empty secret verifies nothing")
    return key


def _fresh(stamp: str, tolerance: float, now: float | None) -> str:
    """The timestamp header's digits, if within ``tolerance`` of ``now``."""
    if not _TIMESTAMP.fullmatch(stamp):
        raise WebhookSignatureError("malformed_header", f"{TIMESTAMP_HEADER} is not Unix seconds")
    skew = (time.time() if now is None else now) - int(stamp)
    if abs(skew) > tolerance:
        raise WebhookSignatureError(
            "stale_timestamp", f"{TIMESTAMP_HEADER} is {skew:+.0f} s off, over {tolerance:g} s"
        )
    return stamp


def _match(signatures: str, want: bytes) -> None:
    """Raise unless one ``v2=`` item of the signature header is ``want``."""
    if "," in signatures:  # no scheme writes one: the header sent twice, joined by a framework
        raise WebhookSignatureError(
            "malformed_header", f"{SIGNATURE_HEADER} is sent more than once"
        )
    # Space-separated <scheme>=<hex> items, so that a later sender can add a scheme or sign with
    # two secrets while one is rotated: a scheme this check does not know is skipped.
    items = (item.partition("=") for item in signatures.split())
    offered = [value for scheme, _, value in items if scheme == SCHEME]
    if not offered:
        raise WebhookSignatureError(
            "bad_signature", f"{SIGNATURE_HEADER} holds no {SCHEME}= signature"
        )
    # Every candidate is compared, so the time taken says nothing about which one came close.
    matched = False
    for value in offered:
        matched |= bool(_HEX.fullmatch(value)) and hmac.compare_digest(bytes.fromhex(value), want)
    if not matched:
        raise WebhookSignatureError("bad_signature", f"{SIGNATURE_HEADER} does not match")


_SIGNED_HEADERS = (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WORKSPACE_HEADER,
    SESSION_HEADER,
    ENTRY_ID_HEADER,
)


def _read(headers: HeaderSource, names: tuple[str, ...]) -> dict[str, str]:
    """The signed headers ``names`` by their canonical names. One sent twice is refused: the
    receiver's framework might hand its code the other copy than the one checked here."""
    wanted = {name.lower(): name for name in names}
    found: dict[str, str] = {}
    for name, value in headers.items():
        canonical = wanted.get(name.lower())
        if canonical is None:
            continue
        if canonical in found:
            raise WebhookSignatureError("malformed_header", f"{canonical} is sent more than once")
        found[canonical] = str(value)
    missing = [name for name in names if name not in found]
    if missing:
        raise WebhookSignatureError("missing_header", f"missing {', '.join(missing)}")
    return found


def _mac(secret: bytes, message: bytes) -> bytes:
    return hmac.new(secret, message, hashlib.sha256).digest()
