"""A stand-in agent for the README's quickstart: a webhook receiver on 127.0.0.1:9000.

It checks each delivery's signature with the secret in $PROMPT_OUTBOX_WEBHOOK_SECRET, prints the
prompt, and answers 200 (delivered). Replace the print with your agent; docs/deliverers.md says
what each answer means to the outbox.
"""

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

from prompt_outbox.webhook import WebhookSignatureError, verify_signature

SECRET = os.environ.get("PROMPT_OUTBOX_WEBHOOK_SECRET") or sys.exit(
    "set PROMPT_OUTBOX_WEBHOOK_SECRET to the secret serve signs with (serve reads it there too)"
)
PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 9000


class Agent(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            signed = verify_signature(SECRET, self.headers, body)
        except WebhookSignatureError as err:  # not from our outbox: refuse (a definitive failure)
            self.send_error(401, err.code)
            return
        entry = json.loads(body)
        print(f"agent {signed.workspace}/{signed.session} got: {entry['text']!r}", flush=True)
        self.send_response(200)  # delivered; a 5xx or a cut connection is verified, not re-sent
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # quiet: one line per prompt
        pass


try:
    server = HTTPServer(("127.0.0.1", PORT), Agent)
except OSError as err:  # most often: an agent already runs there
    sys.exit(f"cannot listen on 127.0.0.1:{PORT} ({err.strerror}): is the agent already running?")
server.serve_forever()
