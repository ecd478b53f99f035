"""Scenario 1: workers SIGKILLed and restarted at random while prompts keep coming.

Checker: nothing lost (every acknowledged accept ends delivered, or in error / parked and
listed); the agent ran each prompt once (the verifier is truthful); OnDelivered at most once
per entry; each session's prompts reached the agent in accept order.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import httpx
import pytest
import valkey.asyncio as valkey_async

from prompt_outbox import Outbox
from prompt_outbox.embedded import EmbeddedValkey, free_port
from prompt_outbox.storage.client import Client
from tests.chaos import report
from tests.chaos.harness import (
    Workers,
    accept_paced,
    chaos_agent,
    closing,
    http_accept,
    keep_killing,
    library_accept,
    library_worker,
    read_worker_logs,
    settle,
    take_agent_history,
)
from tests.chaos.history import History
from tests.chaos.settings import CHAOS_TUNABLES, CHAOS_TUNABLES_JSON
from tests.test_serve import BIN, wait_healthy
from tests.test_serve import service as service_process

RUNS = [
    pytest.param(1_000, 50, 10.0, id="short"),
    pytest.param(10_000, 200, 60.0, id="long", marks=pytest.mark.slow),
]


@pytest.mark.timeout(600)
@pytest.mark.cluster_too
@pytest.mark.parametrize(("prompts", "sessions", "seconds"), RUNS)
async def test_worker_kills_lose_nothing_and_run_nothing_twice(
    server_url: str,
    server_kind: str,
    client: Client,
    tmp_path: Path,
    prompts: int,
    sessions: int,
    seconds: float,
) -> None:
    rng = random.Random(prompts)
    history = History()
    outbox = Outbox(client, CHAOS_TUNABLES)
    with closing(chaos_agent(seed=prompts)) as agent:
        workers = Workers(library_worker(server_url, agent, tmp_path), 3)
        try:
            await asyncio.gather(
                accept_paced(library_accept(outbox), history, prompts, sessions, seconds * 0.8),
                keep_killing(workers, seconds, rng),
            )
            await settle(outbox, client, history, within=120)
        finally:
            workers.stop()
        take_agent_history(agent, history)
    read_worker_logs(tmp_path, history, workers.killed)
    history.faults["kill"] = workers.kills
    where = ", 3-master cluster" if server_kind == "cluster" else ""
    verdict = report.judge(f"worker kills ({prompts} prompts, {seconds:.0f} s{where})", history)
    assert workers.kills >= seconds / 3.5
    assert verdict.ok, verdict
    assert verdict.accepted == prompts


@pytest.mark.timeout(600)
async def test_worker_kills_through_the_http_api_and_the_cli_workers(
    valkey_server: EmbeddedValkey, client: valkey_async.Valkey, tmp_path: Path
) -> None:
    """The short run through the product: ``serve`` takes the prompts over HTTP, three
    ``prompt-outbox worker`` processes deliver and are SIGKILLed at random."""
    prompts, sessions, seconds = 300, 20, 10.0
    rng = random.Random(3)
    history = History(hooks_recorded=False)  # the CLI workers have no OnDelivered to report
    port = free_port()
    env = {
        **os.environ,
        "PROMPT_OUTBOX_TUNABLES": CHAOS_TUNABLES_JSON,
        "PROMPT_OUTBOX_WEBHOOK_SECRET": "chaos",
    }
    url = valkey_server.url
    serve_args = ["--no-auth", "--port", str(port), "--valkey-url", url]
    with closing(chaos_agent(seed=11)) as agent, service_process(serve_args, env):
        wait_healthy(port)
        hook = ["--webhook-url", agent.url, "--webhook-verify-url", agent.verify_url]
        workers = Workers(lambda: [BIN, "worker", "--valkey-url", url, *hook], 3, env)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
                await asyncio.gather(
                    accept_paced(http_accept(http), history, prompts, sessions, seconds * 0.8),
                    keep_killing(workers, seconds, rng),
                )
            await settle(Outbox(client, CHAOS_TUNABLES), client, history, within=120)
        finally:
            workers.stop()
        take_agent_history(agent, history)
    history.faults["kill"] = workers.kills
    verdict = report.judge(f"worker kills, HTTP + CLI workers ({prompts} prompts)", history)
    assert verdict.ok, verdict
    assert verdict.accepted == prompts


@pytest.mark.timeout(600)
@pytest.mark.cluster_too
async def test_replicas_joining_and_leaving_change_nothing_visible(
    server_url: str, server_kind: str, client: Client, tmp_path: Path
) -> None:
    """``serve`` takes prompts over HTTP while ``prompt-outbox worker`` replicas come and go
    the way an orchestrator moves them: one joins, then one leaves on SIGTERM (finishing its
    delivery in flight, exit 0). Nothing is lost, nothing is run twice, order holds."""
    prompts, sessions, seconds = 300, 20, 9.0
    history = History(hooks_recorded=False)  # the CLI workers have no OnDelivered to report
    port = free_port()
    env = {
        **os.environ,
        "PROMPT_OUTBOX_TUNABLES": CHAOS_TUNABLES_JSON,
        "PROMPT_OUTBOX_WEBHOOK_SECRET": "chaos",
    }
    serve_args = ["--no-auth", "--port", str(port), "--valkey-url", server_url]
    with closing(chaos_agent(seed=13)) as agent, service_process(serve_args, env):
        wait_healthy(port)
        hook = ["--webhook-url", agent.url, "--webhook-verify-url", agent.verify_url]
        workers = Workers(lambda: [BIN, "worker", "--valkey-url", server_url, *hook], 2, env)

        async def come_and_go() -> int:
            await asyncio.sleep(seconds / 3)
            workers.join_one()
            await asyncio.sleep(seconds / 3)
            return await asyncio.to_thread(workers.leave_one)

        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
                _, left_with = await asyncio.gather(
                    accept_paced(http_accept(http), history, prompts, sessions, seconds * 0.8),
                    come_and_go(),
                )
            await settle(Outbox(client, CHAOS_TUNABLES), client, history, within=120)
        finally:
            workers.stop()
        take_agent_history(agent, history)
    where = ", 3-master cluster" if server_kind == "cluster" else ""
    verdict = report.judge(f"replicas join and leave ({prompts} prompts{where})", history)
    assert left_with == 0  # a graceful leave: in-flight deliveries finished first
    assert verdict.ok, verdict
    assert verdict.accepted == prompts
