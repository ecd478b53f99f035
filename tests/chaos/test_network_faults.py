"""Scenario 5: network faults between the outbox and Valkey. The worker processes and the
accepting client reach Valkey only through a loopback TCP proxy that stalls, drops, resets
and swallows replies mid-command (the command ran; its caller never hears).

Checker: nothing lost and nothing run twice, OnDelivered exactly once per delivered entry
(no process dies here, so no hook may be missing), order kept; and no entry stays in staging
longer than the recovery bound, watched on a direct connection throughout the run.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest
import valkey.asyncio as valkey_async

from prompt_outbox import Outbox
from prompt_outbox.core.keys import session_keys
from prompt_outbox.embedded import EmbeddedValkey
from tests.chaos import report
from tests.chaos.harness import (
    Workers,
    accept_paced,
    chaos_agent,
    closing,
    library_accept,
    library_worker,
    read_worker_logs,
    settle,
    take_agent_history,
    workspace_of,
)
from tests.chaos.history import History
from tests.chaos.proxy import FaultyProxy
from tests.chaos.settings import CHAOS_TUNABLES, WEBHOOK_TIMEOUT, WORKER_SOCKET_TIMEOUT

# The longest an entry may sit in staging: a send (delivery_timeout), bookkeeping retried
# through the faults (bookkeeping_timeout), a command stuck behind a stall until the socket
# times out, then the lease lapsing and the next worker's tick recovering it. Generous.
T = CHAOS_TUNABLES
RECOVERY_BOUND = (
    T.delivery_timeout + WEBHOOK_TIMEOUT + T.bookkeeping_timeout + 2 * WORKER_SOCKET_TIMEOUT
    + T.lease_ttl + 5.0
)  # fmt: skip

RUNS = [
    pytest.param(1_000, 50, 10.0, id="short"),
    pytest.param(10_000, 200, 60.0, id="long", marks=pytest.mark.slow),
]


async def inject_faults(proxy: FaultyProxy, seconds: float, rng: random.Random) -> None:
    """A fault every 0.3-1.5 s, for ``seconds``: stalls of up to 3 s (some past the worker's
    socket timeout), drops, resets, and windows in which replies are swallowed."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(rng.uniform(0.3, 1.5))
        fault = rng.choice(["stall", "drop", "reset", "cut"])
        if fault == "stall":
            proxy.stall(rng.uniform(0.2, 3.0))
        elif fault == "drop":
            proxy.drop()
        elif fault == "reset":
            proxy.reset()
        else:
            proxy.cut_replies(rng.uniform(0.05, 0.5))


class StagingWatch:
    """Samples every session's staging on a direct connection; remembers the longest time one
    entry stayed there (an entry staged at the end counts until the watch stops)."""

    def __init__(self, client: valkey_async.Valkey, sessions: list[str]) -> None:
        self.client, self.sessions = client, sessions
        self.since: dict[bytes, float] = {}
        self.longest = 0.0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            pipe = self.client.pipeline(transaction=False)
            for ses in self.sessions:
                pipe.lrange(session_keys(workspace_of(ses), ses).staging, 0, -1)
            staged = {raw for rows in await pipe.execute() for raw in rows}
            now = time.monotonic()
            for raw in staged:
                self.since.setdefault(raw, now)
            for raw in list(self.since):
                self.longest = max(self.longest, now - self.since[raw])
                if raw not in staged:
                    del self.since[raw]
            await asyncio.sleep(0.1)


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("prompts", "sessions", "seconds"), RUNS)
async def test_network_faults_lose_nothing_and_leave_nothing_staged(
    valkey_server: EmbeddedValkey,
    client: valkey_async.Valkey,
    tmp_path: Path,
    prompts: int,
    sessions: int,
    seconds: float,
) -> None:
    rng = random.Random(prompts + 2)
    history = History()
    names = [f"s{n:03d}" for n in range(sessions)]
    watch = StagingWatch(client, names)
    stop_watch = asyncio.Event()
    watcher = asyncio.create_task(watch.run(stop_watch))
    async with FaultyProxy(valkey_server.port, valkey_server.password) as proxy:
        proxied = valkey_async.Valkey.from_url(
            proxy.url, socket_timeout=WORKER_SOCKET_TIMEOUT, socket_connect_timeout=2
        )
        with closing(chaos_agent(seed=prompts + 2)) as agent:
            workers = Workers(library_worker(proxy.url, agent, tmp_path), 3)
            try:
                await asyncio.gather(
                    accept_paced(
                        library_accept(Outbox(proxied, T)), history, prompts, sessions,
                        seconds * 0.8,
                    ),
                    inject_faults(proxy, seconds, rng),
                )  # fmt: skip
                await settle(Outbox(client, T), client, history, within=120)
            finally:
                workers.stop()
                stop_watch.set()
                await watcher
                await proxied.aclose()
            take_agent_history(agent, history)
    read_worker_logs(tmp_path, history)
    history.faults.update(proxy.faults)
    verdict = report.judge(
        f"network faults ({prompts} prompts, {seconds:.0f} s; longest staged "
        f"{watch.longest:.1f} s, bound {RECOVERY_BOUND:.0f} s)",
        history,
    )
    assert proxy.faults["reply swallowed"] > 0, proxy.faults  # the hard case did happen
    assert verdict.ok, verdict
    assert verdict.accepted == prompts
    assert watch.longest < RECOVERY_BOUND, watch.longest
