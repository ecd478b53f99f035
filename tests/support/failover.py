"""Serve and a worker through Sentinel failovers (tests/sentinel.py: the bundled binary): the
short form in tests/test_sentinel.py, the long form under ``make chaos``."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from prompt_outbox.embedded import free_port
from tests.sentinel import SentinelGroup
from tests.support.agent import SECRET, Agent
from tests.support.processes import process_group
from tests.support.serve import BIN, wait_healthy
from tests.support.waiting import within

ACCEPT_BOUND = 15.0  # seconds: durability_timeout 2 s plus a connect; a hang fails the test


@contextmanager
def process(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "PROMPT_OUTBOX_WEBHOOK_SECRET": SECRET.decode()}
    with (
        log.open("ab") as out,
        process_group([BIN, *args], env, stdout=out, stderr=subprocess.STDOUT) as proc,
    ):
        yield proc


@dataclass
class Client:
    """One session's sender: prompts in order, each sent again (same clientMessageID) after
    a 503 until acknowledged (a 429, the session's cap while the worker catches up, is waited
    out and not recorded)."""

    url: str
    acked: list[str] = field(default_factory=list)
    answers: list[tuple[float, int, str]] = field(default_factory=list)  # (time, status, code)
    slowest: float = 0.0  # seconds, the longest accept
    stop: threading.Event = field(default_factory=threading.Event)
    failure: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.Client(timeout=ACCEPT_BOUND) as http:
                n = 0
                while not self.stop.is_set():
                    sent = time.monotonic()
                    r = http.post(self.url, json={"clientMessageID": f"m{n}", "text": f"p{n}"})
                    self.slowest = max(self.slowest, time.monotonic() - sent)
                    if r.status_code == 429:  # the session's cap: the worker is behind
                        time.sleep(0.1)
                        continue
                    code = r.json().get("error", "") if r.status_code >= 400 else ""
                    self.answers.append((time.monotonic(), r.status_code, code))
                    if r.status_code in (200, 202):
                        self.acked.append(r.json()["id"])
                        n += 1
                    time.sleep(0.03)  # a steady load (a flood only meets the session's cap)
        except BaseException as exc:  # a timeout (a hang) or anything else: the test fails
            self.failure = exc

    def acked_since(self, moment: float) -> int:
        return sum(1 for t, status, _ in self.answers if t > moment and status in (200, 202))


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    assert within(check, timeout), what


@dataclass
class FailoverRun:
    """What the clients and the agent saw over a run of failovers."""

    clients: list[Client]
    delivered: list[str]  # what the agent received, in order (Idempotency-Key: the entry ID)
    kills: list[float]  # when each primary was killed
    ends: list[float] = field(default_factory=list)  # then: the switch seen by the sentinels

    @property
    def acked(self) -> list[str]:
        return [i for c in self.clients for i in c.acked]

    @property
    def refusals(self) -> list[tuple[float, int, str]]:
        return [a for c in self.clients for a in c.answers if a[1] >= 300]

    def windows(self) -> list[tuple[float, float]]:
        """Per failover: seconds from its kill to the first and the last refusal before the
        next kill ((0, 0): none)."""
        out = []
        for n, kill in enumerate(self.kills):
            until = self.kills[n + 1] if n + 1 < len(self.kills) else float("inf")
            seen = [t - kill for t, _, _ in self.refusals if kill < t < until]
            out.append((min(seen), max(seen)) if seen else (0.0, 0.0))
        return out

    def order_violations(self) -> int:
        seen = set(self.delivered)
        first: dict[str, int] = {}
        for n, i in enumerate(self.delivered):
            first.setdefault(i, n)
        return sum(
            1
            for c in self.clients
            if [first[i] for i in c.acked if i in seen]
            != sorted(first[i] for i in c.acked if i in seen)
        )

    def line(self, scenario: str) -> str:
        lost = len(set(self.acked) - set(self.delivered))
        twice = len(self.delivered) - len(set(self.delivered))
        codes = Counter(f"{status} {code}" for _, status, code in self.refusals)
        windows = ", ".join(f"{a:.1f}-{b:.1f} s" for a, b in self.windows())
        slowest = max(c.slowest for c in self.clients)
        return (
            f"{scenario} | failovers {len(self.kills)} | acknowledged {len(self.acked)} | "
            f"lost {lost} | delivered twice {twice} | order violations "
            f"{self.order_violations()} | refused {dict(sorted(codes.items()))} | refusals "
            f"after each kill {windows} | slowest accept {slowest:.1f} s"
        )

    def check(self) -> None:
        """Each accept answered in time, 2xx or 503; 503s only in a switch; every 2xx delivered
        once, in its session's order."""
        for c in self.clients:
            assert c.failure is None, f"an accept failed or hung: {c.failure!r}"
        refusals = self.refusals
        assert refusals, "the kills refused no accept: the run saw no switch"
        for t, status, code in refusals:
            assert status == 503 and code in ("storage_unavailable", "not_durable"), (status, code)
            assert t > self.kills[0], "a 503 before the primary was killed"
        for n, kill in enumerate(self.kills):  # after each switch settled, every client acked
            until = self.kills[n + 1] if n + 1 < len(self.kills) else float("inf")
            settled = max([t for t, _, _ in refusals if kill < t < until], default=kill)
            assert all(
                any(settled < t < until and s < 300 for t, s, _ in c.answers) for c in self.clients
            )
        assert set(self.acked) <= set(self.delivered), "an acknowledged prompt was lost"
        assert len(self.delivered) == len(set(self.delivered)), "a prompt was delivered twice"
        assert self.order_violations() == 0


