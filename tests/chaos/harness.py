"""Shared pieces of the chaos scenarios: worker processes to kill, the accepting clients, and
the wait for the outbox to settle before the history is checked."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import valkey.asyncio as valkey_async

from prompt_outbox import Duplicate, Outbox, OutboxFull, Status
from prompt_outbox.cli.flaky_agent import FlakyAgent
from prompt_outbox.core.keys import workspace_keys
from prompt_outbox.storage.store import TRANSIENT_ERRORS
from tests.chaos.history import History
from tests.chaos.settings import AGENT_STALL, CHAOS_FAULTS
from tests.chaos.turn_agent import TurnAgent

ROOT = Path(__file__).resolve().parents[2]
WORKSPACES = 8


def workspace_of(ses: str) -> str:
    """Sessions ``s000``... spread over eight workspaces (so over a cluster's shards)."""
    return f"chaos-{int(ses.removeprefix('s')) % WORKSPACES}"


BLOCKING = {Status.PENDING, Status.DELIVERING, Status.VERIFYING}


class Workers:
    """N worker processes (``argv(i)`` builds each command line) that can be SIGKILLed."""

    def __init__(self, argv: Callable[[], list[str]], n: int, env: dict[str, str] | None = None):
        self._argv, self._env = argv, env
        self.procs = [self._start() for _ in range(n)]
        self.kills = 0
        self.killed: set[int] = set()  # the pids SIGKILLed

    def _start(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self._argv(), cwd=ROOT, env=self._env, stderr=subprocess.DEVNULL)

    def kill_one(self, rng: random.Random) -> None:
        i = rng.randrange(len(self.procs))
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait()
        self.kills += 1
        self.killed.add(self.procs[i].pid)
        self.procs[i] = self._start()

    def join_one(self) -> None:
        """One more replica joins."""
        self.procs.append(self._start())

    def leave_one(self) -> int:
        """The oldest replica leaves as an orchestrator stops it (SIGTERM); its exit code."""
        proc = self.procs.pop(0)
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=60)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def library_worker(
    url: str, agent: FlakyAgent | TurnAgent, log_dir: Path
) -> Callable[[], list[str]]:
    """worker_proc.py's command line; in turns mode when the agent works in turns."""
    turns = ["turns"] if isinstance(agent, TurnAgent) else []

    def argv() -> list[str]:
        return [
            sys.executable, "-m", "tests.chaos.worker_proc",
            url, agent.url, agent.verify_url, str(log_dir), *turns,
        ]  # fmt: skip

    return argv


def chaos_agent(seed: int) -> FlakyAgent:
    return FlakyAgent(seed, stall=AGENT_STALL, faults=CHAOS_FAULTS)


async def keep_killing(workers: Workers, seconds: float, rng: random.Random) -> None:
    """SIGKILL a random worker (and start it again) every 0.5-3 s, for ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        pause = rng.uniform(0.5, 3.0)
        if time.monotonic() + pause > deadline:
            return
        await asyncio.sleep(pause)
        workers.kill_one(rng)


async def accept_paced(
    accept: Callable[[str, str, int], Awaitable[str | None]],
    history: History,
    prompts: int,
    sessions: int,
    seconds: float,
) -> None:
    """Each session accepts its share in order, spread over ``seconds``. ``accept(ses, cmid,
    i)`` returns the acknowledged ID, or None for "full, try again"."""
    per = prompts // sessions

    async def one(ses: str) -> None:
        ids = history.accepted.setdefault(ses, [])
        for i in range(per):
            entry_id = await accept(ses, f"{ses}-{i}", i)
            while entry_id is None:  # full: the agent is behind; a client waits and re-sends
                await asyncio.sleep(0.05)
                entry_id = await accept(ses, f"{ses}-{i}", i)
            ids.append(entry_id)
            await asyncio.sleep(seconds / per)

    await asyncio.gather(*(one(f"s{n:03d}") for n in range(sessions)))


def library_accept(outbox: Outbox) -> Callable[[str, str, int], Awaitable[str | None]]:
    """Accept through the library as a careful client does: on no answer (Valkey or the path
    to it down) send the same clientMessageID again; a Duplicate then names the first ID."""

    async def accept(ses: str, cmid: str, i: int) -> str | None:
        try:
            ws = workspace_of(ses)
            return (await outbox.accept(ws, ses, "user", cmid, f"prompt {i} of {ses}")).id
        except Duplicate as dup:  # an earlier try landed; its answer was lost
            return dup.accepted_id
        except (OutboxFull, *TRANSIENT_ERRORS):
            return None

    return accept


def http_accept(http: httpx.AsyncClient) -> Callable[[str, str, int], Awaitable[str | None]]:
    """Accept through the HTTP API; a duplicate answer (a re-send) names the first ID."""

    async def accept(ses: str, cmid: str, i: int) -> str | None:
        body = {"clientMessageID": cmid, "text": f"prompt {i} of {ses}"}
        url = f"/v1/workspaces/{workspace_of(ses)}/sessions/{ses}/prompts"
        r = await http.post(url, json=body)
        if r.status_code in (429, 503):
            return None
        r.raise_for_status()
        return str(r.json()["id"])

    return accept


async def settle(
    outbox: Outbox, client: valkey_async.Valkey, history: History, within: float
) -> None:
    """Wait until no session holds a pending / delivering / verifying entry and no OnDelivered
    is owed (a killed worker's, made again after hook_retry_after), then record what every
    session still lists."""
    deadline = time.monotonic() + within
    owed = [workspace_keys(workspace_of(ses)).notices for ses in history.accepted]
    while True:
        busy = sum([int(await client.hlen(key)) for key in set(owed)])  # type: ignore[misc]
        for ses in history.accepted:
            history.final[ses] = await outbox.list(workspace_of(ses), ses)
            busy += sum(e.status in BLOCKING for e in history.final[ses])
        if not busy or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.25)


def read_worker_logs(log_dir: Path, history: History, killed: set[int] | None = None) -> None:
    """Every OnDelivered and deliverer call the worker processes wrote (worker_proc.py),
    noting which calls came from a process that was then SIGKILLed (pids in ``killed``)."""
    for path in log_dir.glob("hooks.*"):
        ids = path.read_text().split()
        history.hooks.update(ids)
        if int(path.suffix.removeprefix(".")) in (killed or set()):
            history.hooks_by_killed.update(ids)
    history.sends = sum(len(p.read_text().split()) for p in log_dir.glob("calls.*"))


def take_agent_history(agent: FlakyAgent | TurnAgent, history: History) -> None:
    history.agent_seen = Counter(agent.seen)
    history.agent_order = {s: list(ids) for s, ids in agent.order.items()}
    history.faults.update(agent.faults)
    if isinstance(agent, TurnAgent):
        history.sent_in_turn = agent.sent_in_turn


A = TypeVar("A", FlakyAgent, TurnAgent)


@contextlib.contextmanager
def closing(agent: A) -> Iterator[A]:
    try:
        yield agent
    finally:
        agent.close()
