"""Checks on what callers hand to Accept: bad input is an InvalidInput (a ValueError) before
anything is written."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal, TypeVar

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

T = TypeVar("T")


def check_unicode(field: str, value: T) -> T:
    """``value`` if every string in it is Unicode a strict receiver takes: a str, or the
    strings and keys of parsed JSON (dicts and lists, at any depth). A lone surrogate
    (U+D800-U+DFFF alone: a JSON ``\\udfff`` escape, a command-line byte that is not UTF-8)
    is no character; it cannot be written as UTF-8, so an agent refuses every delivery that
    carries it. InvalidInput naming ``field`` then. The one rule for every string a client,
    a token file or an operator hands in."""
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidInput(
                    f"{field} is not valid Unicode: it holds a lone surrogate (U+D800-U+DFFF), "
                    "which no UTF-8 text can carry"
                ) from None
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return value


def check_text(text: object) -> str:
    """Return ``text`` if it is a non-empty prompt of at most MAX_TEXT_BYTES of valid UTF-8.

    Raises TextTooLarge over the limit, else InvalidInput.
    """
    if not isinstance(text, str):
        raise InvalidInput(f"text must be a string, got {type(text).__name__}")
    if not text:
        raise InvalidInput("text must not be empty")
    try:
        size, encodes = len(text.encode("utf-8")), True
    except UnicodeEncodeError:
        # Size first, a lone surrogate counted as the 3 bytes it would take: a text over the
        # limit is "too large" (HTTP 413) whatever else is wrong with it.
        size, encodes = len(text.encode("utf-8", "surrogatepass")), False
    if size > MAX_TEXT_BYTES:
        raise TextTooLarge(f"text is {size} bytes; the limit is {MAX_TEXT_BYTES}")
    if not encodes:  # (the hot path encodes the text once: checked again only when bad)
        check_unicode("text", text)
    return text


def check_user_id(user_id: object) -> str:
    """Return ``user_id`` if it is printable Unicode and at most MAX_USER_ID characters."""
    check_unicode("userID", user_id)
    if not isinstance(user_id, str) or len(user_id) > MAX_USER_ID or not user_id.isprintable():
        raise InvalidInput(f"userID must be a printable string of at most {MAX_USER_ID} characters")
    return user_id


def check_reason(reason: object) -> str:
    """A park reason: at most MAX_REASON characters of Unicode, at least one of them visible."""
    check_unicode("park reason", reason)
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
    check_unicode("model", model)
    if len(model.encode("utf-8")) > MAX_MODEL_BYTES:
        raise InvalidInput(f"model JSON is over {MAX_MODEL_BYTES} bytes")
    try:
        parsed = json.loads(model)
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"model is not valid JSON: {exc}") from exc
    if parsed is None:
        return None
    if _depth(parsed) > MAX_MODEL_DEPTH:
        raise InvalidInput(f"model JSON nests deeper than {MAX_MODEL_DEPTH}")
    # The raw text is UTF-8, but a "\\udfff" escape in it (a string or a key) is not.
    check_unicode("model", parsed)
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
