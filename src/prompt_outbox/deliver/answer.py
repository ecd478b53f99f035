"""An agent's answer, read with bounds: at most ``limit`` bytes of its body, within a deadline.

``client.post`` / ``.get`` read the whole body before anyone looks at it, and httpx's read
timeout is per read: a broken or hostile agent answering gigabytes, or one byte per interval,
would grow the worker (the API process too, in ``serve``) without bound, or hold it until the
engine's ``delivery_timeout``. Every request the deliverers and verifiers send goes through
``bounded_request``: the status, the headers (httpcore caps them at 100 KiB) and the first
``limit`` bytes of the body, as they came on the wire; the rest is never read, and the
connection is closed rather than reused for a half-read body.

It asks for ``Accept-Encoding: identity`` and never decompresses: a few KiB of gzip can
inflate to gigabytes, so a compressed answer (which only an agent ignoring the header sends)
counts as unreadable (``Answer.incomplete``), like one cut at the bound.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

import httpx

KiB = 1024
MiB = 1024 * KiB


class AnswerTimeout(httpx.TimeoutException):
    """No whole answer within the request's total deadline. An httpx timeout, so a deliverer
    classes it as it classes a read timeout: ambiguous (the agent may have acted)."""


class MalformedAnswer(ValueError):
    """A body that is not a whole JSON document: cut at the bound, compressed, not JSON, or
    nested too deep for the parser (``json.loads`` raises RecursionError there)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """What was read of one answer: ``body`` holds at most ``limit`` bytes; ``truncated`` says
    the agent sent more (the rest was not read)."""

    status: int
    headers: httpx.Headers
    body: bytes
    truncated: bool
    limit: int

    @property
    def encoding(self) -> str:
        """The answer's Content-Encoding (``identity`` when none)."""
        return self.headers.get("content-encoding", "").strip().lower() or "identity"

    @property
    def incomplete(self) -> str:
        """Why ``body`` is not the whole body as sent, or "" when it is."""
        if self.truncated:
            return f"longer than {self.limit} bytes"
        if self.encoding != "identity":
            return f"{self.encoding}-encoded (not decompressed)"
        return ""

    def text(self) -> str:
        """The body read, as text (UTF-8, undecodable bytes replaced)."""
        if self.encoding != "identity":
            return f"({self.encoding}-encoded answer, not decompressed)"
        return self.body.decode("utf-8", errors="replace")

    def detail(self) -> str:
        """The body read, as an error's detail: ``plain_detail`` of its text."""
        return plain_detail(self.text())

    def json(self) -> Any:
        """The body as JSON, or MalformedAnswer: never a parse of a partial body."""
        if why := self.incomplete:
            raise MalformedAnswer(f"the answer is {why}")
        try:
            return json.loads(self.body)
        except RecursionError:
            raise MalformedAnswer("the answer is JSON nested too deep to parse") from None
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            raise MalformedAnswer(f"the answer is not JSON: {exc}") from None


DETAIL_CHARS = 200
"""The most of an agent's words an error keeps (its ``lastError``, a log line)."""

# Elements whose content is no text a person reads; and those that sit inside a line of text
# (every other tag breaks the text, as a block does on a page).
_UNREAD = frozenset({"script", "style", "template", "noscript", "svg"})
_INLINE = frozenset(
    {"a", "abbr", "b", "code", "em", "i", "small", "span", "strong", "sub", "sup", "u"}
)
# A tag begun and never closed: what a body cut at its bound ends with.
_CUT_TAG = re.compile(r"<[!/?A-Za-z][^>]*\Z")
_PASSES = 3
"""Markup spelled with entities (``&lt;b&gt;``) is markup once read: read again, a bounded
number of times (each pass that changes the text shortens it)."""


class _Words(HTMLParser):
    """The text of a body that may be HTML (or XML): what a page would show of it."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.words: list[str] = []
        self._unread: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _UNREAD:
            self._unread.append(tag)
        elif tag not in _INLINE:
            self.words.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if self._unread and self._unread[-1] == tag:
            self._unread.pop()
        elif tag not in _INLINE:
            self.words.append(" ")

    def handle_data(self, data: str) -> None:
        if not self._unread:
            self.words.append(data)


def _shown(text: str) -> str:
    words = _Words()
    words.feed(_CUT_TAG.sub("", text))
    words.close()
    return "".join(words.words)


def plain_detail(text: str, limit: int = DETAIL_CHARS) -> str:
    """An agent's error body as a short plain-text detail for a person (``lastError``, the
    log, the ``list`` table): markup stripped (tags, a tag cut at the read's bound, comments,
    declarations, the content of scripts and styles; entities read), every control or other
    unprintable character and every run of whitespace one space, cut to ``limit`` characters
    (the last one an ellipsis when cut). A 401 page of HTML becomes its words, on one line;
    JSON and plain text stay as they were, on one line. The one rule for every agent body an
    error or a log quotes."""
    for _ in range(_PASSES):
        shown = _shown(text)
        if shown == text:
            break
        text = shown
    plain = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return plain if len(plain) <= limit else plain[: limit - 1] + "\u2026"


async def bounded_request(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    limit: int,
    deadline: float | None,
    params: Mapping[str, str | int] | None = None,
    headers: Mapping[str, str] | None = None,
    content: bytes | None = None,
    json_body: Any = None,
) -> Answer:
    """Send one request with ``client`` and read at most ``limit`` bytes of the answer's body.

    ``deadline`` bounds the whole exchange in seconds (connect, send, headers, body), past it
    AnswerTimeout; None leaves only the client's per-read timeouts. Transport errors, before
    or during the body, are httpx's own, as ``client.post`` raises them.
    """
    if limit < 0:
        raise ValueError("limit must not be negative")
    request = client.build_request(
        method,
        url,
        params=params,
        headers={"Accept-Encoding": "identity", **(headers or {})},
        content=content,
        json=json_body,
    )
    bound = asyncio.timeout(deadline)
    try:
        async with bound:
            response = await client.send(request, stream=True)
            try:
                return await _read(response, limit)
            finally:
                # Unread bytes left: httpcore closes the connection instead of pooling it.
                await response.aclose()
    except TimeoutError:
        if not bound.expired():
            raise
        raise AnswerTimeout(
            f"no whole answer within the {deadline:g} s timeout of one request", request=request
        ) from None


async def _read(response: httpx.Response, limit: int) -> Answer:
    kept: list[bytes] = []
    size = 0
    truncated = False
    # Raw: as sent, never decompressed. One network read (64 KiB) past the bound at most.
    async for chunk in response.aiter_raw():
        room = limit - size
        if len(chunk) > room:
            kept.append(chunk[:room])
            truncated = True
            break
        kept.append(chunk)
        size += len(chunk)
    return Answer(response.status_code, response.headers, b"".join(kept), truncated, limit)
