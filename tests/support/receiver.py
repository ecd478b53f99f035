"""A webhook receiver on loopback: checks each delivery's signature as a user's agent would, answers
as told."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from prompt_outbox.webhook import (
    WebhookSignatureError,
    verify_signature,
)

SECRET = b"test-secret"


@dataclass
class Receiver:
    """What the fake agent does with each POST: 'ok', a status code, 'cut', 'hang', or
    (status, JSON body) (a 202 handing back a turn). ``turns``: what the verify URL says of
    a turn (a word, as JSON ``{"status": word}``; bytes: that plain body); ``asked``: the
    queries of its turn questions."""

    actions: list[str | int | tuple[int, bytes]] = field(default_factory=list)
    received: list[dict[str, object]] = field(default_factory=list)
    refused: list[WebhookSignatureError] = field(default_factory=list)  # answered 401
    turns: dict[str, str | bytes] = field(default_factory=dict)
    asked: list[dict[str, list[str]]] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    @property
    def verify_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/verify"

    def ids(self) -> list[str]:
        return [str(r["headers"]["Idempotency-Key"]) for r in self.received]  # type: ignore[index]


@contextlib.contextmanager
def receiver() -> Iterator[Receiver]:
    rec = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            try:
                signed = verify_signature(SECRET, self.headers, body)
            except WebhookSignatureError as exc:
                rec.refused.append(exc)
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            action = rec.actions.pop(0) if rec.actions else "ok"
            # The receiver records (acts on) the prompt before it answers, like an agent would.
            rec.received.append({"headers": dict(self.headers), "body": body, "signed": signed})
            if isinstance(action, tuple):
                self.send_response(action[0])
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(action[1])))
                self.end_headers()
                self.wfile.write(action[1])
                return
            if action == "cut":
                self.connection.shutdown(2)
                return
            if action == "hang":
                time.sleep(2)
            code = 200 if action in ("ok", "hang") else int(action)
            self.send_response(code)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def do_GET(self) -> None:
            query = parse_qs(urlparse(self.path).query)
            if "turn" in query:
                rec.asked.append(query)
                said = rec.turns.get(query["turn"][0], "ended")  # none running
                plain = isinstance(said, bytes)
                payload = said if plain else json.dumps({"status": said}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain" if plain else "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            entry_id = query["id"][0]
            answer = "delivered" if entry_id in rec.ids() else "absent"
            payload = json.dumps({"status": answer}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    rec.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()
