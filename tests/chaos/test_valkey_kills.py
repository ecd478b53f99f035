"""Scenario 2: the Valkey server (the bundled binary, appendfsync always) SIGKILLed and
restarted on its data dir every few seconds, under load through the HTTP API.

Checker: no acknowledged accept is lost, and nothing runs twice; clients saw clear errors
(503) while it was down and no request hung past a bound; the workers (never restarted)
resumed by themselves.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import httpx
import pytest
import valkey.asyncio as valkey_async

from prompt_outbox import Outbox
from prompt_outbox.embedded import EmbeddedValkey, free_port
from tests.chaos import report
from tests.chaos.harness import (
    Workers,
    accept_paced,
    chaos_agent,
    closing,
    library_worker,
    read_worker_logs,
    settle,
    take_agent_history,
    workspace_of,
)
from tests.chaos.history import History
from tests.chaos.settings import CHAOS_TUNABLES, CHAOS_TUNABLES_JSON
from tests.support.serve import service, wait_healthy

REQUEST_BOUND = 15.0  # seconds: no client request may take longer, Valkey down or not

RUNS = [
    pytest.param(400, 20, 10.0, id="short"),
    pytest.param(10_000, 200, 60.0, id="long", marks=pytest.mark.slow),
]


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("prompts", "sessions", "seconds"), RUNS)
async def test_valkey_kills_lose_no_acknowledged_accept(
    tmp_path: Path, prompts: int, sessions: int, seconds: float
) -> None:
    rng = random.Random(prompts + 1)
    history = History()
    server = EmbeddedValkey(tmp_path / "valkey")
    server.start()
    statuses: dict[int, int] = {}
    slowest = 0.0
    kills = 0

    async def accept(http: httpx.AsyncClient, ses: str, cmid: str, i: int) -> str | None:
        nonlocal slowest
        body = {"clientMessageID": cmid, "text": f"prompt {i} of {ses}"}
        started = time.monotonic()
        try:
            url = f"/v1/workspaces/{workspace_of(ses)}/sessions/{ses}/prompts"
            r = await http.post(url, json=body)
        except httpx.HTTPError:
            statuses[0] = statuses.get(0, 0) + 1  # no answer at all
            return None
        finally:
            slowest = max(slowest, time.monotonic() - started)
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        if r.status_code in (429, 503):
            return None  # full, or Valkey down: a phone waits and sends the same ID again
        r.raise_for_status()
        return str(r.json()["id"])

    async def kill_valkey() -> None:
        nonlocal kills
        deadline = time.monotonic() + seconds
        while time.monotonic() + 3 < deadline:
            await asyncio.sleep(rng.uniform(1.5, 3.0))
            server.kill()
            kills += 1
            await asyncio.sleep(rng.uniform(0.2, 1.0))  # down for a moment
            # In a thread: start() waits out the AOF replay, and blocking this loop meanwhile
            # would charge that wait to every client request in flight (a harness artefact).
            await asyncio.to_thread(server.start)

    port = free_port()
    env = {**os.environ, "PROMPT_OUTBOX_TUNABLES": CHAOS_TUNABLES_JSON}
    args = ["--no-auth", "--port", str(port), "--valkey-url", server.url]
    try:
        with closing(chaos_agent(seed=5)) as agent, service(args, env):
            wait_healthy(port)
            workers = Workers(library_worker(server.url, agent, tmp_path), 3)
            try:
                async with httpx.AsyncClient(
                    base_url=f"http://127.0.0.1:{port}", timeout=REQUEST_BOUND + 5
                ) as http:
                    await asyncio.gather(
                        accept_paced(
                            lambda s, c, i: accept(http, s, c, i),
                            history, prompts, sessions, seconds * 0.8,
                        ),
                        kill_valkey(),
                    )  # fmt: skip
                client = valkey_async.Valkey.from_url(server.url, socket_timeout=5)
                await settle(Outbox(client, CHAOS_TUNABLES), client, history, within=120)
                await client.aclose()
            finally:
                workers.stop()
            take_agent_history(agent, history)
    finally:
        server.stop()
    read_worker_logs(tmp_path, history)
    history.faults["valkey SIGKILL"] = kills
    verdict = report.judge(
        f"valkey kills ({prompts} prompts, {seconds:.0f} s; 503s {statuses.get(503, 0)}, "
        f"slowest request {slowest:.1f} s)",
        history,
    )
    assert kills >= 2
    assert statuses.get(503, 0) > 0, statuses  # clients were told, clearly
    assert set(statuses) <= {200, 202, 429, 503}, statuses  # never a 500, never silence
    assert slowest < REQUEST_BOUND, slowest
    assert verdict.ok, verdict
    assert verdict.accepted == prompts
