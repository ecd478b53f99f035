"""The one webhook agent the tests drive: a real HTTP server on loopback that checks each POST's
signature as a user's agent would, answers as the test says, records what it ran, and answers
the verify URL from that record.

``Agent()`` answers from its ``actions`` script (one per POST, then 200); a test with a rule of
its own subclasses it and overrides ``answer`` (the page test's agent, the fencing agent)::

    with Agent() as agent:
        agent.actions = [503, "cut"]  # the first POST 503, the second cut, the rest 200
        ...  # point a deliverer at agent.url / agent.verify_url
        assert agent.ids() == [entry.id]

The POST route: a bad signature is answered 401 and kept in ``refused``; otherwise
``answer(post)`` decides (it runs in the server's thread and may wait), and the agent records
the post when the answer says so (the agent ran the prompt), holds it until ``released`` when
it says so, then stalls, cuts the connection, or answers the status and body.

The verify route (``?id=``): ``delivered`` once the entry is recorded, else ``absent``; counted
in ``verifies``. With ``?turn=``: what ``turns`` says of the turn (``ended`` when it says
nothing), the query kept in ``asked``. A word is answered as JSON ``{"status": word}``, or as
plain text with ``plain_verify``; bytes are answered as they are, as plain text.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal, Self
from urllib.parse import parse_qs, urlparse

from prompt_outbox.webhook import SignedDelivery, WebhookSignatureError, verify_signature

SECRET = b"test-secret"
HOLD_LIMIT = 60.0  # no POST is held longer: a failed test must not hang its server thread


@dataclass(frozen=True)
class Post:
    """One POST whose signature checked out: its headers and raw body as received, and what
    the signature vouches for (its entry ID and session are read from there)."""

    headers: dict[str, str]
    body: bytes
    signed: SignedDelivery

    @property
    def id(self) -> str:
        return self.signed.entry_id

    @property
    def session(self) -> str:
        return self.signed.session

    @property
    def entry(self) -> dict[str, Any]:
        """The body as JSON: the entry's public form."""
        value: dict[str, Any] = json.loads(self.body)
        return value

    @property
    def text(self) -> str:
        return str(self.entry["text"])


@dataclass(frozen=True)
class Answer:
    """What the agent does with one POST, in this order: record it (the agent ran the prompt:
    its verify says delivered from then on), hold it until ``released``, sleep ``stall``
    seconds, then cut the connection or answer ``status`` with ``body``."""

    status: int = 200
    body: bytes = b"{}"
    record: bool = True
    hold: bool = False
    stall: float = 0.0
    cut: bool = False


# A scripted action, the short form of an Answer: "ok" (200), a status, (status, body) (a 202
# handing back a turn), "cut" (the connection closed once recorded), "hang" (a 2 s stall, past
# the short client timeouts tests use, then 200).
Action = Answer | int | tuple[int, bytes] | Literal["ok", "cut", "hang"]


def as_answer(action: Action) -> Answer:
    """The Answer an action stands for."""
    if isinstance(action, Answer):
        return action
    if isinstance(action, tuple):
        return Answer(action[0], action[1])
    if action == "ok":
        return Answer()
    if action == "cut":
        return Answer(cut=True)
    if action == "hang":
        return Answer(stall=2.0)
    return Answer(action)


class Agent:
    """A webhook agent on a loopback port while its ``with`` block runs (see the module)."""

    def __init__(self, secret: bytes = SECRET, *, plain_verify: bool = False) -> None:
        self.secret = secret
        self.plain_verify = plain_verify
        self.actions: list[Action] = []  # the default ``answer``'s script, one per POST
        self.received: list[Post] = []  # recorded (run by the agent), in order
        self.refused: list[WebhookSignatureError] = []  # answered 401, not recorded
        self.answered: list[tuple[str, int, bool]] = []  # (entry, status, written to the socket)
        self.verifies: Counter[str] = Counter()  # entry ID -> verify calls
        self.turns: dict[str, str | bytes] = {}  # what the verify URL says of each turn
        self.asked: list[dict[str, list[str]]] = []  # the queries of its turn questions
        self.released = threading.Event()  # set: held POSTs are answered (and no more held)
        self.lock = threading.Lock()  # held while recording: hold it to read several records
        self._server = _server(self)
        self.port = self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    @property
    def verify_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/verify"

    def ids(self) -> list[str]:
        """The recorded entry IDs, in the order the agent ran them."""
        with self.lock:
            return [post.id for post in self.received]

    def answer(self, post: Post) -> Answer:
        """What to do with a signed POST: by default the next scripted action, else 200."""
        with self.lock:
            action = self.actions.pop(0) if self.actions else "ok"
        return as_answer(action)

    def __enter__(self) -> Self:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.released.set()  # a held POST must not keep its thread past the test
        self._server.shutdown()
        self._server.server_close()


class AgentHandler(BaseHTTPRequestHandler):
    """What every loopback agent's request handler does alike: no access log, a POST's body
    read and its signature checked, an answer written whole (this one, and chaos's
    ``TurnAgent``, which draws its own fates)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def signed_post(self, secret: bytes | str) -> Post | WebhookSignatureError:
        """The POST's body with what its signature vouches for, or why it does not check out
        (the caller answers 401)."""
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            signed = verify_signature(secret, self.headers, body)
        except WebhookSignatureError as exc:
            return exc
        return Post(dict(self.headers), body, signed)

    def send_body(self, status: int, body: bytes, kind: str | None = None) -> bool:
        """Answer; False when the client had gone (the answer never reached it)."""
        try:
            self.send_response(status)
            if kind:
                self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
        except OSError:
            return False
        return True


def _server(agent: Agent) -> ThreadingHTTPServer:
    class Handler(AgentHandler):
        def do_POST(self) -> None:
            post = self.signed_post(agent.secret)
            if isinstance(post, WebhookSignatureError):
                with agent.lock:
                    agent.refused.append(post)
                self.send_body(401, b"")
                return
            answer = agent.answer(post)
            if answer.record:
                with agent.lock:
                    agent.received.append(post)
            if answer.hold:
                agent.released.wait(HOLD_LIMIT)
            if answer.stall:
                time.sleep(answer.stall)
            if answer.cut:
                self.connection.shutdown(2)
                return
            written = self.send_body(answer.status, answer.body, "application/json")
            with agent.lock:
                agent.answered.append((post.id, answer.status, written))

        def do_GET(self) -> None:
            query = parse_qs(urlparse(self.path).query)
            with agent.lock:
                if "turn" in query:
                    agent.asked.append(query)
                    said = agent.turns.get(query["turn"][0], "ended")  # none running
                else:
                    entry_id = query.get("id", [""])[0]
                    agent.verifies[entry_id] += 1
                    ran = any(post.id == entry_id for post in agent.received)
                    said = "delivered" if ran else "absent"
            if isinstance(said, str) and not agent.plain_verify:
                self.send_body(200, json.dumps({"status": said}).encode(), "application/json")
            else:
                self.send_body(200, said.encode() if isinstance(said, str) else said, "text/plain")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True  # a held or stalled POST never blocks the server's close
    return server
