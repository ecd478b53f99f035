"""Valkey Sentinel (issue 24 point 4): serve and a worker on a ``valkey+sentinel://`` URL
follow a failover. A primary and two replicas watched by three sentinels (tests/sentinel.py);
four clients accept into a session each, under ``--accept-durability replica``; the primary
is SIGKILLed; the sentinels promote a replica. Each accept answers 2xx or 503 within its
bound (never hangs), 503s only from the kill until the switch is over, and every
acknowledged prompt is delivered, once, in its session's order: the worker found it on the
promoted replica (the dead primary cannot serve it)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from prompt_outbox.embedded import free_port
from prompt_outbox.storage.sentinel import (
    SentinelURL,
    SentinelURLError,
    parse_sentinel_url,
)
from tests.sentinel import SentinelGroup
from tests.test_serve import BIN, wait_healthy
from tests.test_webhook import SECRET, receiver

ACCEPT_BOUND = 15.0  # seconds: durability_timeout 2 s plus a connect; a hang fails the test


@contextmanager
def process(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [BIN, *args],
            env={**os.environ, "PROMPT_OUTBOX_WEBHOOK_SECRET": SECRET.decode()},
            start_new_session=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@dataclass
class Client:
    """One session's sender: prompts in order, each sent again (same clientMessageID) after
    a 503 until acknowledged (a 429, the session's cap while the worker catches up, is waited
    out and not recorded)."""

    url: str
    acked: list[str] = field(default_factory=list)
    answers: list[tuple[float, int, str]] = field(default_factory=list)  # (time, status, code)
    stop: threading.Event = field(default_factory=threading.Event)
    failure: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.Client(timeout=ACCEPT_BOUND) as http:
                n = 0
                while not self.stop.is_set():
                    r = http.post(self.url, json={"clientMessageID": f"m{n}", "text": f"p{n}"})
                    code = r.json().get("error", "") if r.status_code >= 400 else ""
                    if r.status_code == 429:  # the session's cap: the worker is behind
                        time.sleep(0.1)
                        continue
                    self.answers.append((time.monotonic(), r.status_code, code))
                    if r.status_code in (200, 202):
                        self.acked.append(r.json()["id"])
                        n += 1
                    time.sleep(0.03)  # a steady load (a flood only meets the session's cap)
        except BaseException as exc:  # a timeout (a hang) or anything else: the test fails
            self.failure = exc

    def acked_since(self, moment: float) -> int:
        return sum(1 for t, status, _ in self.answers if t > moment and status in (200, 202))


def wait_for(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_serve_and_worker_follow_a_sentinel_failover(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}/v1/workspaces/acme/sessions"
    durable = ["--accept-durability", "replica", "--durability-timeout", "2"]
    with SentinelGroup(tmp_path / "valkey") as group, receiver() as agent:
        url = ["--valkey-url", group.url]
        serve = ["serve", *url, *durable, "--no-auth", "--port", str(port)]
        worker = ["worker", *url, *durable, "--webhook-url", agent.url]
        with (
            process(serve, tmp_path / "serve.log"),
            process(worker, tmp_path / "worker.log"),
        ):
            wait_healthy(port)
            clients = [Client(f"{base}/s{n}/prompts") for n in range(4)]
            threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
            for thread in threads:
                thread.start()
            wait_for(lambda: all(len(c.acked) >= 5 for c in clients), 30, "acks before")
            killed_at = time.monotonic()
            old = group.kill_primary()
            group.wait_failover(old)
            switched = time.monotonic()
            wait_for(lambda: all(c.acked_since(switched) >= 5 for c in clients), 60, "acks after")
            for c in clients:
                c.stop.set()
            for thread in threads:
                thread.join(ACCEPT_BOUND + 5)
            for c in clients:
                assert c.failure is None, f"an accept failed or hung: {c.failure!r}"
            acked = [i for c in clients for i in c.acked]
            stopped = time.monotonic()
            wait_for(lambda: set(acked) <= set(agent.ids()), 60, "every acked delivered")

    refusals = [
        (t, status, code) for c in clients for t, status, code in c.answers if status >= 300
    ]
    assert refusals, "the kill refused no accept: the test saw no switch"
    for t, status, code in refusals:
        assert status == 503 and code in ("storage_unavailable", "not_durable"), (status, code)
        assert t > killed_at, "a 503 before the primary was killed"
    # After the switch settled (the last refusal), every client was acknowledged again.
    settled = max(t for t, _, _ in refusals)
    print(
        f"refused {len(refusals)} accepts from {min(t for t, _, _ in refusals) - killed_at:.2f} s"
        f" to {settled - killed_at:.2f} s after the kill; failover seen at "
        f"{switched - killed_at:.2f} s; {len(acked)} acknowledged, all delivered once, "
        f"the last {time.monotonic() - stopped:.2f} s after the load stopped"
    )
    assert all(c.acked_since(settled) >= 1 for c in clients)
    # Each acknowledged prompt delivered once, in its session's order.
    delivered = agent.ids()
    assert len(delivered) == len(set(delivered)), "a prompt was delivered twice"
    for c in clients:
        assert [i for i in delivered if i in set(c.acked)] == c.acked


def test_a_sentinel_url_says_which_sentinels_and_which_service() -> None:
    assert parse_sentinel_url(
        "valkeys+sentinel://app:s%40cret@10.0.0.1,10.0.0.2:26380,[::1]:7/orders"
        "?db=2&sentinel_password=sp"
    ) == SentinelURL(
        [("10.0.0.1", 26379), ("10.0.0.2", 26380), ("::1", 7)],
        "orders",
        tls=True,
        username="app",
        password="s@cret",
        db=2,
        sentinel_password="sp",
    )
    for bad, why in [
        ("valkey+sentinel://h:1", "service"),
        ("valkey+sentinel:///svc", "at least one sentinel"),
        ("valkey+sentinel://h:x/svc", "not host:port"),
        ("valkey+sentinel://h:1/svc?password=p", "unknown option"),
    ]:
        with pytest.raises(SentinelURLError, match=why):
            parse_sentinel_url(bad)


def test_a_bad_sentinel_url_is_one_clear_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [BIN, "stats", "--valkey-url", "valkey+sentinel://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "a sentinel URL ends with the service's name" in done.stderr
    assert "Traceback" not in done.stderr
