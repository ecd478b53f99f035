"""A fake OpenAI-compatible model server on loopback, for driving a real opencode offline.

It streams a short answer to every chat completion. A user message holding ``[sleep N]``
makes the answer wait N seconds first (a long turn a client can be cut in the middle of).
It records the user text of every completion it served, so a test can count turns.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_SLEEP = re.compile(r"\[sleep (\d+(?:\.\d+)?)\]")


def _last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages", [])):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        return " ".join(p.get("text", "") for p in content or [] if isinstance(p, dict))
    return ""


class FakeModel:
    """Start with ``FakeModel()``; ``base_url`` is the OpenAI base URL; ``close()`` stops it."""

    def __init__(self) -> None:
        self.turns: list[str] = []
        self._lock = threading.Lock()
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                text = _last_user_text(body)
                with model._lock:
                    model.turns.append(text)
                if m := _SLEEP.search(text):
                    time.sleep(float(m.group(1)))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                for chunk in model._chunks(body.get("model", "fake-model")):
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    @staticmethod
    def _chunks(model: str) -> list[dict[str, Any]]:
        def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
            return {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        done = chunk({}, "stop")
        done["usage"] = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
        return [chunk({"role": "assistant", "content": "ok"}, None), done]

    def user_turns(self, needle: str) -> int:
        """How many completions were served for a user message containing ``needle``."""
        with self._lock:
            return sum(needle in t for t in self.turns)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
