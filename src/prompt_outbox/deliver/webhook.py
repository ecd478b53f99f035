"""Deliver entries to an HTTP endpoint: POST the entry JSON, signed, idempotent by entry ID.

The signature (``core.signature``, scheme v2) covers the timestamp, the workspace, the
session, the entry ID and the body; receivers check it with
``prompt_outbox.webhook.verify_signature``.

Outcome classes (the seed's): 2xx delivered; connection refused or a connect timeout means no
attempt was driven (transient); 429 is transient (the receiver did not take it); any other
4xx is definitive (it will not take it); 5xx, a read timeout or a connection cut mid-request
are ambiguous: the receiver may have acted, so the entry is verified, never blindly re-sent.

The optional verify URL answers ``GET {verify_url}?id=<entry id>`` with ``delivered``,
``absent`` or anything else (inconclusive), as plain text or JSON ``{"status": ...}``.

Both requests read at most a few KiB of the answer, within ``timeout`` in total
(``answer.bounded_request``): the send's body is only looked at for an error detail, so a long
one changes nothing; a verify answer past the bound is inconclusive, never a verdict.
"""

from __future__ import annotations

import logging
import time

import httpx

from ..core.callbacks import Verdict
from ..core.entry import Entry
from ..core.errors import ambiguous, transient
from ..core.signature import (
    ENTRY_ID_HEADER,
    SESSION_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WORKSPACE_HEADER,
    sign,
)
from .answer import KiB, MalformedAnswer, bounded_request

log = logging.getLogger("prompt_outbox.webhook")

SEND_ANSWER_BYTES = 4 * KiB  # read only for an error detail (its first 200 characters)
VERIFY_ANSWER_BYTES = 4 * KiB  # a word, or {"status": ...}


class WebhookDeliverer:
    """A Deliverer (``await d(ws, ses, entry)``); with ``verify_url`` also a Verifier, ``.verify``.

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

    async def __call__(self, ws: str, ses: str, entry: Entry) -> None:
        body = entry.to_json().encode()
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
        if 200 <= status < 300:
            return
        detail = f"webhook answered {status}: {answer.text()[:200]}"
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
        if answer.status != 200:
            return Verdict.INCONCLUSIVE
        if why := answer.incomplete:
            # Never a verdict on part of an answer: "delivered" + padding is not "delivered".
            log.warning("verify URL answer is %s: inconclusive", why, extra={"entry": entry.id})
            return Verdict.INCONCLUSIVE
        word = answer.text().strip()
        if answer.headers.get("content-type", "").startswith("application/json"):
            try:
                data = answer.json()
            except MalformedAnswer:
                return Verdict.INCONCLUSIVE
            word = str(data.get("status", "")) if isinstance(data, dict) else ""
        return {"delivered": Verdict.DELIVERED, "absent": Verdict.ABSENT}.get(
            word.lower(), Verdict.INCONCLUSIVE
        )

    async def aclose(self) -> None:
        if self._own_client:
            await self._client.aclose()
