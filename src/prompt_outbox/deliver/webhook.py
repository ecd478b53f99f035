"""Deliver entries to an HTTP endpoint: POST the entry JSON, signed, idempotent by entry ID.

The signature (``core.signature``, scheme v2) covers the timestamp, the workspace, the
session, the entry ID and the body; receivers check it with
``prompt_outbox.webhook.verify_signature``.

Outcome classes (docs/contract.md, Delivery outcomes): 2xx delivered; connection refused or a
connect timeout means no attempt was driven (transient); 429 is transient (the receiver did not
take it); any other 4xx is definitive (it will not take it); 5xx, a read timeout or a
connection cut mid-request are ambiguous: the receiver may have acted, so the entry is
verified, never blindly re-sent.

A receiver that answers as soon as it has the prompt, while its agent works on, hands back a
turn (docs/design.md, "Turns"): **202** with a JSON object holding ``"turn"``,
``{"turn": "<id>"}``. The entry is then delivered and the session held in turn until the
receiver ends it (the API's ``POST .../turns/{turn}/end``, by token or signed with this
secret), the verify URL says it ended, or the ceiling comes. A ``turn`` that is not a valid
turn ID (1-200 printable characters) still makes a turn, named by the entry ID (logged): the
receiver has the prompt, so holding the session is what keeps the next one out of a running
turn. Any other 2xx (200, 204, a 202 without ``"turn"``) is the blocking shape, as before: the
turn is over.

The optional verify URL answers ``GET {verify_url}?id=<entry id>`` with ``delivered``,
``absent`` or anything else (inconclusive), as plain text or JSON ``{"status": ...}``; and
``GET {verify_url}?turn=<turn id>&workspace=<ws>&session=<ses>&id=<turn id>`` with ``running``
or ``ended`` (anything else, or no answer: unknown, asked again later). The ``id`` is for a
verify URL written before turns, which reads only it: asked of a turn named by its entry ID
(the engine's, after an ambiguous send it verified), its ``delivered`` counts as ended, as
that answer meant before. Without a verify URL a turn is RUNNING to whoever asks: only the end
route or the ceiling ends it.

Both requests read at most a few KiB of the answer, within ``timeout`` in total
(``answer.bounded_request``): the send's body is only looked at for an error detail, so a long
one changes nothing; a verify answer past the bound is inconclusive, never a verdict.
"""

from __future__ import annotations

import logging
import time

import httpx

from ..core.callbacks import Turn, TurnEnded, TurnState, Verdict
from ..core.entry import Entry, encode_entry
from ..core.errors import ambiguous, transient
from ..core.signature import (
    ENTRY_ID_HEADER,
    SESSION_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WORKSPACE_HEADER,
    sign,
)
from ..core.tracing import tracing
from .answer import Answer, KiB, MalformedAnswer, bounded_request, plain_detail

log = logging.getLogger("prompt_outbox.webhook")

SEND_ANSWER_BYTES = 4 * KiB  # read only for an error detail (answer.plain_detail)
VERIFY_ANSWER_BYTES = 4 * KiB  # a word, or {"status": ...}
TURN_STATUS = 202  # "accepted, still working": the only answer that can hand back a turn
# A turn's verify answer. "delivered" is the answer of a verify URL that knows only entries
# (it reads the ``id`` sent beside ``turn``), about a turn named by its entry ID: it has the
# prompt and answered, which is all a receiver of the blocking shape can say of its turn.
_TURN_STATES = {
    "running": TurnState.RUNNING,
    "ended": TurnState.ENDED,
    "delivered": TurnState.ENDED,
}


