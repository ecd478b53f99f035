"""An agent stand-in that works in turns, for the worker-kill scenario with turns.

A webhook receiver on loopback, as a real one would be: it checks each POST's signature, draws
a fate as the flaky agent does (tests/chaos/settings.py CHAOS_FAULTS: cuts before and after
recording, a stall past the client's timeout, 503, 429, 400), and on "ok" answers at once with
202 ``{"turn": id}``. Every prompt it records starts a turn of that session that runs for a
random short time. When the turn is over the agent reports its end through ``end`` (the test
wires ``Outbox.end_turn``), or, for a share of turns, tells no one and waits to be asked: its
verify URL answers ``?turn=`` with ``running`` / ``ended`` from its own truth (the webhook
deliverer's ``turn_state``, the check path), and ``?id=`` with ``delivered`` / ``absent``.

What it measures: ``sent_in_turn``, the POSTs that reached it while a turn of the same session
was running. The outbox keeps one prompt in flight per session, the turn included, so that
must stay 0.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from http.server import ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from prompt_outbox.webhook import WebhookSignatureError
from tests.support.agent import AgentHandler

from .settings import AGENT_STALL, CHAOS_FAULTS, TURN_BY_CHECK_ONLY, TURN_SECONDS

EndTurn = Callable[[str, str, str], Awaitable[bool]]
"""``async (ws, ses, turn_id) -> ended``: report a turn's end to the outbox."""

FATE_STATUS = {"error_503": 503, "busy_429": 429, "reject_400": 400}


class TurnAgent:
    """Start it inside the test's event loop (the turns run there); ``url`` / ``verify_url``
    for the webhook deliverer. ``turn_seconds``: each turn's length is drawn from this range;
    ``by_check_only``: the share of turns whose end is told to no one."""

    def __init__(
        self,
        seed: int,
        *,
        secret: bytes,
        end: EndTurn | None = None,
        turn_seconds: tuple[float, float] = TURN_SECONDS,
        by_check_only: float = TURN_BY_CHECK_ONLY,
        faults: dict[str, float] | None = None,
        stall: float = AGENT_STALL,
    ) -> None:
        self.seen: Counter[str] = Counter()  # entry ID -> times recorded
        self.order: dict[str, list[str]] = {}  # session -> entry IDs in first-sighting order
        self.faults: Counter[str] = Counter()  # injected fates other than "ok"
        self.sent_in_turn = 0  # POSTs that arrived while the session's previous turn ran
        self.turns: Counter[str] = Counter()  # started / reported / report_gone / check_only
        self.asked: Counter[str] = Counter()  # what ?turn= answered: running / ended / unknown
        self._secret, self._end = secret, end
        self._turn_seconds, self._by_check_only = turn_seconds, by_check_only
        self._weights = faults or CHAOS_FAULTS
        self._stall = stall
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._running: dict[str, set[str]] = {}  # session -> turn IDs running now
        self._turn_of: dict[str, str] = {}  # turn ID, and entry ID, -> turn ID
        self._ended: set[str] = set()  # turn IDs over
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        agent = self

        class Handler(AgentHandler):
            def do_POST(self) -> None:
                post = self.signed_post(agent._secret)
                if isinstance(post, WebhookSignatureError):
                    self.send_body(401, str(post).encode())
                    return
                fate, turn = agent.arrive(post.signed.workspace, post.session, post.id)
                if fate in FATE_STATUS:
                    self.send_body(FATE_STATUS[fate], b"not now")
                elif fate.startswith("cut_"):
                    self.connection.shutdown(2)
                else:
                    if fate == "stall_after_recording":
                        time.sleep(agent._stall)
                    self.send_body(202, json.dumps({"turn": turn}).encode())

            def do_GET(self) -> None:
                query = {k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()}
                if "turn" in query:
                    word = agent.turn_state(query["turn"])
                    self.send_body(200 if word != "unknown" else 404, word.encode())
                else:
                    seen = agent.recorded(query.get("id", ""))
                    self.send_body(200, b"delivered" if seen else b"absent")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def arrive(self, ws: str, ses: str, entry_id: str) -> tuple[str, str]:
        """A prompt reached the agent: count it if the session's turn still runs, draw its
        fate, and if the fate records it, start its turn. Returns the fate and the turn ID."""
        with self._lock:
            if self._running.get(ses):
                self.sent_in_turn += 1
            fate = self._rng.choices(list(self._weights), weights=list(self._weights.values()))[0]
            if fate != "ok":
                self.faults[fate] += 1
            if fate in FATE_STATUS or fate == "cut_before_recording":
                return fate, ""
            if not self.seen[entry_id]:
                self.order.setdefault(ses, []).append(entry_id)
            self.seen[entry_id] += 1
            self.turns["started"] += 1
            turn = f"turn-{self.turns['started']}-{entry_id}"
            self._running.setdefault(ses, set()).add(turn)
            # A turn is known by its own ID and, for a send that was verified (the outbox then
            # names the turn by the entry), by its entry's.
            self._turn_of[turn] = self._turn_of[entry_id] = turn
            seconds = self._rng.uniform(*self._turn_seconds)
            report = self._rng.random() >= self._by_check_only
        self._loop.call_soon_threadsafe(self._spawn, ws, ses, turn, seconds, report)
        return fate, turn

    def _spawn(self, ws: str, ses: str, turn: str, seconds: float, report: bool) -> None:
        task = self._loop.create_task(self._run_turn(ws, ses, turn, seconds, report))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_turn(self, ws: str, ses: str, turn: str, seconds: float, report: bool) -> None:
        await asyncio.sleep(seconds)
        with self._lock:  # over for the agent first: only then may the next prompt come
            self._running[ses].discard(turn)
            self._ended.add(turn)
        outcome = "check_only"
        if report and self._end is not None:
            # "gone": the outbox held no such turn yet (its claim had not landed, or its worker
            # died before it): the check path ends it instead.
            outcome = "reported" if await self._end(ws, ses, turn) else "report_gone"
        with self._lock:
            self.turns[outcome] += 1

    def turn_state(self, asked: str) -> str:
        """What ``?turn=`` answers: ``running`` / ``ended`` for a turn (or an entry's turn) it
        started, ``unknown`` for an ID it never gave out."""
        with self._lock:
            turn = self._turn_of.get(asked)
            word = "unknown" if turn is None else "ended" if turn in self._ended else "running"
            self.asked[word] += 1
            return word

    def recorded(self, entry_id: str) -> bool:
        """Whether the agent has this prompt (what ``?id=`` answers)."""
        with self._lock:
            return self.seen[entry_id] > 0

    def running(self) -> int:
        """How many turns run now."""
        with self._lock:
            return sum(len(turns) for turns in self._running.values())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    @property
    def verify_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/verify"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        for task in self._tasks:
            task.cancel()