def run_failovers(tmp_path: Path, sessions: int, failovers: int, acks: int) -> FailoverRun:
    """serve and a worker on the sentinel URL at ``--accept-durability replica``; ``sessions``
    clients accept; ``failovers`` times, once every client got ``acks`` acknowledgements
    since the last switch, the primary is SIGKILLed, the sentinels fail over, and the killed
    node comes back as a replica. Then the load stops and every acknowledged prompt must
    reach the agent."""
    port = free_port()
    base = f"http://127.0.0.1:{port}/v1/workspaces/acme/sessions"
    durable = ["--accept-durability", "replica", "--durability-timeout", "2"]
    with SentinelGroup(tmp_path / "valkey") as group, Agent() as agent:
        url = ["--valkey-url", group.url]
        serve = ["serve", *url, *durable, "--no-auth", "--port", str(port)]
        # The verify URL, as every chaos run's workers have it: a send the agent's server
        # dropped (a burst of connections at the start once did) is asked about, not parked.
        hook = ["--webhook-url", agent.url, "--webhook-verify-url", agent.verify_url]
        worker = ["worker", *url, *durable, *hook]
        with (
            process(serve, tmp_path / "serve.log"),
            process(worker, tmp_path / "worker.log"),
        ):
            wait_healthy(port)
            clients = [Client(f"{base}/s{n}/prompts") for n in range(sessions)]
            run = FailoverRun(clients, [], [])
            threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
            for thread in threads:
                thread.start()
            since = 0.0
            for n in range(failovers):
                wait_for(lambda t=since: all(c.acked_since(t) >= acks for c in clients), 60, "acks")
                run.kills.append(time.monotonic())
                old = group.kill_primary()
                group.wait_failover(old)
                since = time.monotonic()
                run.ends.append(since)
                if n + 1 < failovers:
                    group.restart(old)
            wait_for(lambda: all(c.acked_since(since) >= acks for c in clients), 60, "acks after")
            for c in clients:
                c.stop.set()
            for thread in threads:
                thread.join(ACCEPT_BOUND + 5)
            acked = set(run.acked)
            wait_for(lambda: acked <= set(agent.ids()), 60, "every acked delivered")
            time.sleep(0.5)  # a second delivery, if any, has its moment to show
            run.delivered = agent.ids()
    return run