class WebhookDeliverer:
    """A Deliverer (``await d(ws, ses, entry)``); with ``verify_url`` also a Verifier, ``.verify``;
    a ``TurnWatcher`` (``turn_state`` asks the verify URL; nothing is streamed).

    ``timeout`` bounds each request in total (connect, send, the answer), with or without
    a borrowed ``client``; ``client`` is borrowed if given, otherwise one is made and closed
    by ``aclose()``.
    """

    def __init__(
        self,
        url: str,
        *,
        secret: bytes,
        verify_url: str | None = None,
        timeout: float = 30.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if not secret:
            raise ValueError("a webhook needs a non-empty signing secret")
        self.url = url
        self.verify_url = verify_url
        self._secret = secret
        self._timeout = timeout
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(timeout=timeout)

    async def __call__(self, ws: str, ses: str, entry: Entry) -> Turn | None:
        body = encode_entry(entry, with_list_fields=False).encode()  # the public form: no trace
        # Signed per send: a retry or a re-send after verification carries a fresh timestamp.
        timestamp = int(time.time())
        signature = sign(
            self._secret,
            timestamp=timestamp,
            workspace=ws,
            session=ses,
            entry_id=entry.id,
            body=body,
        )
        headers = {
            "Content-Type": "application/json",
            ENTRY_ID_HEADER: entry.id,
            TIMESTAMP_HEADER: str(timestamp),
            SIGNATURE_HEADER: signature,
            WORKSPACE_HEADER: ws,
            SESSION_HEADER: ses,
            **tracing().headers(),  # traceparent: the receiver's spans join the send's trace
        }
        try:
            answer = await bounded_request(
                self._client,
                "POST",
                self.url,
                content=body,
                headers=headers,
                limit=SEND_ANSWER_BYTES,
                deadline=self._timeout,
            )
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise transient(exc) from exc  # nothing reached the receiver
        except httpx.HTTPError as exc:
            raise ambiguous(exc) from exc  # it may have been received and acted on
        status = answer.status
        if status == TURN_STATUS:
            return _turn(answer, entry)
        if 200 <= status < 300:
            return None
        detail = f"webhook answered {status}: {answer.detail()}"
        if status == 429:
            raise transient(detail)
        if 400 <= status < 500:
            raise RuntimeError(detail)
        raise ambiguous(detail)

    async def verify(self, ws: str, ses: str, entry: Entry) -> Verdict:
        """Ask the verify URL whether the receiver has the entry (unreachable: inconclusive)."""
        if self.verify_url is None:
            raise RuntimeError("no verify_url configured")
        answer = await bounded_request(
            self._client,
            "GET",
            self.verify_url,
            params={"id": entry.id},
            limit=VERIFY_ANSWER_BYTES,
            deadline=self._timeout,
        )
        word = _status_word(answer, {"entry": entry.id})
        return {"delivered": Verdict.DELIVERED, "absent": Verdict.ABSENT}.get(
            word, Verdict.INCONCLUSIVE
        )

    def watch_turns(self, ended: TurnEnded | None) -> None:
        """Nothing to stream: a receiver ends its turns through the API's end route (or says
        so when ``turn_state`` asks)."""

    async def turn_state(self, ws: str, ses: str, turn_id: str) -> TurnState:
        """Ask the verify URL whether the turn still runs; RUNNING without one (nobody to ask:
        the end route or the ceiling ends it); UNKNOWN when it cannot answer now."""
        if self.verify_url is None:
            return TurnState.RUNNING
        try:
            answer = await bounded_request(
                self._client,
                "GET",
                self.verify_url,
                # ``id`` too: a verify URL written before turns reads only it (see _TURN_STATES).
                params={"turn": turn_id, "workspace": ws, "session": ses, "id": turn_id},
                limit=VERIFY_ANSWER_BYTES,
                deadline=self._timeout,
            )
        except httpx.HTTPError as exc:  # asked again at the next check
            log.warning("verify URL unreachable for turn %.200s: %s", turn_id, exc)
            return TurnState.UNKNOWN
        return _TURN_STATES.get(_status_word(answer, {"turn": turn_id}), TurnState.UNKNOWN)

    async def aclose(self) -> None:
        if self._own_client:
            await self._client.aclose()


def _status_word(answer: Answer, about: dict[str, str]) -> str:
    """A verify answer's word, lower case: a 200's plain text, or its JSON ``{"status": ...}``;
    "" for anything else (a status, an answer cut at its bound, JSON that is not an object)."""
    if answer.status != 200:
        return ""
    if why := answer.incomplete:
        # Never a verdict on part of an answer: "delivered" + padding is not "delivered".
        log.warning("verify URL answer is %s: no verdict", why, extra=about)
        return ""
    word = answer.text().strip()
    if answer.headers.get("content-type", "").startswith("application/json"):
        try:
            data = answer.json()
        except MalformedAnswer:
            return ""
        word = str(data.get("status", "")) if isinstance(data, dict) else ""
    return word.lower()


def _turn(answer: Answer, entry: Entry) -> Turn | None:
    """A 202's turn: ``{"turn": "<id>"}``, read whole; a ``turn`` that is no valid ID is named
    by the entry ID; no ``turn`` at all (no body, another shape) is no turn, as before."""
    try:
        data = answer.json() if answer.body else None
    except MalformedAnswer as exc:
        # Cut at the bound, compressed, or not JSON: no turn can be read from it.
        log.warning("webhook answered 202, no turn read: %s", exc, extra={"entry": entry.id})
        return None
    if not isinstance(data, dict) or "turn" not in data:
        return None
    turn_id = data["turn"]
    try:
        return Turn(turn_id)
    except ValueError as exc:  # its words quote the agent's
        log.warning(
            "webhook answered 202 with %s: the turn is named by the entry ID",
            plain_detail(str(exc)),
            extra={"entry": entry.id},
        )
        return Turn(entry.id)
