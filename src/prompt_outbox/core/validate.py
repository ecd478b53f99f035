"""Checks on what callers hand to Accept: bad input is an InvalidInput (a ValueError) before
anything is written."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

from .entry import is_finite_json
from .errors import InvalidInput, TextTooLarge

MAX_TEXT_BYTES = 100 * 1024
MAX_USER_ID = 256
MAX_MODEL_BYTES = 16 * 1024
MAX_MODEL_DEPTH = 32  # far below the Lua cjson decoder's nesting limit
MAX_REASON = 500

VISIBLE_CHARACTER = (
    "[^\\x00-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff]"
)
"""A character that is neither a control character nor whitespace, spelled out: every regex
engine (Python, the JSON Schema's ECMA-262, pydantic's Rust) reads ``\\s`` differently, and the
HTTP API declares this same pattern for a park reason."""
_VISIBLE = re.compile(VISIBLE_CHARACTER)


def check_text(text: object) -> str:
    """Return ``text`` if it is a non-empty prompt of at most MAX_TEXT_BYTES of valid UTF-8.

    Raises TextTooLarge over the limit, else InvalidInput.
    """
    if not isinstance(text, str):
        raise InvalidInput(f"text must be a string, got {type(text).__name__}")
    if not text:
        raise InvalidInput("text must not be empty")
    try:
        size, lone_surrogate = len(text.encode("utf-8")), False
    except UnicodeEncodeError:
        # Size first, a lone surrogate counted as the 3 bytes it would take: a text over the
        # limit is "too large" (HTTP 413) whatever else is wrong with it.
        size, lone_surrogate = len(text.encode("utf-8", "surrogatepass")), True
    if size > MAX_TEXT_BYTES:
        raise TextTooLarge(f"text is {size} bytes; the limit is {MAX_TEXT_BYTES}")
    if lone_surrogate:
        raise InvalidInput("text is not valid Unicode (lone surrogate)")
    return text


def check_user_id(user_id: object) -> str:
    """Return ``user_id`` if it is printable and at most MAX_USER_ID characters."""
    if not isinstance(user_id, str) or len(user_id) > MAX_USER_ID or not user_id.isprintable():
        raise InvalidInput(f"userID must be a printable string of at most {MAX_USER_ID} characters")
    return user_id


def check_reason(reason: object) -> str:
    """A park reason: at most MAX_REASON characters, at least one of them visible."""
    if not isinstance(reason, str) or len(reason) > MAX_REASON or not _VISIBLE.search(reason):
        raise InvalidInput(
            f"a park reason needs a visible character and at most {MAX_REASON} characters"
        )
    return reason


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def check_model(model: object) -> str | None:
    """The model selector is raw JSON text, kept byte for byte; None means "the default".

    Whitespace around the value is not part of it and is dropped; JSON ``null`` means None.
    Only finite JSON is taken: NaN, Infinity, -Infinity, and numbers past a double's range
    (``1e999``) are refused (``entry.is_finite_json``), since a browser's JSON.parse could not
    read a List holding them, or would read them as Infinity.
    """
    if model is None:
        return None
    if not isinstance(model, str):
        raise InvalidInput(f"model must be raw JSON text (str) or None, got {type(model).__name__}")
    model = model.strip(" \t\r\n")
    try:
        size = len(model.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidInput("model is not valid Unicode (lone surrogate)") from exc
    if size > MAX_MODEL_BYTES:
        raise InvalidInput(f"model JSON is over {MAX_MODEL_BYTES} bytes")
    try:
        parsed = json.loads(model)
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"model is not valid JSON: {exc}") from exc
    if parsed is None:
        return None
    if _depth(parsed) > MAX_MODEL_DEPTH:
        raise InvalidInput(f"model JSON nests deeper than {MAX_MODEL_DEPTH}")
    if not is_finite_json(parsed):
        raise InvalidInput(
            "model must be finite JSON: NaN, Infinity and numbers past a double's range "
            "(like 1e999) are not numbers every JSON parser reads"
        )
    return model


def payload_fingerprint(text: str, model: str | None) -> str:
    """What tells two accepts' payloads apart under one clientMessageID: 128 bits of SHA-256
    over the checked text and model (the model's raw JSON, byte for byte; none is not ""),
    the text's length first so that no split of the bytes is ambiguous."""
    body = text.encode("utf-8")
    digest = hashlib.sha256(b"%d:" % len(body) + body)
    digest.update(b"-" if model is None else b"+" + model.encode("utf-8"))
    return digest.hexdigest()[:32]


WhileBusy = Literal["enqueue", "reject", "interrupt"]
"""What an accept does when its session is busy (``whileBusy``: docs/design.md, Busy sessions)."""
WHILE_BUSY: tuple[WhileBusy, ...] = ("enqueue", "reject", "interrupt")


def check_while_busy(value: object) -> WhileBusy:
    """Return ``value`` if it is a whileBusy policy, else raise InvalidInput."""
    if value not in WHILE_BUSY:
        raise InvalidInput(f"whileBusy must be one of {', '.join(WHILE_BUSY)}, got {value!r}")
    return value
