"""A local agent that fails at random, for ``prompt-outbox demo`` and fault tests (loopback).

It takes the webhook deliverer's POSTs and, per request, by a seeded draw: records the prompt
and answers 200; cuts the connection BEFORE recording; records and THEN cuts; records and
stalls past the client's timeout; answers 503 without recording; answers 429; or, if asked
for, refuses with 400 (a definitive failure). Its verify
endpoint tells the truth (``delivered`` once recorded, else ``absent``), so the outbox can
settle every ambiguous send without a blind re-send. Given the webhook's ``secret``, it first
checks each POST's signature as a receiver should (``verify_signature``) and answers 401 to
one that fails, before any draw.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from ..webhook import WebhookSignatureError, verify_signature

FAULTS: dict[str, float] = {
    "ok": 0.60,
    "cut_before_recording": 0.08,
    "cut_after_recording": 0.08,
    "stall_after_recording": 0.06,
    "error_503": 0.08,
    "busy_429": 0.10,
}
"""Each request's fate and its weight. ``reject_400`` (a definitive refusal, not recorded) is
also understood; it is left out here so that the demo delivers every prompt."""


class FlakyAgent:
    """Start with ``FlakyAgent(seed)``; ``url`` / ``verify_url`` for the webhook deliverer."""

    def __init__(
        self,
        seed: int = 0,
        stall: float = 2.0,
        faults: dict[str, float] | None = None,
        secret: bytes | None = None,
    ):
        self.stall = stall
        self.refused: Counter[str] = Counter()  # WebhookSignatureError code -> POSTs refused
        self.faults: Counter[str] = Counter()
        self.seen: Counter[str] = Counter()  # entry ID -> times recorded
        self.order: dict[str, list[str]] = {}  # session -> entry IDs in first-sighting order
        self._weights = faults or FAULTS
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if secret is not None:
                    try:
                        verify_signature(secret, self.headers, body)
                    except WebhookSignatureError as exc:
                        agent.refuse(exc.code)
                        self._answer(401, str(exc).encode())
                        return
                fate = agent.draw()
                if fate == "cut_before_recording":
                    self.connection.shutdown(2)
                    return
                if fate in ("error_503", "busy_429", "reject_400"):
                    status = {"error_503": 503, "busy_429": 429, "reject_400": 400}[fate]
                    self._answer(status, b"not now")
                    return
                entry = json.loads(body)
                agent.record(self.headers.get("X-Prompt-Outbox-Session", ""), entry["id"])
                if fate == "cut_after_recording":
                    self.connection.shutdown(2)
                    return
                if fate == "stall_after_recording":
                    time.sleep(agent.stall)
                self._answer(200, b"ok")

            def do_GET(self) -> None:
                query = parse_qs(urlparse(self.path).query)
                entry_id = query.get("id", [""])[0]
                self._answer(200, b"delivered" if agent.recorded(entry_id) else b"absent")

            def _answer(self, status: int, body: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up (its timeout): that is the point of a stall

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def draw(self) -> str:
        """This request's fate (seeded: the same seed gives the same sequence)."""
        with self._lock:
            fate = self._rng.choices(list(self._weights), weights=list(self._weights.values()))[0]
            if fate != "ok":
                self.faults[fate] += 1
            return fate

    def refuse(self, code: str) -> None:
        """A POST whose signature did not verify (not drawn for, not recorded)."""
        with self._lock:
            self.refused[code] += 1

    def record(self, session: str, entry_id: str) -> None:
        """The agent ran this prompt."""
        with self._lock:
            if not self.seen[entry_id]:
                self.order.setdefault(session, []).append(entry_id)
            self.seen[entry_id] += 1

    def recorded(self, entry_id: str) -> bool:
        """Whether the agent ran this prompt (what its verify endpoint answers)."""
        with self._lock:
            return self.seen[entry_id] > 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    @property
    def verify_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/verify"

    def delivered(self) -> int:
        """How many distinct prompts it has recorded."""
        with self._lock:
            return len(self.seen)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
